#!/usr/bin/env bash
# The whole gmd test suite on a fresh Debian 12 machine (as root): installs what it needs, builds, runs
# the unit and cuda tests (cuda: skipped with a reason without a GPU), the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer and the threaded ones under ThreadSanitizer; builds gmd
# against the UCX of Debian 13 (trixie, UCX 1.18) and Debian unstable (sid, UCX 1.23), each in a Debian
# root of that release, and runs its unit tests there (packaging/test-root.sh). Then everything that
# needs RDMA, in one soft-RoCE VM (one boot, a run-in-vm session) or on this machine's RDMA devices: the
# rxe tests and the Debian package of each release. Last, a check that a gmd built for one release,
# loaded into another, stays out with one warning.
#
# Ends with one line per stage (result and seconds), the number of VM boots, the ten slowest tests and
# the UCX release of each; exits non-zero when any stage fails. Each stage's output is also kept in
# build-logs/RELEASE.STAGE.log.
#
#   GMD_TEST_SUITES   the other releases (default "trixie sid"); empty: Debian 12 only
#   GMD_TEST_ONLY     unit: the Debian 12 build and its unit and cuda tests, nothing else
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

GMD_DEPS+=(debootstrap ninja-build)
gmd_install_deps || exit 1
suites=${GMD_TEST_SUITES-trixie sid}
only=${GMD_TEST_ONLY:-}
[[ -z $only || $only == unit ]] || { echo "GMD_TEST_ONLY must be empty or unit, not '$only'" >&2; exit 2; }

export GMD_TEST_LOGS=$GMD_SRC/build-logs GMD_STAGE_LOG GMD_VM_BOOT_LOG
rm -rf "$GMD_TEST_LOGS"
mkdir -p "$GMD_TEST_LOGS"
GMD_STAGE_LOG=$GMD_TEST_LOGS/stages
GMD_VM_BOOT_LOG=$GMD_TEST_LOGS/vm-boots
: >"$GMD_STAGE_LOG"
: >"$GMD_VM_BOOT_LOG"
rm -f "$GMD_STAGE_LOG.ucx"
rc=0
start=$SECONDS
stage() { gmd_stage bookworm "$@" || rc=1; }
host_ucx=$(dpkg-query -W -f='${Version}' libucx0 2>/dev/null || echo unknown)
host_ucx=${host_ucx%%-*}

summary() {
  gmd_log "summary"
  echo "UCX: bookworm $host_ucx$(awk '{printf ", %s %s", $2, $3}' "$GMD_STAGE_LOG.ucx" 2>/dev/null)"
  cat "$GMD_STAGE_LOG"
  echo "VM boots: $(wc -l <"$GMD_VM_BOOT_LOG")$(awk '{printf "%s %s", NR == 1 ? " (" : ", ", $2} END {if (NR) printf ")"}' "$GMD_VM_BOOT_LOG")"
  echo "slowest tests:"
  gmd_slowest_tests 10 "$GMD_TEST_LOGS"/*.log
  echo "total: $((SECONDS - start)) s"
  rm -f "$GMD_STAGE_LOG.ucx"
  if [ $rc -eq 0 ]; then gmd_log "all test stages passed"; else gmd_log "some test stage FAILED"; fi
  exit $rc
}

# --- builds and host tests ----------------------------------------------------------------------------
stage build gmd_build "$GMD_BUILD" -G Ninja
gmd_log "tests: unit, cuda ($GMD_BUILD)"
stage unit+cuda ctest --test-dir "$GMD_BUILD" --output-on-failure -j "$GMD_JOBS" -L 'unit|cuda'
[[ $only == unit ]] && summary

# The sanitizer builds run only the unit tests: they build only those (target gmd_unit_tests).
stage asan-build gmd_build "$GMD_SRC/build-asan" -G Ninja -DGMD_ENABLE_ASAN=ON -DGMD_ENABLE_UBSAN=ON \
  -DGMD_BUILD_BENCH=OFF -- --target gmd_unit_tests
gmd_log "tests: unit under ASan+UBSan"
stage asan-unit ctest --test-dir "$GMD_SRC/build-asan" --output-on-failure -j "$GMD_JOBS" -L unit

stage tsan-build gmd_build "$GMD_SRC/build-tsan" -G Ninja -DGMD_ENABLE_TSAN=ON -DGMD_BUILD_BENCH=OFF \
  -- --target gmd_unit_tests
gmd_log "tests: threaded unit tests under TSan"
stage tsan-unit env TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}" \
  ctest --test-dir "$GMD_SRC/build-tsan" --output-on-failure -j "$GMD_JOBS" -L unit \
        -R '[Tt]hread|[Ss]tress|[Cc]oncurren'

# Other Debian releases: root, build and unit tests (their VM stages come below).
for suite in $suites; do
  "$GMD_SRC/packaging/test-root.sh" "$suite" build || rc=1
done

# --- everything that needs RDMA: one VM for all releases ---------------------------------------------
if ! gmd_have_rdma; then
  export GMD_VM_SESSION=$GMD_SRC/.vm-cache/session GMD_VM_SESSION_OWNER=$$
  stage vm-boot "$GMD_SRC/gtest/rxe/run-in-vm" --session-start "$GMD_VM_SESSION" ||
    unset GMD_VM_SESSION  # each command then boots a VM of its own
fi
gmd_log "tests: rxe ($GMD_BUILD)"
stage rxe ctest --test-dir "$GMD_BUILD" --output-on-failure -L rxe

# The Debian 12 package, installed into a clean Debian 12 root.
if [[ -n $suites ]]; then
  gmd_log "bookworm: Debian package (cpack), installed into a clean bookworm root"
  rm -f "$GMD_BUILD"/ucx-gmd_*.deb
  stage package bash -c "cd '$GMD_BUILD' && cpack -G DEB >/dev/null &&
    '$GMD_SRC/packaging/package-check.sh' bookworm '$GMD_BUILD'/ucx-gmd_*.deb"
fi

plugins=("$GMD_BUILD/md/libuct_gmd.so")
for suite in $suites; do
  "$GMD_SRC/packaging/test-root.sh" "$suite" vm || rc=1
  plugins+=("$GMD_SRC/build-$suite/md/libuct_gmd.so")
done
if [[ -n ${GMD_VM_SESSION:-} ]]; then
  "$GMD_SRC/gtest/rxe/run-in-vm" --session-stop "$GMD_VM_SESSION"
fi

# Every build loaded into every other release's ucx_info (newer roots only: their C++ runtime is
# newer). "changes nothing": exactly one warning, the rest of the output as without gmd.
for suite in $suites; do
  root=$("$GMD_SRC/packaging/debian-root.sh" "$suite") || continue
  others=()
  for p in "${plugins[@]}"; do
    [[ $p == "$GMD_SRC/build-$suite/"* ]] && break
    others+=("$p")
  done
  gmd_log "$suite: gmd built for other UCX releases loaded into UCX $(gmd_root_ucx_version "$root")"
  gmd_stage "$suite" cross-load "$GMD_SRC/packaging/cross-load-check.sh" "$root" "${others[@]}" || rc=1
done

summary
