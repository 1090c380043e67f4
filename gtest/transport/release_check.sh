#!/bin/bash
# gmd under one UCX release, with that release's own tools (ucx_info and ucx_perftest of UCX_PREFIX,
# e.g. a pip build's, packaging/pip-ucx.sh prefix; else those on PATH) and gmd's own test programs
# built against it. What a user of that UCX gets, in short:
#  - ucx_info -d lists component gmd with a memory domain per RDMA device and gmd_rc on each;
#  - ucx_perftest, UCT over gmd_rc, client on the last device, server on the first (rxe1 -> rxe0):
#    put and get zero-copy at 64 KiB and 1 MiB, AM short 8 B and bcopy 4 KiB;
#  - ucx_perftest, UCP over gmd_rc alone (UCX_TLS=gmd_rc,self: a pip build has no verbs transport of
#    its own, so nothing else could carry it): tag eager 8 B and 8 KiB, rendezvous 1 MiB, put and
#    get 1 MiB;
#  - UCT_TEST (gmd_transport_rxe_test): put/get at many sizes and every AM flavour, rxe1 -> rxe0,
#    every byte checked, and the UCT contract cases (max_short, caller errors, destroy cancelling
#    outstanding work, AM alignment, send credits); UCP_TEST (gmd_ucp_unexpected_test): tagged
#    messages over gmd_rc,self, eager and rendezvous, every byte checked; then each further UCP
#    program, its CrossDevice cases: gmd_ucp_contract_test (forced closes complete every request
#    once, AM data on the worker's alignment) and gmd_ucp_remap_test (the remap exchange: buffers
#    unmapped and mapped again at the same addresses between rendezvous sends, every byte new).
# Where the release's ucx_perftest cannot start at all (NVIDIA's 1.17 and 1.18 wheels: it crashes in
# the dynamic loader, before its main, with or without gmd) that part says so and the programs carry
# the check. gmd is loaded the way the release loads plugins: UCX_PLUGIN_PATH from 1.22 on,
# LD_PRELOAD before. Every ucx_perftest case must end with a Final line (one server/client pair per
# layer, 300 s).
# Usage: release_check.sh PATH/TO/libuct_gmd.so [UCX_PREFIX [UCT_TEST UCP_TEST [UCP_PROGRAM...]]]
set -u
plugin=$1
if (($# > 1)); then
  # A wheel keeps the CUDA runtime its older releases' tools link in a libs folder beside it.
  libs=$("$(dirname "${BASH_SOURCE[0]}")/../../packaging/pip-ucx.sh" libs "$2") || exit 1
  export PATH=$2/bin:$PATH LD_LIBRARY_PATH=$libs
fi
source "$(dirname "${BASH_SOURCE[0]}")/perftest_server.sh"
perftest_setup || exit 1
perftest_workdir || exit 1
fail=0
# "# Library version: 1.15.0" from 1.14 on, "# Version 1.13.1" before.
release=$(ucx_info -v 2>/dev/null | sed -n 's/^# \(Library version: \|Version \)//p' | head -n 1)
[[ -n $release ]] || { echo "FAIL: ucx_info -v names no release"; exit 1; }
minor=$(echo "$release" | cut -d. -f2)
if ((minor >= 22)); then
  export UCX_PLUGIN_PATH=$(dirname "$plugin")
  how="UCX_PLUGIN_PATH"
else
  export LD_PRELOAD=$plugin
  how="LD_PRELOAD"
fi
echo "UCX $release from $(dirname "$(command -v ucx_info)"), gmd through $how"

out=$(ucx_info -d 2>&1)
if echo "$out" | grep -q 'gmd: built for'; then
  echo "FAIL: gmd refused this UCX: $(echo "$out" | grep -m1 'gmd: built for')"
  exit 1
fi
for d in "${devs[@]}"; do
  echo "$out" | grep -B1 'Component: gmd$' | grep -q "Memory domain: $d\$" ||
    { echo "FAIL: ucx_info -d lists no gmd memory domain $d"; fail=1; }
  echo "$out" | awk -v dev="$d" '/Memory domain:/ { md = $NF } /Transport:/ { tl = $NF }
                                 /Device:/ && md == dev && tl == "gmd_rc" && index($NF, dev ":") == 1 { f = 1 }
                                 END { exit !f }' ||
    { echo "FAIL: ucx_info -d shows no gmd_rc on $d"; fail=1; }
done
((fail)) || echo "ucx_info -d: gmd memory domains and gmd_rc on ${devs[*]}"

# Whether the release's ucx_perftest starts at all, without gmd.
(env -u LD_PRELOAD -u UCX_PLUGIN_PATH timeout 30 ucx_perftest -h) >/dev/null 2>&1
perftest_rc=$?
if ((perftest_rc >= 124)); then
  echo "NOTE: this release's ucx_perftest cannot start, without gmd too (exit $perftest_rc):" \
    "its UCT and UCP cases are left to gmd's own programs below"
  (($# >= 4)) || { echo "FAIL: and no programs were given"; exit 1; }
fi

# check_batch LAYER: every case of `cases` has its Final line, and both sides exited 0.
check_batch() {
  local checked=0 name label
  while read -r name label; do
    ((++checked))
    batch_case "$name" "$1 $label" || { fail=1; continue; }
    echo "$1 $label: $(echo "$line" | awk '{ printf "%s MB/s, %s us", $7, $5 }')"
  done <cases
  batch_done "$checked" || fail=1
}

if ((perftest_rc < 124)); then
  : >batch
  : >cases
  add() { echo "$1 $2" >>batch; echo "$1 $3" >>cases; }
  add uct_put_64k "-x gmd_rc -t put_bw -D zcopy -s 65536 -n 200 -w 4" "put zcopy 64 KiB"
  add uct_put_1m "-x gmd_rc -t put_bw -D zcopy -s 1048576 -n 20 -w 2" "put zcopy 1 MiB"
  add uct_get_64k "-x gmd_rc -t get -D zcopy -s 65536 -n 200 -w 4" "get zcopy 64 KiB"
  add uct_get_1m "-x gmd_rc -t get -D zcopy -s 1048576 -n 20 -w 2" "get zcopy 1 MiB"
  add uct_am_8 "-x gmd_rc -t am_lat -D short -s 8 -n 1000 -w 10" "am_lat short 8 B"
  add uct_am_4k "-x gmd_rc -t am_bw -D bcopy -s 4096 -n 1000 -w 10" "am_bw bcopy 4 KiB"
  perftest_batch 16337 300 batch ucx_perftest -d "$sdev" "${mpi_off[@]}" -- \
    ucx_perftest -d "$cdev" "${mpi_off[@]}"
  check_batch "UCT $cdev -> $sdev"

  : >batch
  : >cases
  add ucp_tag_8 "-t tag_lat -s 8 -n 1000 -w 10" "tag_lat 8 B (eager short)"
  add ucp_tag_8k "-t tag_bw -s 8192 -n 500 -w 10" "tag_bw 8 KiB (eager)"
  add ucp_tag_1m "-t tag_bw -s 1048576 -n 20 -w 2" "tag_bw 1 MiB (rendezvous)"
  add ucp_put_1m "-t ucp_put_bw -s 1048576 -n 20 -w 2" "put_bw 1 MiB"
  add ucp_get_1m "-t ucp_get -s 1048576 -n 20 -w 2" "get 1 MiB"
  perftest_batch 16338 300 batch UCX_TLS=gmd_rc,self UCX_NET_DEVICES="$sdev" ucx_perftest \
    "${mpi_off[@]}" -- UCX_TLS=gmd_rc,self UCX_NET_DEVICES="$cdev" ucx_perftest "${mpi_off[@]}"
  check_batch "UCP (gmd_rc,self)"

fi

if (($# >= 4)); then
  # gmd's own programs against this UCX. Their fixtures link gmd's MD in: no plugin beside it.
  # run_program LABEL PROGRAM [ARGS]: its result lines shown, its status checked.
  run_program() {
    local label=$1 rc
    shift
    echo "$label:"
    env -u LD_PRELOAD -u UCX_PLUGIN_PATH "$@" >program.log 2>&1
    rc=$?
    grep -E '^\[ +(OK|FAILED|PASSED|SKIPPED) +\]' program.log | sed 's/^/    /'
    if ((rc != 0)) || grep -q '^\[  SKIPPED \]' program.log; then
      echo "FAIL: $label under UCX $release (exit $rc)"
      grep -E 'Failure|Skipped|error' program.log | head -n 5
      fail=1
    fi
  }
  run_program "UCT over gmd_rc, rxe1 -> rxe0, every byte (gmd_transport_rxe_test)" "$3" \
    --gtest_filter='*PutAndGetMoveEveryByteAtManySizes/CrossDevice:*EveryFlavourMovesEveryByteAtEverySize/CrossDevice:*GmdRcContract*/CrossDevice'
  run_program "UCP over gmd_rc,self, every byte (gmd_ucp_unexpected_test)" "$4"
  for program in "${@:5}"; do
    run_program "UCP over gmd_rc,self ($(basename "$program"), rxe1 -> rxe0)" "$program" \
      --gtest_filter='*CrossDevice'
  done
fi

if ((fail)); then
  echo "FAIL: gmd under UCX $release"
else
  echo "PASS: gmd under UCX $release: ucx_info, UCT and UCP over gmd_rc"
fi
exit $fail
