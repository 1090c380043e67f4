#!/bin/bash
# UCP over gmd_rc alone (UCX_TLS=gmd_rc,self: no tcp, no UD), two processes, client on the last RDMA
# device, server on the first (rxe1 -> rxe0 in the soft-RoCE VM).
#  - ucx_info -e: the endpoint's AM (tag) and RMA_BW lanes are gmd_rc.
#  - the lanes UCP chose between the two processes (ep_cfg at info level) are gmd_rc.
#  - ucx_perftest tag_lat and tag_bw from 8 B (eager short) through 8 KiB (eager bcopy) and 64 KiB
#    (eager zcopy / rendezvous) to 8 MiB (rendezvous), busy polling and with -E sleep (event-driven:
#    the process sleeps on gmd_rc's event fd).
# Every run must finish under `timeout` (a stall fails it) with a Final line on the client.
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

run() {  # run MODE TEST SIZE ITERS: one server/client pair
  local mode=$1 test=$2 size=$3 iters=$4
  local args=(-t "$test" -s "$size" -n "$iters" -w 2 -p "$port" "${mpi_off[@]}")
  [[ $mode == sleep ]] && args+=(-E sleep)
  UCX_NET_DEVICES=$sdev timeout 120 ucx_perftest "${args[@]}" >server.log 2>&1 &
  local spid=$!
  wait_for_server "$spid" "$port" || echo "note: the $test server is not listening on port $port"
  port=$((port + 1))
  local out crc src
  out=$(UCX_NET_DEVICES=$cdev UCX_LOG_LEVEL=info timeout 120 ucx_perftest "$sip" "${args[@]}" 2>&1)
  crc=$?
  wait "$spid"
  src=$?
  local line
  line=$(echo "$out" | grep '^Final:')
  if ((crc != 0 || src != 0)) || [[ -z $line ]]; then
    echo "FAIL: $test $size B ($mode): client rc=$crc server rc=$src$( ((crc == 124 || src == 124)) && echo ' (stalled)')"
    echo "$out" | grep -v ' INFO ' | tail -n 5
    tail -n 5 server.log
    fail=1
    return
  fi
  # Client side ep_cfg lines name the transports of each lane: only gmd_rc (and self) may appear.
  local cfg
  cfg=$(echo "$out" | grep -E 'ep_cfg\[[0-9]+\]' | sed 's/.*ep_cfg/ep_cfg/' | sort -u | tr '\n' ' ')
  # UCX 1.18 and later print no ep_cfg lines at info level: there the lanes are those ucx_info -e showed
  # above, and UCX_TLS=gmd_rc,self admits no other transport between two processes.
  if [[ -z $cfg ]] && ucx_info -v 2>/dev/null | grep -Eiq 'version:? 1\.(1[89]|[2-9][0-9])'; then
    cfg="(not printed by this UCX; ucx_info -e above)"
  fi
  if [[ -z $cfg ]] || echo "$out $cfg" | grep -Eq '\((tcp|ud_verbs|rc_verbs|posix|sysv|cma)/'; then
    echo "FAIL: $test $size B ($mode): lanes not all gmd_rc: ${cfg:-none printed}"
    fail=1
    return
  fi
  echo "$test $size B ($mode): $(echo "$line" | awk '{ printf "%s us typical, %s MB/s", $3, $7 }')"
  [[ $test == tag_lat && $size == 8 && $mode == poll ]] && echo "    lanes: $cfg"
}

for mode in poll sleep; do
  for test in tag_lat tag_bw; do
    for size in 8 8192 65536 1048576 8388608; do
      iters=$((size >= 1048576 ? 10 : 200))
      run "$mode" "$test" "$size" "$iters"
    done
  done
done
[ $fail -eq 0 ] && echo "PASS: UCP tag_lat/tag_bw 8 B..8 MiB over gmd_rc,self, polling and -E sleep"
exit $fail
