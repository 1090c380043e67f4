#!/usr/bin/env bash
# packaging/test-root.sh SUITE — gmd's suite against the UCX of another Debian release (trixie: UCX
# 1.18, sid: UCX 1.23), as root: the Debian root (packaging/debian-root.sh, cached), gmd built inside
# it into build-SUITE/, its unit tests there, and the rxe tests in the soft-RoCE VM running inside the
# root (gtest/rxe/run-in-vm --root). Prints one "stage SUITE/NAME: PASS|FAIL|SKIP (N s)" line per
# stage to stdout and to $GMD_STAGE_LOG when set; exits non-zero when a stage fails. Last, the
# release's Debian package (cpack) installed into a clean copy of the root (packaging/package-check.sh).
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

suite=${1:?usage: packaging/test-root.sh SUITE}
build=build-$suite
rc=0

stage() {  # stage NAME RESULT SECONDS [NOTE]
  local line="stage $suite/$1: $2 ($3 s)${4:+ — $4}"
  echo "$line"
  [[ -n ${GMD_STAGE_LOG:-} ]] && echo "$line" >>"$GMD_STAGE_LOG"
  [[ $2 == FAIL ]] && rc=1
  return 0
}

t=$SECONDS
gmd_log "$suite: Debian root (packaging/debian-root.sh)"
if ! root=$("$GMD_SRC/packaging/debian-root.sh" "$suite"); then
  stage root FAIL $((SECONDS - t))
  exit 1
fi
ucx=$(gmd_root_ucx_version "$root")
stage root PASS $((SECONDS - t)) "UCX $ucx"
[[ -n ${GMD_STAGE_LOG:-} ]] && echo "ucx $suite $ucx" >>"$GMD_STAGE_LOG.ucx"

t=$SECONDS
gmd_log "$suite: building gmd against UCX $ucx in $build"
if gmd_in_root "$root" "cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     -DCMAKE_INSTALL_PREFIX=/usr -DGMD_WERROR=ON && cmake --build $build -j $GMD_JOBS"; then
  stage build PASS $((SECONDS - t)) "UCX $ucx"
else
  stage build FAIL $((SECONDS - t))
  exit 1
fi

t=$SECONDS
gmd_log "$suite: unit tests"
if gmd_in_root "$root" "ctest --test-dir $build --output-on-failure -j $GMD_JOBS -L unit"; then
  stage unit PASS $((SECONDS - t))
else
  stage unit FAIL $((SECONDS - t))
fi

# The rxe tests: this machine's ctest starts each through run-rxe-test, whose VM runs it in the root.
t=$SECONDS
gmd_log "$suite: rxe tests in the soft-RoCE VM, inside the $suite root"
if GMD_VM_ROOT=$root ctest --test-dir "$GMD_SRC/$build" --output-on-failure -L rxe; then
  stage rxe PASS $((SECONDS - t)) "MD, gmd_rc, ucx_info, ucx_perftest, MPI"
else
  stage rxe FAIL $((SECONDS - t))
fi

# The Debian package of this UCX minor, installed into a clean copy of the root.
t=$SECONDS
gmd_log "$suite: Debian package (cpack), installed into a clean $suite root"
rm -f "$GMD_SRC/$build"/ucx-gmd_*.deb
if gmd_in_root "$root" "cd $build && cpack -G DEB >/dev/null" &&
   "$GMD_SRC/packaging/package-check.sh" "$suite" "$GMD_SRC/$build"/ucx-gmd_*.deb; then
  stage package PASS $((SECONDS - t)) "$(basename "$GMD_SRC/$build"/ucx-gmd_*.deb)"
else
  stage package FAIL $((SECONDS - t))
fi

exit $rc
