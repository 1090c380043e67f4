#!/bin/bash
# gmd_rc vs UCX's rc_verbs on the same RDMA devices, in one run (docs/transport.md has the figures):
# UCT put/get zero-copy bandwidth and latency, then UCP tag_bw in the rendezvous range; `am`: UCT
# active messages (am_lat short/bcopy, am_bw bcopy/zcopy, gmd_rc vs rc_verbs) and UCP tag_lat over
# gmd_rc,self vs tcp,self, each repeated REPS times (default 3) to show the noise.
# Server on the first device, client on the last (rxe0 <- rxe1 in the soft-RoCE VM).
# Usage: bench/transport_bench.sh PATH/TO/libuct_gmd.so [uct|ucp|am|all] [REPS]
#        (in the VM: gtest/rxe/run-in-vm -- ...)
set -u
plugin=$1
parts=${2:-all}
reps=${3:-3}
ulimit -l unlimited 2>/dev/null
devs=($(ls /sys/class/infiniband 2>/dev/null))
((${#devs[@]} > 0)) || { echo "no RDMA devices"; exit 1; }
sdev=${devs[0]} cdev=${devs[-1]}
netdev() { rdma link show "$1/1" 2>/dev/null | sed -n 's/.*netdev \([^ ]*\).*/\1/p'; }
snd=$(netdev "$sdev") cnd=$(netdev "$cdev")
sip=$(ip -4 -o addr show dev "${snd:-none}" 2>/dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
sip=${sip:-127.0.0.1}
port=16000
. "$(dirname "$0")/../gtest/transport/perftest_server.sh"
log=$(mktemp -d)
export LD_PRELOAD=$plugin

# pair LABEL SERVER_ENV CLIENT_ENV -- PERFTEST ARGS: prints "LABEL: <Final line fields>"
pair() {
  local label=$1 senv=$2 cenv=$3
  shift 4
  env $senv timeout 120 ucx_perftest -p $port "$@" >"$log/srv" 2>&1 &
  local sp=$!
  wait_for_server $sp $port
  local out
  out=$(env $cenv timeout 120 ucx_perftest "$sip" -p $port "$@" 2>&1)
  local rc=$?
  wait $sp
  port=$((port + 1))
  local fin
  fin=$(echo "$out" | awk '/^Final:/ { printf "lat(typ) %s us, lat(overall) %s us, bw %s MB/s, rate %s msg/s", $3, $5, $7, $9 }')
  if ((rc != 0)) || [[ -z $fin ]]; then
    echo "$label: FAILED (rc=$rc) $(echo "$out" | grep -m1 -E 'ERROR|Fatal|error')"
  else
    echo "$label: $fin"
  fi
}

if [[ $parts == am ]]; then
  echo "# UCT active messages, $cdev:1 -> $sdev:1, $reps runs each (gmd_rc and rc_verbs alternate)"
  for r in $(seq "$reps"); do
    for tl in gmd_rc rc_verbs; do
      pair "run $r uct $tl am_lat short 8" "" "" -- -x $tl -d $sdev:1 -t am_lat -D short -s 8 -n 20000 -w 500
      pair "run $r uct $tl am_lat bcopy 8" "" "" -- -x $tl -d $sdev:1 -t am_lat -D bcopy -s 8 -n 20000 -w 500
      pair "run $r uct $tl am_bw bcopy 4096" "" "" -- -x $tl -d $sdev:1 -t am_bw -D bcopy -s 4096 -n 20000 -w 500
      pair "run $r uct $tl am_bw zcopy 4096" "" "" -- -x $tl -d $sdev:1 -t am_bw -D zcopy -s 4096 -n 20000 -w 500
    done
  done 2>&1
  echo "# UCP tag_lat 8 B, $cdev <- $sdev"
  for r in $(seq "$reps"); do
    for tls in gmd_rc,self tcp,self; do
      pair "run $r ucp $tls tag_lat 8" "UCX_TLS=$tls UCX_NET_DEVICES=$sdev:1,${snd:-lo}" \
        "UCX_TLS=$tls UCX_NET_DEVICES=$cdev:1,${cnd:-lo}" -- -t tag_lat -s 8 -n 5000 -w 200
    done
  done 2>&1
  rm -rf "$log"
  exit 0
fi

if [[ $parts != ucp ]]; then
echo "# UCT, $cdev:1 -> $sdev:1"
for tl in gmd_rc rc_verbs; do
  for s in 65536 1048576 8388608; do
    n=$((s >= 1048576 ? 60 : 1000))
    pair "uct $tl put_bw zcopy $s" "" "" -- -x $tl -d $sdev:1 -t put_bw -D zcopy -s $s -n $n -w 5
  done
  for s in 65536 1048576 8388608; do
    n=$((s >= 1048576 ? 60 : 1000))
    pair "uct $tl get zcopy $s" "" "" -- -x $tl -d $sdev:1 -t get -D zcopy -s $s -n $n -w 5 -O 4
  done
  pair "uct $tl put_lat zcopy 8" "" "" -- -x $tl -d $sdev:1 -t put_lat -D zcopy -s 8 -n 2000
  pair "uct $tl get zcopy 8 (latency)" "" "" -- -x $tl -d $sdev:1 -t get -D zcopy -s 8 -n 2000
done 2>&1
fi

[[ $parts == uct ]] && { rm -rf "$log"; exit 0; }
echo "# UCP tag_bw, rendezvous, $cdev <- $sdev"
for tls in gmd_rc,tcp,self rc_verbs,tcp,self rc_verbs,ud_verbs,self; do
  for scheme in put_zcopy get_zcopy; do
    for s in 1048576 4194304; do
      n=$((s >= 4194304 ? 10 : 30))
      pair "ucp $tls tag_bw $s rndv=$scheme" \
        "UCX_TLS=$tls UCX_NET_DEVICES=$sdev:1,${snd:-lo} UCX_RNDV_SCHEME=$scheme UCX_GMD_PRINT_STATS=y" \
        "UCX_TLS=$tls UCX_NET_DEVICES=$cdev:1,${cnd:-lo} UCX_RNDV_SCHEME=$scheme" \
        -- -t tag_bw -s $s -n $n -w 2
      [[ $tls == gmd_rc,tcp,self ]] && grep -h '^gmd .*reg_hits=[1-9]' "$log/srv" | sed 's/^/    server /'
    done
  done
done
rm -rf "$log"
