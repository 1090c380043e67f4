#!/usr/bin/env bash
# The whole gmd test suite on a fresh Debian 12 machine (as root): installs what it needs, builds,
# runs the unit, rxe (soft-RoCE VM, or a real RDMA device) and cuda tests, then the unit tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer and the threaded ones under ThreadSanitizer.
# Exits non-zero when any of them fails.
set -euo pipefail
source "$(dirname "$0")/common.sh"

gmd_install_deps
rc=0

gmd_build "$GMD_BUILD"
gmd_log "tests: unit, rxe, cuda ($GMD_BUILD)"
ctest --test-dir "$GMD_BUILD" --output-on-failure -j "$GMD_JOBS" -L 'unit|cuda' || rc=1
ctest --test-dir "$GMD_BUILD" --output-on-failure -L rxe || rc=1

gmd_build "$GMD_SRC/build-asan" -DGMD_ENABLE_ASAN=ON -DGMD_ENABLE_UBSAN=ON -DGMD_BUILD_BENCH=OFF
gmd_log "tests: unit under ASan+UBSan"
ctest --test-dir "$GMD_SRC/build-asan" --output-on-failure -j "$GMD_JOBS" -L unit || rc=1

gmd_build "$GMD_SRC/build-tsan" -DGMD_ENABLE_TSAN=ON -DGMD_BUILD_BENCH=OFF
gmd_log "tests: threaded unit tests under TSan"
TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} \
  ctest --test-dir "$GMD_SRC/build-tsan" --output-on-failure -j "$GMD_JOBS" -L unit \
        -R '[Tt]hread|[Ss]tress|[Cc]oncurren' || rc=1

if [ $rc -eq 0 ]; then gmd_log "all test stages passed"; else gmd_log "some test stage FAILED"; fi
exit $rc
