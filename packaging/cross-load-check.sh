#!/usr/bin/env bash
# packaging/cross-load-check.sh ROOT PLUGIN... — every PLUGIN (a libuct_gmd.so built for another UCX
# release than ROOT's) loaded into ROOT's `ucx_info -d`, preloaded and, for UCX >= 1.22, through
# UCX_PLUGIN_PATH: ucx_info must exit 0, print exactly one warning naming the release the plugin was
# built for and the running one, and otherwise print what it prints without gmd. As root (chroot).
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

root=${1:?usage: packaging/cross-load-check.sh ROOT PLUGIN...}
shift
ucx=$(gmd_root_ucx_version "$root")
minor=$(echo "$ucx" | cut -d. -f2)
fail=0

gmd_in_root "$root" "ucx_info -d" >"$root/tmp/gmd-plain.out" 2>&1 ||
  { echo "FAIL: ucx_info -d fails in the root without gmd"; exit 1; }

check() {  # check HOW PLUGIN
  local how=$1 plugin=$2 env out warnings
  case $how in
    preload) env="LD_PRELOAD=$plugin" ;;
    plugin-path) env="UCX_PLUGIN_PATH=$(dirname "$plugin")" ;;
  esac
  if ! gmd_in_root "$root" "$env ucx_info -d" >"$root/tmp/gmd-cross.out" 2>&1; then
    echo "FAIL: $how $plugin: ucx_info -d exited non-zero under UCX $ucx"
    fail=1
    return
  fi
  warnings=$(grep -c 'gmd: built for UCX .* but the running .*component gmd not registered' \
             "$root/tmp/gmd-cross.out")
  if [[ $warnings != 1 ]]; then
    echo "FAIL: $how $plugin: $warnings gmd warnings under UCX $ucx (want exactly one):"
    head -n 5 "$root/tmp/gmd-cross.out"
    fail=1
    return
  fi
  if ! grep -v 'gmd: built for UCX' "$root/tmp/gmd-cross.out" | diff -q - "$root/tmp/gmd-plain.out" >/dev/null; then
    echo "FAIL: $how $plugin: ucx_info -d prints something else than without gmd:"
    grep -v 'gmd: built for UCX' "$root/tmp/gmd-cross.out" | diff - "$root/tmp/gmd-plain.out" | head
    fail=1
    return
  fi
  echo "PASS: $how $plugin under UCX $ucx: $(grep -o 'gmd: built for UCX [^:]*' "$root/tmp/gmd-cross.out")"
}

for plugin in "$@"; do
  [[ -e $plugin ]] || { echo "FAIL: no $plugin"; fail=1; continue; }
  check preload "$plugin"
  ((minor >= 22)) && check plugin-path "$plugin"
done
rm -f "$root/tmp/gmd-plain.out" "$root/tmp/gmd-cross.out"
exit $fail
