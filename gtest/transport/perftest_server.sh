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

# nap SECONDS: a pause without starting a process (sleep(1) is one, and in the soft-RoCE VM every
# process start costs about 0.1 s of the emulated CPUs that the processes under test need): a read
# with a timeout on a pipe nobody writes to.
nap() {
  if [[ -z ${nap_fd:-} ]]; then
    local f
    f=$(mktemp -u) && mkfifo "$f" && exec {nap_fd}<>"$f" && rm -f "$f" || { nap_fd=; sleep "$1"; return 0; }
  fi
  read -r -t "$1" -u "$nap_fd"
  return 0
}

# log_has ERE FILE: whether a line of FILE matches the extended regular expression ERE, in bash
# itself (for loops that watch a log: no process per look, see nap).
log_has() {
  local l
  [[ -f $2 ]] || return 1
  while IFS= read -r l || [[ -n $l ]]; do
    [[ $l =~ $1 ]] && return 0
  done <"$2"
  return 1
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
    nap 0.1
  done
  return 1
}

# perftest_batch PORT LIMIT BATCH SERVER_ENV -- CLIENT_ENV: one ucx_perftest server/client pair runs
# every test of the file BATCH (ucx_perftest -b: a line per test, its name first, then its options),
# each with a UCP or UCT context and endpoints of its own, in one process per side instead of a pair
# per test (in the soft-RoCE VM a process start and UCX's set-up cost seconds; this is most of these
# checks' time). SERVER_ENV and CLIENT_ENV: VAR=value words for env(1) and then the common arguments
# of that side (e.g. UCX_NET_DEVICES=rxe0:1 ucx_perftest -d rxe0:1); the client's gets the server's
# address. LIMIT: seconds for the whole batch (a stall fails it). Leaves batch.rc (client and server
# status), server.log, client.log, and per test NAME its part of the client's output in
# batch.NAME.log (from its header line on; missing when the batch stopped before it).
perftest_batch() {
  local port=$1 limit=$2 batch=$3
  shift 3
  local server=() client=()
  while (($# > 0)) && [[ $1 != -- ]]; do server+=("$1"); shift; done
  shift
  client=("$@")
  rm -f batch.*.log
  env "${server[@]}" -b "$batch" -p "$port" >server.log 2>&1 &
  local spid=$!
  wait_for_server "$spid" "$port" || echo "note: the batch server is not listening on port $port"
  env "${client[@]}" "$sip" -b "$batch" -p "$port" >client.log 2>&1 &
  local cpid=$! crc src
  # One deadline for both sides: `timeout` in front of each would leave the other waiting for it.
  local t_end=$((SECONDS + limit))
  while kill -0 "$cpid" 2>/dev/null && ((SECONDS < t_end)); do nap 0.2; done
  if kill -0 "$cpid" 2>/dev/null; then
    kill -9 "$cpid" "$spid" 2>/dev/null
    wait "$cpid" 2>/dev/null
    wait "$spid" 2>/dev/null
    crc=124 src=124
  else
    wait "$cpid"
    crc=$?
    while kill -0 "$spid" 2>/dev/null && ((SECONDS < t_end + 10)); do nap 0.2; done
    kill -9 "$spid" 2>/dev/null
    wait "$spid"
    src=$?
  fi
  echo "$crc $src" >batch.rc
  # A test's part begins at its header, "+NAME----...", which ucx_perftest prints before running it
  # (a name of 14 characters is followed by "+").
  awk '/^\+[A-Za-z0-9_.]+[-+]/ { name = $0; sub(/^\+/, "", name); sub(/[-+].*/, "", name);
                               file = "batch." name ".log" }
       file { print > file }' client.log
}

# batch_case NAME LABEL: sets `line` to test NAME's Final line and `final` to its fields (final[N] is
# awk's $(N+1)); without one prints a FAIL line for LABEL (and the end of its output) and fails. Reads
# with bash's own read: the checks look at every test's part, and process starts are dear in the VM.
batch_case() {
  local l
  line=
  final=()
  if [[ -f batch.$1.log ]]; then
    while IFS= read -r l || [[ -n $l ]]; do
      [[ $l == Final:* ]] && { line=$l; break; }
    done <"batch.$1.log"
  fi
  read -r -a final <<<"$line"
  [[ -n $line ]] && return 0
  echo "FAIL: $2: no result: $(batch_stall_note)"
  grep -v ' INFO ' "batch.$1.log" 2>/dev/null | tail -n 5
  return 1
}

# batch_done CHECKED: fails, with a FAIL line, unless CHECKED is the number of tests in the batch
# and both sides exited 0 (the loop over the tests may not end early unseen).
batch_done() {
  local n
  n=$(grep -c . batch)
  (($1 == n)) && [[ $(cat batch.rc) == "0 0" ]] && return 0
  echo "FAIL: ucx_perftest: $1 of the $n tests checked; $(batch_stall_note)"
  tail -n 5 server.log
  return 1
}

# batch_stall_note: why a test of the last batch has no result (for a FAIL line).
batch_stall_note() {
  local rc
  read -r -a rc <batch.rc
  if ((rc[0] == 124)); then
    echo "the batch stalled (client and server killed after its time limit)"
  else
    echo "client rc=${rc[0]} server rc=${rc[1]}"
  fi
}
