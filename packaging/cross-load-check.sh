#!/usr/bin/env bash
# packaging/cross-load-check.sh ROOT PLUGIN...
# packaging/cross-load-check.sh --prefix UCX_PREFIX PLUGIN...
# Every PLUGIN (a libuct_gmd.so built for another UCX release) loaded into the `ucx_info -d` of ROOT
# (a Debian root, as root: chroot) or of the UCX installed under UCX_PREFIX (a pip build's,
# packaging/pip-ucx.sh), preloaded and, for UCX >= 1.22, through UCX_PLUGIN_PATH: ucx_info must exit
# 0, print exactly one warning naming the release the plugin was built for and the running one, and
# otherwise print what it prints without gmd.
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

usage="usage: packaging/cross-load-check.sh ROOT|--prefix UCX_PREFIX PLUGIN..."
if [[ ${1:-} == --prefix ]]; then
  prefix=${2:?$usage}
  shift 2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  libs=$("$(dirname "${BASH_SOURCE[0]}")/pip-ucx.sh" libs "$prefix") || exit 1
  # in_ucx "VAR=value... ucx_info ...": that UCX's tool with its libraries.
  in_ucx() { env PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$libs" bash -c "$1"; }
  ucx=$(in_ucx "ucx_info -v" | sed -n 's/^# Library version: //p')
else
  root=${1:?$usage}
  shift
  tmp=$root/tmp
  in_ucx() { gmd_in_root "$root" "$1"; }
  ucx=$(gmd_root_ucx_version "$root")
fi
minor=$(echo "$ucx" | cut -d. -f2)
fail=0

in_ucx "ucx_info -d" >"$tmp/gmd-plain.out" 2>&1 ||
  { echo "FAIL: ucx_info -d fails in the root without gmd"; exit 1; }

check() {  # check HOW PLUGIN
  local how=$1 plugin=$2 env out warnings
  case $how in
    preload) env="LD_PRELOAD=$plugin" ;;
    plugin-path) env="UCX_PLUGIN_PATH=$(dirname "$plugin")" ;;
  esac
  if ! in_ucx "$env ucx_info -d" >"$tmp/gmd-cross.out" 2>&1; then
    echo "FAIL: $how $plugin: ucx_info -d exited non-zero under UCX $ucx"
    fail=1
    return
  fi
  warnings=$(grep -c 'gmd: built for UCX .* but the running .*component gmd not registered' \
             "$tmp/gmd-cross.out")
  if [[ $warnings != 1 ]]; then
    echo "FAIL: $how $plugin: $warnings gmd warnings under UCX $ucx (want exactly one):"
    head -n 5 "$tmp/gmd-cross.out"
    fail=1
    return
  fi
  if ! grep -v 'gmd: built for UCX' "$tmp/gmd-cross.out" | diff -q - "$tmp/gmd-plain.out" >/dev/null; then
    echo "FAIL: $how $plugin: ucx_info -d prints something else than without gmd:"
    grep -v 'gmd: built for UCX' "$tmp/gmd-cross.out" | diff - "$tmp/gmd-plain.out" | head
    fail=1
    return
  fi
  echo "PASS: $how $plugin under UCX $ucx: $(grep -o 'gmd: built for UCX [^:]*' "$tmp/gmd-cross.out")"
}

for plugin in "$@"; do
  [[ -e $plugin ]] || { echo "FAIL: no $plugin"; fail=1; continue; }
  check preload "$plugin"
  ((minor >= 22)) && check plugin-path "$plugin"
done
rm -f "$tmp/gmd-plain.out" "$tmp/gmd-cross.out"
exit $fail
