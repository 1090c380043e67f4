#!/usr/bin/env bash
# The whole gmd test suite on a fresh Debian 12 machine (as root): installs what it needs, builds,
# runs the unit, rxe (soft-RoCE VM, or a real RDMA device) and cuda tests, then the unit tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer and the threaded ones under ThreadSanitizer.
# Then the same build, unit and rxe tests against the UCX of Debian 13 (trixie, UCX 1.18) and Debian
# unstable (sid, UCX 1.23), each in a Debian root of that release (packaging/test-root.sh), and a
# check that a gmd built for one release, loaded into another, stays out with one warning.
# Ends with one line per stage (result and seconds) and the UCX release of each; exits non-zero when
# any stage fails. GMD_TEST_SUITES (default "trixie sid") names the other releases; empty: Debian 12
# only.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

GMD_DEPS+=(debootstrap ninja-build)
gmd_install_deps
rc=0
export GMD_STAGE_LOG
GMD_STAGE_LOG=$(mktemp)
rm -f "$GMD_STAGE_LOG.ucx"
stage() {  # stage NAME START_SECONDS COMMAND...
  local name=$1 t=$2 result=PASS
  shift 2
  "$@" || { result=FAIL; rc=1; }
  echo "stage bookworm/$name: $result ($((SECONDS - t)) s)" >>"$GMD_STAGE_LOG"
}
host_ucx=$(dpkg-query -W -f='${Version}' libucx0 2>/dev/null || echo unknown)
host_ucx=${host_ucx%%-*}

t=$SECONDS
stage build $t gmd_build "$GMD_BUILD"
gmd_log "tests: unit, rxe, cuda ($GMD_BUILD)"
t=$SECONDS
stage unit+cuda $t ctest --test-dir "$GMD_BUILD" --output-on-failure -j "$GMD_JOBS" -L 'unit|cuda'
t=$SECONDS
stage rxe $t ctest --test-dir "$GMD_BUILD" --output-on-failure -L rxe

t=$SECONDS
stage asan-build $t gmd_build "$GMD_SRC/build-asan" -DGMD_ENABLE_ASAN=ON -DGMD_ENABLE_UBSAN=ON \
  -DGMD_BUILD_BENCH=OFF
gmd_log "tests: unit under ASan+UBSan"
t=$SECONDS
stage asan-unit $t ctest --test-dir "$GMD_SRC/build-asan" --output-on-failure -j "$GMD_JOBS" -L unit

t=$SECONDS
stage tsan-build $t gmd_build "$GMD_SRC/build-tsan" -DGMD_ENABLE_TSAN=ON -DGMD_BUILD_BENCH=OFF
gmd_log "tests: threaded unit tests under TSan"
t=$SECONDS
stage tsan-unit $t env TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}" \
  ctest --test-dir "$GMD_SRC/build-tsan" --output-on-failure -j "$GMD_JOBS" -L unit \
        -R '[Tt]hread|[Ss]tress|[Cc]oncurren'

# The Debian 12 package, installed into a clean Debian 12 root.
t=$SECONDS
gmd_log "bookworm: Debian package (cpack), installed into a clean bookworm root"
rm -f "$GMD_BUILD"/ucx-gmd_*.deb
if [[ -n ${GMD_TEST_SUITES-trixie sid} ]]; then
  stage package $t bash -c "cd '$GMD_BUILD' && cpack -G DEB >/dev/null &&
    '$GMD_SRC/packaging/package-check.sh' bookworm '$GMD_BUILD'/ucx-gmd_*.deb"
fi

# Other Debian releases, each against its own UCX.
plugins=("$GMD_BUILD/md/libuct_gmd.so")
for suite in ${GMD_TEST_SUITES-trixie sid}; do
  "$GMD_SRC/packaging/test-root.sh" "$suite" || rc=1
  plugins+=("$GMD_SRC/build-$suite/md/libuct_gmd.so")
done
# Every build loaded into every other release's ucx_info (newer roots only: their C++ runtime is
# newer). "changes nothing": exactly one warning, the rest of the output as without gmd.
for suite in ${GMD_TEST_SUITES-trixie sid}; do
  root=$("$GMD_SRC/packaging/debian-root.sh" "$suite") || continue
  others=()
  for p in "${plugins[@]}"; do
    [[ $p == "$GMD_SRC/build-$suite/"* ]] && break
    others+=("$p")
  done
  t=$SECONDS
  gmd_log "$suite: gmd built for other UCX releases loaded into UCX $(gmd_root_ucx_version "$root")"
  if "$GMD_SRC/packaging/cross-load-check.sh" "$root" "${others[@]}"; then r=PASS; else r=FAIL; rc=1; fi
  echo "stage $suite/cross-load: $r ($((SECONDS - t)) s)" >>"$GMD_STAGE_LOG"
done

gmd_log "summary"
echo "UCX: bookworm $host_ucx$(awk '{printf ", %s %s", $2, $3}' "$GMD_STAGE_LOG.ucx" 2>/dev/null)"
cat "$GMD_STAGE_LOG"
rm -f "$GMD_STAGE_LOG" "$GMD_STAGE_LOG.ucx"
if [ $rc -eq 0 ]; then gmd_log "all test stages passed"; else gmd_log "some test stage FAILED"; fi
exit $rc
