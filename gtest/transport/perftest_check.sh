#!/bin/bash
# ucx_perftest over gmd_rc, server and client as two processes. The client runs on the second RDMA
# device when there is one (rxe1 -> rxe0 in the soft-RoCE VM), else on the first.
#  - UCT: put_bw and get with zero-copy at several sizes up to 8 MiB (one server/client pair).
#  - UCP: tag_bw of 1 MiB and 4 MiB messages with UCX's default rendezvous scheme (get_zcopy: the
#    receiving server RDMA-READs from the client). A check, not a benchmark: every message arrives,
#    and the server's READs were retransmitted fewer times than there were messages (soft-RoCE's
#    `completer_retry_err` counter of the server's device): before gmd_rc split large READs, one
#    response of every message was lost and waited for a QP retransmission timeout (1 s). A loaded
#    machine drops some responses too (10-35 per 100 messages with another VM and builds beside
#    it), each costing a timeout, so time alone does not tell the two apart: the deadline is a hang
#    guard only. Where the device has no such counter (real hardware), only the deadline applies.
# Usage: perftest_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
source "$(dirname "${BASH_SOURCE[0]}")/perftest_server.sh"
perftest_setup || exit 1
perftest_workdir || exit 1
port=13337
fail=0
export LD_PRELOAD=$plugin
# The UCT cases in one server/client pair (ucx_perftest -b, perftest_server.sh), each with a UCT
# context and endpoint of its own.
# batch: a line per case for ucx_perftest; cases: the same cases, for the checks below.
: >batch
: >cases
for test in put_bw get; do
  for size in 4096 65536 1048576 8388608; do
    iters=$((size >= 8388608 ? 4 : size >= 1048576 ? 20 : 400))
    warm=$((size >= 8388608 ? 2 : 4))
    echo "${test}_$size -x gmd_rc -t $test -D zcopy -s $size -n $iters -w $warm" >>batch
    echo "${test}_$size $test $size" >>cases
  done
done
perftest_batch "$port" 600 batch ucx_perftest -d "$sdev" "${mpi_off[@]}" -- \
  ucx_perftest -d "$cdev" "${mpi_off[@]}"
port=$((port + 1))
checked=0
while read -r name test size; do
  ((++checked))
  batch_case "$name" "$test size $size ($cdev -> $sdev)" || { fail=1; continue; }
  # Final: iters, overhead 50%ile/avg/overall (us), bandwidth avg/overall (MB/s), rate avg/overall
  echo "$test $size B $cdev -> $sdev: ${final[6]} MB/s, ${final[4]} us/op"
done <cases
batch_done "$checked" || fail=1

unset UCX_RNDV_SCHEME
netdev_of() { rdma link show "$1" 2>/dev/null | sed -n 's/.*netdev \([^ ]*\).*/\1/p'; }
client_nd=$(netdev_of "${devs[-1]}/1")
deadline=360
# READ retransmissions of the server's device so far (empty where it has no such counter).
read_retries() { cat "/sys/class/infiniband/${sdev%%:*}/ports/1/hw_counters/completer_retry_err" 2>/dev/null; }
for size in 1048576 4194304; do
  retries_before=$(read_retries)
  iters=$((size >= 4194304 ? 25 : 100))
  args=(-t tag_bw -s "$size" -n "$iters" -w 2 -p "$port" "${mpi_off[@]}")
  UCX_TLS=gmd_rc,tcp,self UCX_NET_DEVICES=$sdev,${snd:-lo} UCX_GMD_PRINT_STATS=y \
    timeout "$deadline" ucx_perftest "${args[@]}" >server.log 2>&1 &
  spid=$!
  wait_for_server "$spid" "$port" || echo "note: the tag_bw server is not listening on port $port"
  start=$SECONDS
  out=$(UCX_TLS=gmd_rc,tcp,self UCX_NET_DEVICES=$cdev,${client_nd:-lo} \
        timeout "$deadline" ucx_perftest "$sip" "${args[@]}" 2>&1)
  crc=$?
  wait "$spid"
  src=$?
  line=$(echo "$out" | grep '^Final:')
  retries=""
  [[ -n $retries_before ]] && retries=$(($(read_retries) - retries_before))
  if ((crc == 124 || src == 124)); then
    echo "FAIL: UCP tag_bw $size B, default rendezvous: $iters messages not done within ${deadline} s" \
      "(stalled; ${retries:-?} READ retransmissions)"
    echo "$out" | tail -n 5
    tail -n 5 server.log
    fail=1
  elif ((crc != 0 || src != 0)) || [[ -z $line ]]; then
    echo "FAIL: UCP tag_bw $size B ($cdev -> $sdev): client rc=$crc server rc=$src"
    echo "$out" | tail -n 5
    tail -n 5 server.log
    fail=1
  elif ! grep -Eq '^gmd [^ ]+: reg_hits=[1-9]' server.log; then
    echo "FAIL: UCP tag_bw $size B: gmd's counters show no registration hits (gmd_rc did not carry it)"
    fail=1
  elif [[ -n $retries ]] && ((retries >= iters)); then
    echo "FAIL: UCP tag_bw $size B: $retries READ retransmissions for $iters messages (a lost" \
      "response per message: large READs not split?)"
    fail=1
  else
    echo "UCP tag_bw $size B $cdev -> $sdev, default rendezvous: $iters messages in" \
      "$((SECONDS - start)) s, $(echo "$line" | awk '{ printf "%s MB/s", $7 }'), READ" \
      "retransmissions: ${retries:-not counted}"
  fi
  port=$((port + 1))
done
[ $fail -eq 0 ] && echo "PASS: ucx_perftest put_bw/get zcopy and UCP tag_bw over gmd_rc"
exit $fail
