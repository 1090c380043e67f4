#!/bin/bash
# UCP with peer error handling over gmd_rc alone (UCX_TLS=gmd_rc,self), survivor on the last RDMA
# device, peers on the first (rxe1 -> rxe0 in the soft-RoCE VM).
#  - ucx_info -e -u te (tag matching with error handling): the endpoint's lanes are gmd_rc, so UCP
#    accepts gmd_rc where it demands UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE.
#  - ucx_perftest tag_bw -e (UCP_ERR_HANDLING_MODE_PEER) at 8 KiB and 1 MiB: a Final line, no error.
#  - ucx_perftest tag_bw -e at 1 MiB with the server killed (SIGKILL) during the run: the client's
#    UCP error handler is called (ucx_perftest logs it) within 60 s; ucx_perftest does not stop by
#    itself afterwards and is ended.
#  - gmd_ucp_fault (gtest/transport/ucp_fault.cc) with tag sends and with gets: the peer killed under
#    traffic, every request completes once (outstanding sends with an error; outstanding gets may end
#    OK, with the right bytes, as the target NIC can serve them before the dead process's context is
#    gone), a request posted after the error ends with one, the error callback runs once, then a new
#    peer is reached from the same worker; and idle: the peer killed with
#    nothing outstanding, still reported (gmd_rc fails every endpoint whose peer closed the
#    connection; UCP's keepalive, an active message on gmd_rc's lanes, runs every second here).
# Every process runs under `timeout` (a hang fails the check).
# Usage: ucp_fault_check.sh PATH/TO/libuct_gmd.so PATH/TO/gmd_ucp_fault
set -u
plugin=$1
prog=$2
source "$(dirname "${BASH_SOURCE[0]}")/perftest_server.sh"
perftest_setup || exit 1
port=14437
fail=0
work=$(mktemp -d) || { echo "FAIL: mktemp"; exit 1; }
pids=()
trap 'kill -9 "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 1
export LD_PRELOAD=$plugin UCX_TLS=gmd_rc,self

info=$(UCX_TLS=gmd_rc UCX_NET_DEVICES=$sdev timeout 120 ucx_info -e -u te 2>&1)
if echo "$info" | grep -Eq 'lane\[[0-9]+\]:.*gmd_rc' &&
   ! echo "$info" | grep -Eq 'lane\[[0-9]+\]:.*(tcp|ud_verbs|rc_verbs)'; then
  echo "ucx_info -e -u te: lanes on gmd_rc with peer error handling"
  echo "$info" | grep -E 'lane\[' | sed 's/^/    /'
else
  echo "FAIL: ucx_info -e -u te shows no gmd_rc lanes with error handling"
  echo "$info" | tail -n 20
  fail=1
fi

