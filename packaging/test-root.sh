#!/usr/bin/env bash
# packaging/test-root.sh SUITE [build|vm|all] — gmd's suite against the UCX of another Debian release
# (trixie: UCX 1.18, sid: UCX 1.23), as root.
#   build: the Debian root (packaging/debian-root.sh, cached), gmd built inside it into build-SUITE/,
#          its unit tests there;
#   vm:    the rxe tests in the soft-RoCE VM running inside the root (in the run-in-vm session that
#          GMD_VM_SESSION names, else one VM for them), then the release's Debian package (cpack)
#          installed into a clean copy of the root (packaging/package-check.sh);
#   all:   both (the default).
# Prints one "stage SUITE/NAME: PASS|FAIL (N s)" line per stage to stdout and to $GMD_STAGE_LOG when set
# (each stage's output kept in $GMD_TEST_LOGS/SUITE.NAME.log when set); exits non-zero when a stage
# fails.
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

suite=${1:?usage: packaging/test-root.sh SUITE [build|vm|all]}
phase=${2:-all}
[[ $phase =~ ^(build|vm|all)$ ]] || { echo "usage: packaging/test-root.sh SUITE [build|vm|all]" >&2; exit 2; }
build=build-$suite
rc=0
stage() { gmd_stage "$suite" "$@" || rc=1; }

gmd_log "$suite: Debian root (packaging/debian-root.sh)"
t=$SECONDS
if ! root=$("$GMD_SRC/packaging/debian-root.sh" "$suite"); then
  echo "stage $suite/root: FAIL ($((SECONDS - t)) s)" | tee -a "${GMD_STAGE_LOG:-/dev/null}"
  exit 1
fi
ucx=$(gmd_root_ucx_version "$root")
if [[ $phase != vm ]]; then
  echo "stage $suite/root: PASS ($((SECONDS - t)) s) — UCX $ucx" | tee -a "${GMD_STAGE_LOG:-/dev/null}"
  [[ -n ${GMD_STAGE_LOG:-} ]] && echo "ucx $suite $ucx" >>"$GMD_STAGE_LOG.ucx"

  gmd_log "$suite: building gmd against UCX $ucx in $build"
  if ! gmd_stage "$suite" build gmd_in_root "$root" "cmake -S . -B $build -G Ninja \
       -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr -DGMD_WERROR=ON &&
       cmake --build $build -j $GMD_JOBS"; then
    exit 1
  fi
  gmd_log "$suite: unit tests"
  stage unit gmd_in_root "$root" "ctest --test-dir $build --output-on-failure -j $GMD_JOBS -L unit"
fi

if [[ $phase != build ]]; then
  [[ -x $GMD_SRC/$build/md/libuct_gmd.so ]] || { echo "$suite: no build in $build (phase build first)"; exit 1; }
  # The rxe tests: this machine's ctest starts each through run-rxe-test, whose VM runs it in the root.
  gmd_log "$suite: rxe tests in the soft-RoCE VM, inside the $suite root"
  stage rxe env GMD_VM_ROOT="$root" ctest --test-dir "$GMD_SRC/$build" --output-on-failure -L rxe \
    -j "$GMD_VM_JOBS"

  # The Debian package of this UCX minor, installed into a clean copy of the root.
  gmd_log "$suite: Debian package (cpack), installed into a clean $suite root"
  rm -f "$GMD_SRC/$build"/ucx-gmd_*.deb
  stage package bash -c "source '$GMD_SRC/packaging/common.sh'; source '$GMD_SRC/packaging/root-env.sh'
    gmd_in_root '$root' 'cd $build && cpack -G DEB >/dev/null' &&
    '$GMD_SRC/packaging/package-check.sh' '$suite' '$GMD_SRC/$build'/ucx-gmd_*.deb"
fi

exit $rc
