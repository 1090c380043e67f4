#!/bin/bash
# Endpoint creation rate and cost per endpoint, gmd_rc beside UCX's rc_verbs on the same RDMA
# devices, in one run (docs/transport.md, "Scale", has the figures): bench/ep_scale.cc
# (build/bench/gmd_ep_scale) makes N endpoints (default 512) from the last device to the first in
# one process, one 8-byte active message over each, and prints the rate, the resident and pinned
# memory and the descriptors they added; each transport REPS times (default 3, alternating) to show
# the noise. Where UCX has no rc_verbs (Debian unstable's UCX 1.23) only gmd_rc runs.
# Usage: bench/ep_bench.sh PATH/TO/libuct_gmd.so PATH/TO/gmd_ep_scale [N] [REPS]
#        (in the VM: gtest/rxe/run-in-vm -- ...)
set -u
plugin=$1
tool=$2
n=${3:-512}
reps=${4:-3}
ulimit -l unlimited 2>/dev/null
ulimit -n 4096 2>/dev/null
devs=($(ls /sys/class/infiniband 2>/dev/null))
((${#devs[@]} > 0)) || { echo "no RDMA devices"; exit 1; }
sdev=${devs[0]}:1 cdev=${devs[-1]}:1
tls=(gmd_rc)
ucx_info -d 2>/dev/null | grep -q 'Transport: rc_verbs' && tls+=(rc_verbs)
echo "# $n endpoints $cdev -> $sdev, one process, $reps runs (${tls[*]} alternate); UCX $(ucx_info -v | head -n 1 | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)"
for r in $(seq "$reps"); do
  for tl in "${tls[@]}"; do
    out=$(LD_PRELOAD=$plugin timeout 600 "$tool" "$tl" "$sdev" "$cdev" "$n" 2>&1)
    rc=$?
    line=$(echo "$out" | grep '^ep_scale ')
    if ((rc != 0)) || [[ -z $line ]]; then
      echo "run $r $tl: FAILED (rc=$rc) $(echo "$out" | tail -n 3 | tr '\n' ' ')"
    else
      echo "run $r $line"
    fi
    echo "$out" | grep '^gmd_ep_scale: note' | sed "s/^/run $r $tl: /"
  done
done
