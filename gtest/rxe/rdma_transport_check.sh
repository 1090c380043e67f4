#!/bin/bash
# Which RDMA transports UCX has on the RDMA devices, without gmd and with it (preloaded): with gmd,
# every device has gmd_rc. Where UCX has no verbs transport of its own (Debian unstable's UCX 1.23 is
# built without one), gmd_rc must be the only transport on the devices, and UCP traffic with UCX's
# default transport selection (no UCX_TLS) must go over it: ucx_perftest tag_bw with rendezvous-sized
# messages, gmd's counters showing the registrations.
# Usage: rdma_transport_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
ulimit -l unlimited 2>/dev/null
devs=($(ls /sys/class/infiniband 2>/dev/null))
((${#devs[@]} > 0)) || { echo "FAIL: no RDMA devices"; exit 1; }
version=$(ucx_info -v | head -n 1 | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)
fail=0

# transports_on DEVICE: the transports ucx_info -d lists for DEVICE:1, one a line
transports_on() {
  awk -v dev="$1:1" '/Transport:/ { tl = $3 } /Device:/ && $3 == dev { print tl }' | sort -u
}
plain=$(ucx_info -d 2>&1)
with=$(LD_PRELOAD=$plugin ucx_info -d 2>&1)
own=0
for d in "${devs[@]}"; do
  before=$(echo "$plain" | transports_on "$d" | tr '\n' ' ')
  after=$(echo "$with" | transports_on "$d" | tr '\n' ' ')
  echo "UCX $version, $d:1: without gmd: ${before:-none}; with gmd: ${after:-none}"
  [[ -n $before ]] && own=1
  [[ " $after " == *" gmd_rc "* ]] || { echo "FAIL: no gmd_rc on $d:1"; fail=1; }
  if [[ -z $before && $after != "gmd_rc " ]]; then
    echo "FAIL: $d:1 has transports besides gmd_rc although UCX has none of its own: $after"
    fail=1
  fi
done

if ((own == 0)); then
  # No UCX_TLS: UCP picks what there is. Rendezvous (1 MiB) needs an RDMA transport's zero-copy.
  server_dev=${devs[0]}:1
  client_dev=${devs[-1]}:1
  nd=$(rdma link show "${devs[0]}/1" 2>/dev/null | sed -n 's/.*netdev \([^ ]*\).*/\1/p')
  server_ip=$(ip -4 -o addr show dev "${nd:-none}" 2>/dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
  work=$(mktemp -d) || { echo "FAIL: mktemp"; exit 1; }
  trap 'rm -rf "$work"' EXIT
  # A ucx_perftest built with MPI (Debian 13's) waits for MPI peers unless told not to (-P 0).
  mpi_off=()
  ucx_perftest -h 2>&1 | grep -q -- '-P <0|1>' && mpi_off=(-P 0)
  args=(-t tag_bw -s 1048576 -n 50 -w 2 -p 13437 "${mpi_off[@]}")
  LD_PRELOAD=$plugin UCX_GMD_PRINT_STATS=y timeout 120 ucx_perftest "${args[@]}" >"$work/server.log" 2>&1 &
  spid=$!
  # Wait for the server to listen rather than for a fixed time.
  source "$(dirname "${BASH_SOURCE[0]}")/../transport/perftest_server.sh"
  wait_for_server "$spid" 13437 || echo "note: the tag_bw server is not listening on port 13437"
  out=$(LD_PRELOAD=$plugin UCX_GMD_PRINT_STATS=y timeout 120 ucx_perftest "${server_ip:-127.0.0.1}" \
        "${args[@]}" 2>&1)
  crc=$?
  wait "$spid"
  src=$?
  if ((crc != 0 || src != 0)) || ! echo "$out" | grep -q '^Final:'; then
    echo "FAIL: UCP tag_bw 1 MiB with UCX's own transport selection: client rc=$crc server rc=$src"
    echo "$out" | tail -n 5
    tail -n 5 "$work/server.log"
    fail=1
  elif ! grep -Eq '^gmd [^ ]+: reg_hits=[0-9]+ reg_misses=[1-9]' "$work/server.log"; then
    echo "FAIL: UCP tag_bw ran, but not over gmd_rc (gmd registered nothing on the receiver)"
    fail=1
  else
    echo "UCP tag_bw 1 MiB, UCX's own selection: over gmd_rc," \
      "$(echo "$out" | grep '^Final:' | awk '{ printf "%s MB/s", $7 }'); $(grep -m1 '^gmd ' "$work/server.log")"
  fi
fi
if ((fail == 0)); then
  if ((own == 0)); then
    echo "PASS: UCX $version has no RDMA transport of its own; gmd_rc is its RDMA transport"
  else
    echo "PASS: UCX $version lists gmd_rc on every RDMA device beside its own transports"
  fi
fi
exit $fail
