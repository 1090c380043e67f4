#!/bin/bash
# gmd_rc vs UCX's rc_verbs on the same RDMA devices, in one run (docs/transport.md, "Small RMA and
# atomics", has the figures): UCT put_lat with put_short, get latency with get_bcopy (one outstanding),
# add_lat and fetch-add latency (one outstanding), 8 bytes, each repeated REPS times (default 3,
# transports alternating) to show the noise. Server on the first device, client on the last (rxe0 <-
# rxe1 in the soft-RoCE VM).
# Usage: bench/rma_bench.sh PATH/TO/libuct_gmd.so [REPS]   (in the VM: gtest/rxe/run-in-vm -- ...)
set -u
plugin=$1
reps=${2:-3}
source "$(dirname "${BASH_SOURCE[0]}")/../gtest/transport/perftest_server.sh"
perftest_setup || exit 1
port=17000
log=$(mktemp -d) || exit 1
trap 'rm -rf "$log"' EXIT
export LD_PRELOAD=$plugin

# one LABEL TL PERFTEST-ARGS...: prints "LABEL: typical and average latency" or FAILED
one() {
  local label=$1 tl=$2
  shift 2
  local args=(-x "$tl" -p "$port" "${mpi_off[@]}" "$@")
  timeout 120 ucx_perftest -d "$sdev" "${args[@]}" >"$log/srv" 2>&1 &
  local sp=$!
  wait_for_server "$sp" "$port" || echo "note: the server is not listening on port $port"
  port=$((port + 1))
  local out rc fin
  out=$(timeout 120 ucx_perftest "$sip" -d "$cdev" "${args[@]}" 2>&1)
  rc=$?
  wait "$sp"
  fin=$(echo "$out" | awk '/^Final:/ { printf "%s us typical, %s us average", $3, $4 }')
  if ((rc != 0)) || [[ -z $fin ]]; then
    echo "$label $tl: FAILED (rc=$rc) $(echo "$out" | grep -m1 -E 'ERROR|Fatal|error|Unsupported')"
  else
    echo "$label $tl: $fin"
  fi
}

echo "# UCT small RMA and atomics, 8 B, $cdev -> $sdev, $reps runs (gmd_rc and rc_verbs alternate)"
for r in $(seq "$reps"); do
  for tl in gmd_rc rc_verbs; do
    one "run $r put_lat short" "$tl" -t put_lat -D short -s 8 -n 5000 -w 200
    one "run $r get_lat bcopy" "$tl" -t get -D bcopy -s 8 -n 5000 -w 200 -O 1
    one "run $r add_lat" "$tl" -t add_lat -s 8 -n 5000 -w 200
    one "run $r fadd_lat" "$tl" -t fadd -s 8 -n 5000 -w 200 -O 1
  done
done 2>&1
