#!/bin/bash
# UCP one-sided over gmd_rc alone (UCX_TLS=gmd_rc,self), two processes, client on the last RDMA
# device, server on the first (rxe1 -> rxe0 in the soft-RoCE VM).
#  - ucx_info -e with the RMA and AMO features: gmd_rc carries RMA (UCX 1.13: it is the RMA lane,
#    which put_short, put/get_bcopy and the pending queue make it; UCX 1.18 and 1.23 list it as an
#    rma_bw lane only); atomics are UCP's software atomics over gmd_rc's
#    AM lane, as with UCX's own rc_verbs (verbs lacks the full 64-bit op set UCP's AMO lane needs).
#  - ucx_perftest ucp_put_lat and ucp_get at 8 B (short / bcopy), 4 KiB (bcopy) and 64 KiB (zero-copy),
#    and ucp_fadd 8 B.
# Every case must end with a Final line on the client, all within 600 s (a stall fails the check).
# Usage: ucp_rma_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
source "$(dirname "${BASH_SOURCE[0]}")/perftest_server.sh"
perftest_setup || exit 1
perftest_workdir || exit 1
port=15337
fail=0
export LD_PRELOAD=$plugin UCX_TLS=gmd_rc,self

# ucx_info -e connects a worker to itself; without self in the list every lane is a transport's.
# UCX 1.13 marks no lane "rma" but prints put/get thresholds for RMA lanes only (with emulation over
# AM there are none). UCX 1.18 and 1.23 (protocols v2) show gmd_rc as an rma_bw lane and select no
# separate RMA lane.
info=$(UCX_TLS=gmd_rc UCX_NET_DEVICES=$sdev timeout 120 ucx_info -e -u ra 2>&1)
if echo "$info" | grep -Eq 'lane\[[0-9]+\]:.*gmd_rc.* rma(_bw)?(#[0-9]+)?( |$)' ||
   { echo "$info" | grep -Eq 'lane\[[0-9]+\]:.*gmd_rc' &&
     echo "$info" | grep -Eq 'put\[[0-9]+\]: 0\.\.<short>'; }; then
  echo "ucx_info -e -u ra: gmd_rc carries RMA"
  echo "$info" | grep -E 'lane\[|put\[|get\[' | sed 's/^/    /'
else
  echo "FAIL: ucx_info -e -u ra shows no RMA or RMA_BW lane on gmd_rc"
  echo "$info" | tail -n 20
  fail=1
fi

# Every case in one server/client pair (ucx_perftest -b, perftest_server.sh), each with a UCP context,
# worker and endpoint of its own.
# batch: a line per case for ucx_perftest; cases: the same cases, for the checks below.
: >batch
: >cases
for test_size in ucp_put_lat:8 ucp_put_lat:4096 ucp_put_lat:65536 ucp_get:8 ucp_get:4096 \
                 ucp_get:65536 ucp_fadd:8; do
  test=${test_size%:*} size=${test_size#*:}
  echo "${test}_$size -t $test -s $size -n 500 -w 20" >>batch
  echo "${test}_$size $test $size" >>cases
done
perftest_batch "$port" 600 batch UCX_NET_DEVICES=$sdev ucx_perftest "${mpi_off[@]}" -- \
  UCX_NET_DEVICES=$cdev ucx_perftest "${mpi_off[@]}"
checked=0
while read -r name test size; do
  ((++checked))
  batch_case "$name" "$test $size B" || { fail=1; continue; }
  echo "$test $size B: ${final[2]} us typical, ${final[6]} MB/s"
done <cases
batch_done "$checked" || fail=1
[ $fail -eq 0 ] && echo "PASS: UCP ucp_put_lat, ucp_get, ucp_fadd over gmd_rc,self; RMA on gmd_rc"
exit $fail
