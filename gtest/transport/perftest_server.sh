# Sourced by the ucx_perftest and ucx_info checks (and bench/*.sh). Functions only.
# shellcheck shell=bash

# perftest_setup: the checks' common start. Sets devs (the RDMA devices), sdev and cdev (port 1 of
# the first and of the last device: server and client; rxe0 and rxe1 in the soft-RoCE VM), snd (the
# server device's netdev), sip (its IPv4 address, else 127.0.0.1: both processes run on this
# machine), mpi_off (-P 0 where ucx_perftest was built with MPI, as Debian 13's is: it would wait for
# MPI peers otherwise) and lifts the locked-memory limit. Prints a FAIL line and returns 1 when there
# is no RDMA device.
# shellcheck disable=SC2034  # the variables are for the sourcing script
perftest_setup() {
  ulimit -l unlimited 2>/dev/null
  devs=($(ls /sys/class/infiniband 2>/dev/null))
  ((${#devs[@]} > 0)) || { echo "FAIL: no RDMA devices"; return 1; }
  sdev=${devs[0]}:1
  cdev=${devs[-1]}:1
  snd=$(rdma link show "${devs[0]}/1" 2>/dev/null | sed -n 's/.*netdev \([^ ]*\).*/\1/p')
  sip=$(ip -4 -o addr show dev "${snd:-none}" 2>/dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
  sip=${sip:-127.0.0.1}
  mpi_off=()
  ucx_perftest -h 2>&1 | grep -q -- '-P <0|1>' && mpi_off=(-P 0)
  return 0
}

# perftest_workdir: cd into a private folder (work), removed on exit. ctest runs the checks in the
# build tree, which the VM guest sees read-only.
perftest_workdir() {
  work=$(mktemp -d) || { echo "FAIL: mktemp"; return 1; }
  trap 'rm -rf "$work"' EXIT
  cd "$work" || return 1
}

# wait_for_server PID PORT: returns once the server process PID listens on PORT (a fixed pause is
# too short on a loaded machine), after at most 60 s, or at once with failure when the server has
# already exited. Without ss (iproute2) it pauses 2 s.
wait_for_server() {
  local i
  command -v ss >/dev/null || { sleep 2; return 0; }
  for ((i = 0; i < 600; i++)); do
    kill -0 "$1" 2>/dev/null || return 1
    [[ -n $(ss -Hltn "sport = :$2" 2>/dev/null) ]] && return 0
    sleep 0.1
  done
  return 1
}
