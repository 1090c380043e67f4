#!/bin/bash
# UCP over gmd_rc alone (UCX_TLS=gmd_rc,self: no tcp, no UD), two processes, client on the last RDMA
# device, server on the first (rxe1 -> rxe0 in the soft-RoCE VM).
#  - ucx_info -e: the endpoint's AM (tag) and RMA_BW lanes are gmd_rc.
#  - the lanes UCP chose between the two processes (ep_cfg at info level) are gmd_rc.
#  - ucx_perftest tag_lat and tag_bw (one server/client pair for all of them) from 8 B (eager short)
#    through 8 KiB (eager bcopy) and 64 KiB (eager zcopy / rendezvous) to 8 MiB (rendezvous), busy
#    polling and with -E sleep (event-driven: the process sleeps on gmd_rc's event fd).
# Every case must end with a Final line on the client, all within 600 s (a stall fails the check).
# Usage: ucp_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
source "$(dirname "${BASH_SOURCE[0]}")/perftest_server.sh"
perftest_setup || exit 1
perftest_workdir || exit 1
port=14337
fail=0
export LD_PRELOAD=$plugin UCX_TLS=gmd_rc,self

# ucx_info -e connects a worker to itself; without self in the list every lane is a transport's.
info=$(UCX_TLS=gmd_rc UCX_NET_DEVICES=$sdev timeout 120 ucx_info -e -u t 2>&1)
if echo "$info" | grep -Eq 'lane\[[0-9]+\]:.*gmd_rc.*(am|tag)' &&
   echo "$info" | grep -Eq 'lane\[[0-9]+\]:.*gmd_rc.*rma_bw'; then
  echo "ucx_info -e: AM and RMA_BW lanes on gmd_rc"
  echo "$info" | grep -E 'lane\[' | sed 's/^/    /'
else
  echo "FAIL: ucx_info -e shows no gmd_rc AM and RMA_BW lanes"
  echo "$info" | tail -n 20
  fail=1
fi

# Every case in one server/client pair (ucx_perftest -b, perftest_server.sh): each still gets a UCP
# context, worker and endpoint of its own. ucx_perftest goes on after a failed case and exits 0: a
# case passes by its own Final line only.
# batch: a line per case for ucx_perftest; cases: the same cases, for the checks below.
: >batch
: >cases
for mode in poll sleep; do
  for test in tag_lat tag_bw; do
    for size in 8 8192 65536 1048576 8388608; do
      # 8 MiB: 4 rendezvous transfers (+1 warm-up) are as many protocol runs as the check needs; each
      # is about 0.2 s of the VM's time.
      iters=$((size >= 8388608 ? 4 : size >= 1048576 ? 10 : 200))
      warm=$((size >= 8388608 ? 1 : 2))
      sleep_opt=$([[ $mode == sleep ]] && echo ' -E sleep')
      echo "${test}_${size}_$mode -t $test -s $size -n $iters -w $warm$sleep_opt" >>batch
      echo "${test}_${size}_$mode $test $size $mode" >>cases
    done
  done
done
perftest_batch "$port" 600 batch UCX_NET_DEVICES=$sdev ucx_perftest "${mpi_off[@]}" -- \
  UCX_NET_DEVICES=$cdev UCX_LOG_LEVEL=info ucx_perftest "${mpi_off[@]}"
# UCX 1.18 and later print no ep_cfg lines at info level: there the lanes are those ucx_info -e showed
# above, and UCX_TLS=gmd_rc,self admits no other transport between two processes.
ucx_info -v 2>/dev/null | grep -Eiq 'version:? 1\.(1[89]|[2-9][0-9])' && no_ep_cfg=1 || no_ep_cfg=0
checked=0
while read -r name test size mode; do
  ((++checked))
  batch_case "$name" "$test $size B ($mode)" || { fail=1; continue; }
  # Client side ep_cfg lines name the transports of each lane: only gmd_rc (and self) may appear.
  # One pass in bash over the test's part (no process per test: see batch_case).
  cfg= other=0
  unset seen
  declare -A seen=()
  while IFS= read -r l || [[ -n $l ]]; do
    if [[ $l =~ ep_cfg\[[0-9]+\] ]]; then
      e=ep_cfg${l##*ep_cfg}
      [[ -n ${seen[$e]:-} ]] || cfg+="$e "
      seen[$e]=1
    fi
    [[ $l =~ \((tcp|ud_verbs|rc_verbs|posix|sysv|cma)/ ]] && other=1
  done <"batch.$name.log"
  ((no_ep_cfg)) && [[ -z $cfg ]] && cfg="(not printed by this UCX; ucx_info -e above)"
  if [[ -z $cfg ]] || ((other)); then
    echo "FAIL: $test $size B ($mode): lanes not all gmd_rc: ${cfg:-none printed}"
    fail=1
    continue
  fi
  echo "$test $size B ($mode): ${final[2]} us typical, ${final[6]} MB/s"
  [[ $test == tag_lat && $size == 8 && $mode == poll ]] && echo "    lanes: $cfg"
done <cases
batch_done "$checked" || fail=1
[ $fail -eq 0 ] && echo "PASS: UCP tag_lat/tag_bw 8 B..8 MiB over gmd_rc,self, polling and -E sleep"
exit $fail
