#!/bin/bash
# Pending-request dispatch over many endpoints, gmd_rc beside UCX's rc_verbs on the same RDMA
# devices, in one run (docs/transport.md, "Pending requests on many endpoints", has the figures):
# bench/ep_pending.cc (build/bench/gmd_ep_pending) makes N endpoints (default 16) from the last
# device to the first in one process, keeps each full with a pending request that sends one
# am_short per dispatch, and prints the time for ROUNDS rounds (default 10000) and the least and
# most any endpoint sent; each transport REPS times (default 3, alternating) to show the noise.
# Where UCX has no rc_verbs (Debian unstable's UCX 1.23) only gmd_rc runs.
# Usage: bench/pending_bench.sh PATH/TO/libuct_gmd.so PATH/TO/gmd_ep_pending [N] [REPS] [ROUNDS]
#        (in the VM: gtest/rxe/run-in-vm -- ...; absolute paths)
set -u
plugin=$1
tool=$2
n=${3:-16}
reps=${4:-3}
rounds=${5:-10000}
ulimit -l unlimited 2>/dev/null
devs=($(ls /sys/class/infiniband 2>/dev/null))
((${#devs[@]} > 0)) || { echo "no RDMA devices"; exit 1; }
sdev=${devs[0]}:1 cdev=${devs[-1]}:1
tls=(gmd_rc)
ucx_info -d 2>/dev/null | grep -q 'Transport: rc_verbs' && tls+=(rc_verbs)
echo "# $n endpoints $cdev -> $sdev, $rounds rounds, one process, $reps runs (${tls[*]} alternate); UCX $(ucx_info -v | head -n 1 | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1); $(lscpu | grep -m1 '^Model name' | sed 's/  */ /g')"
status=0
for r in $(seq "$reps"); do
  for tl in "${tls[@]}"; do
    out=$(LD_PRELOAD=$plugin timeout 600 "$tool" "$tl" "$sdev" "$cdev" "$n" "$rounds" 2>&1)
    rc=$?
    line=$(echo "$out" | grep '^ep_pending ')
    if ((rc != 0)) || [[ -z $line ]]; then
      echo "run $r $tl: FAILED (rc=$rc) $(echo "$out" | tail -n 3 | tr '\n' ' ')"
      status=1
    else
      echo "run $r $line"
    fi
  done
done
exit $status
