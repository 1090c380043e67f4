#!/usr/bin/env bash
# packaging/test-pip.sh SPEC build|vm [PLUGIN...] — gmd against one of NVIDIA's pip builds of UCX
# (SPEC: e.g. libucx-cu12==1.15.0.post2; packaging/pip-ucx.sh makes its environment).
#   build: gmd built against it into build-pip-MINOR[-cu13]/ (the plugin, the unit tests that meet
#          UCX's ABI and the rxe programs of the VM check), those unit tests with the release's own tools on PATH
#          (without and with the release's CUDA modules: stages unit and unit-cuda), and each PLUGIN
#          (built for another release) loaded into its ucx_info: exactly one warning, nothing else
#          changed (packaging/cross-load-check.sh);
#   vm:    gtest/transport/release_check.sh in the soft-RoCE VM (the run-in-vm session GMD_VM_SESSION
#          names, else a VM of its own): ucx_info, UCT and UCP over gmd_rc with the release's tools.
# Stages are named pip-MINOR[-cu13]/NAME (packaging/test.sh's summary); exits non-zero when one fails.
set -uo pipefail
source "$(dirname "$0")/common.sh"

spec=${1:?usage: packaging/test-pip.sh SPEC build|vm [PLUGIN...]}
phase=${2:?usage: packaging/test-pip.sh SPEC build|vm [PLUGIN...]}
shift 2
release=$("$GMD_SRC/packaging/pip-ucx.sh" name "$spec")
build=$GMD_SRC/build-$release
# By name: the unit tests that meet UCX (gtest/CMakeLists.txt, target gmd_ucx_unit_tests).
ucx_tests='^(gmd_md_|gmd_gpudirect_|gmd_ucm_events|gmd_transport_unit_test|gmd_copy_uc|gmd_stats_guard|rcache_ucm_test)'
rc=0
stage() { gmd_stage "$release" "$@" || rc=1; }

t=$SECONDS
if ! prefix=$("$GMD_SRC/packaging/pip-ucx.sh" prefix "$spec"); then
  echo "stage $release/venv: FAIL ($((SECONDS - t)) s)" | tee -a "${GMD_STAGE_LOG:-/dev/null}"
  exit 1
fi
eval "$("$GMD_SRC/packaging/pip-ucx.sh" env "$spec")"
ucx=$(ucx_info -v | sed -n 's/^# Library version: //p')

# install_check PREFIX PLUGIN MINOR: gmd loads into that UCX as the README says (from 1.22 copied into
# a copy of the release's module directory, nothing set; before, LD_PRELOAD): ucx_info -c lists
# gmd's variables and no "built for" warning.
install_check() (
  set -u
  local prefix=$1 plugin=$2 minor=$3 libs copy out how
  libs=$("$GMD_SRC/packaging/pip-ucx.sh" libs "$prefix") || exit 1
  if ((minor >= 22)); then
    copy=$(mktemp -d) || exit 1
    trap 'rm -rf "$copy"' EXIT
    cp -r "$prefix/." "$copy" && cp "$plugin" "$copy/lib/ucx/libuct_gmd.so.0" || exit 1
    out=$(PATH=$copy/bin:$PATH LD_LIBRARY_PATH=$copy/lib:$libs ucx_info -c -f 2>&1)
    how="installed into the module directory, nothing set"
  else
    out=$(LD_PRELOAD=$plugin ucx_info -c -f 2>&1)
    how="LD_PRELOAD"
  fi
  if gmd_has "^UCX_GMD_RC_" "$out" && ! gmd_has "gmd: built for" "$out"; then
    echo "PASS: gmd registered ($how)"
  else
    echo "FAIL: gmd not registered ($how)"
    grep -i -m 5 gmd <<<"$out"
    exit 1
  fi
)

case $phase in
  build)
    echo "stage $release/venv: PASS ($((SECONDS - t)) s) — UCX $ucx ($spec)" |
      tee -a "${GMD_STAGE_LOG:-/dev/null}"
    [[ -n ${GMD_STAGE_LOG:-} ]] && echo "ucx $release $ucx" >>"$GMD_STAGE_LOG.ucx"
    gmd_log "$release: building gmd against UCX $ucx ($spec) in $build"
    gmd_stage "$release" build "$GMD_SRC/packaging/pip-ucx.sh" build "$spec" "$build" \
      -DGMD_BUILD_BENCH=OFF -- --target gmd_ucx_unit_tests gmd_ucm_events_ucx_cuda_test \
      gmd_transport_rxe_test gmd_ucp_unexpected_test gmd_ucp_contract_test gmd_ucp_remap_test ||
      exit 1
    # Without the release's own CUDA modules (UCX_MODULES=^cu*: libucm's CUDA hooks, cuda_copy,
    # cuda_ipc), the set-up these tests are written for: gmd raises libucm's memory-type events and
    # gmd_copy is the only copy transport (no verbs either way).
    gmd_log "$release: the unit tests that meet UCX, without UCX's CUDA modules"
    stage unit env UCX_MODULES='^cu*' ctest --test-dir "$build" --output-on-failure -j "$GMD_JOBS" \
      -L unit -R "$ucx_tests"
    # With them (the fake driver can be patched by libucm, and has what libuct_cuda calls, beside a
    # fake NVML): the same tests but two binaries. gmd stands down where libucm_cuda is loaded, so
    # gmd_ucm_events_test and gmd_ucm_events_dispatch_test (gmd's own events) do not apply.
    # gmd_ucm_events_ucx_cuda_test checks that each CUDA allocation and free is raised once, in
    # either order of loading; gmd_copy_ucp_test loads gmd before UCP creates its memory-type cache
    # (docs/gpu.md, "With UCX's own CUDA modules").
    gmd_log "$release: the unit tests that meet UCX, with UCX's CUDA modules"
    stage unit-cuda ctest --test-dir "$build" --output-on-failure -j "$GMD_JOBS" -L unit \
      -R "$ucx_tests" -E '^(gmd_ucm_events_test|gmd_ucm_events_dispatch_test)\.'
    # Installed as the README says: from 1.22 into the release's module directory, found with
    # nothing set; before, through LD_PRELOAD.
    stage install install_check "$prefix" "$build/md/libuct_gmd.so" "$(echo "$ucx" | cut -d. -f2)"
    if (($# > 0)); then
      gmd_log "$release: gmd built for other UCX releases loaded into UCX $ucx"
      stage cross-load "$GMD_SRC/packaging/cross-load-check.sh" --prefix "$prefix" "$@"
    fi
    ;;
  vm)
    [[ -x $build/md/libuct_gmd.so ]] || { echo "$release: no build in $build (phase build first)"; exit 1; }
    gmd_log "$release: gmd under UCX $ucx in the soft-RoCE VM"
    stage release ctest --test-dir "$build" -V -L release
    ;;
  *)
    echo "usage: packaging/test-pip.sh SPEC build|vm [PLUGIN...]" >&2
    exit 2
    ;;
esac
exit $rc
