#!/bin/sh
# gmd's load-time check refuses a UCX built with statistics (its base iface grows a stats node):
# with gtest/md/stats_shim.cc preloaded (it exports what only such a libucs does) ucx_info shows
# one warning naming statistics and no UCX_GMD_ variable; without it, gmd is registered.
# Usage: stats_guard_check.sh PATH/TO/libuct_gmd.so PATH/TO/libgmd_stats_shim.so
set -u
plugin=$1 shim=$2
fail=0
plain=$(LD_PRELOAD=$plugin ucx_info -c -f 2>&1)
echo "$plain" | grep -q '^UCX_GMD_' ||
  { echo "FAIL: gmd not registered without the shim"; echo "$plain" | tail -n 5; fail=1; }
out=$(LD_PRELOAD="$shim $plugin" ucx_info -c -f 2>&1)
warnings=$(echo "$out" | grep -c 'gmd: built for UCX .* built with statistics')
if [ "$warnings" -ne 1 ]; then
  echo "FAIL: expected one warning about statistics, saw $warnings"
  echo "$out" | grep -i 'gmd' | head -n 5
  fail=1
fi
if echo "$out" | grep -q '^UCX_GMD_'; then
  echo "FAIL: gmd registered under a UCX with statistics"
  fail=1
fi
[ $fail -eq 0 ] && echo "PASS: $(echo "$out" | grep -m1 'built with statistics' | sed 's/.*gmd: /gmd: /')"
exit $fail