# perftest SIZE ITERS KILL_AFTER: a tag_bw -e pair; with KILL_AFTER > 0 the server is killed under
# traffic (at the client's first progress line, KILL_AFTER seconds at most).
perftest() {
  local size=$1 iters=$2 kill_after=$3
  local args=(-t tag_bw -e -s "$size" -n "$iters" -w 2 -p "$port" "${mpi_off[@]}")
  UCX_NET_DEVICES=$sdev timeout 300 ucx_perftest "${args[@]}" >server.log 2>&1 &
  local spid=$!
  pids+=("$spid")
  wait_for_server "$spid" "$port" || echo "note: the tag_bw server is not listening on port $port"
  port=$((port + 1))
  UCX_NET_DEVICES=$cdev timeout 120 ucx_perftest "$sip" "${args[@]}" >client.log 2>&1 &
  local cpid=$!
  local crc src
  if ((kill_after > 0)); then
    # The kill lands under traffic: once the client has printed its first progress line (its
    # measured phase has begun), or after KILL_AFTER seconds at most.
    local t_kill=$((SECONDS + kill_after))
    while ((SECONDS < t_kill)) && kill -0 "$cpid" 2>/dev/null &&
      ! log_has '^ *[0-9]+ +[0-9.]+ ' client.log; do
      nap 0.1
    done
    # The server itself, not the `timeout` in front of it (which would leave it serving).
    pkill -9 -P "$spid" ucx_perftest
    kill -9 "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    local t0=$SECONDS
    # UCP's error handler (ucx_perftest logs its call) must run within 60 s. ucx_perftest itself
    # does not stop on errors and then waits for its dead server, so it is ended here; gmd_ucp_fault
    # below checks that the requests complete.
    while ((SECONDS - t0 < 60)) && ! log_has 'error handler called' client.log &&
      kill -0 "$cpid" 2>/dev/null; do
      nap 0.1
    done
    if grep -q '^Final:' client.log; then
      echo "FAIL: tag_bw -e $size B: the run ended before the kill; raise its iterations"
      fail=1
    elif ! grep -q 'error handler called' client.log; then
      echo "FAIL: tag_bw -e $size B, server killed: UCP's error handler not called within 60 s"
      tail -n 5 client.log
      fail=1
    else
      echo "tag_bw -e $size B, server killed under traffic: the client's error handler ran" \
        "within $((SECONDS - t0)) s: $(grep -m1 'error handler called' client.log | sed 's/.*UCX  //')"
    fi
    pkill -9 -P "$cpid" ucx_perftest
    kill -9 "$cpid" 2>/dev/null
    wait "$cpid" 2>/dev/null
    return
  fi
  wait "$cpid"
  crc=$?
  wait "$spid"
  src=$?
  local line
  line=$(grep '^Final:' client.log)
  if ((crc != 0 || src != 0)) || [[ -z $line ]] || grep -q 'error handler called' client.log server.log; then
    echo "FAIL: tag_bw -e $size B: client rc=$crc server rc=$src"
    tail -n 5 client.log server.log
    fail=1
    return
  fi
  echo "tag_bw -e $size B: $(echo "$line" | awk '{ printf "%s MB/s", $7 }')"
}

perftest 8192 2000 0
perftest 1048576 50 0
perftest 1048576 1000000 20

# gmd_ucp_fault MODE: peer 1 killed under traffic, then peer 2.
for mode in tag get idle; do
  rm -f peer1 peer2
  UCX_NET_DEVICES=$sdev timeout 300 "$prog" serve "$work/peer1" 1048576 >peer1.log 2>&1 &
  p1=$!
  UCX_NET_DEVICES=$sdev timeout 300 "$prog" serve "$work/peer2" 1048576 >peer2.log 2>&1 &
  p2=$!
  pids+=("$p1" "$p2")
  # Idle: a keepalive round a second instead of UCX's default 20 s.
  ka=()
  [[ $mode == idle ]] && ka=(UCX_KEEPALIVE_INTERVAL=1s)
  env "${ka[@]}" UCX_NET_DEVICES=$cdev timeout 240 "$prog" client "$mode" "$work/peer1" "$work/peer2" 1048576 \
    >client.log 2>&1
  crc=$?
  wait "$p1" 2>/dev/null
  p1rc=$?
  kill -9 "$p2" 2>/dev/null
  wait "$p2" 2>/dev/null
  sed "s/^/    /" client.log | grep -Ev ' (DEBUG|TRACE|DIAG) '
  if ((crc != 0)); then
    echo "FAIL: gmd_ucp_fault $mode: rc=$crc$( ((crc == 124)) && echo ' (hang)')"
    tail -n 5 peer1.log peer2.log
    fail=1
  elif ((p1rc != 128 + 9)); then
    echo "FAIL: gmd_ucp_fault $mode: peer 1 was not killed by the survivor (rc=$p1rc)"
    fail=1
  else
    echo "gmd_ucp_fault $mode: PASS"
  fi
done

[ $fail -eq 0 ] && echo "PASS: UCP peer failure over gmd_rc,self (tag_bw -e; tag, get and idle with the peer killed)"
exit $fail
