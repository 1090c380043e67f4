#!/usr/bin/env bash
# The whole gmd test suite on a fresh Debian 12 machine (as root): installs what it needs and builds
# (the soft-RoCE VM boots meanwhile). Then two lanes side by side. On the host: the unit and cuda
# tests (cuda: skipped with a reason without a GPU); gmd built against the UCX of Debian 13 (trixie,
# UCX 1.18) and Debian unstable (sid, UCX 1.23), each in a Debian root of that release, with its unit
# tests there (packaging/test-root.sh); for each of NVIDIA's pip builds of UCX (packaging/test-pip.sh)
# gmd built against it with the unit tests that meet UCX; the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer and the threaded ones under ThreadSanitizer. In one
# soft-RoCE VM (one boot, a run-in-vm session) or on this machine's RDMA devices, everything that
# needs RDMA: the rxe tests and the Debian package of each release, then each pip release's ucx_info,
# UCT and UCP over gmd_rc. Last, a check that a gmd built for one release, loaded into another, stays
# out with one warning.
#
# Ends with one line per stage (result and seconds), the number of VM boots, the ten slowest tests and
# the UCX release of each, then, last (where the end of the output shows it), each failed stage: the
# end of its log and a line naming its failed tests; exits non-zero when any stage fails. Each
# stage's output is also kept in build-logs/RELEASE.STAGE.log.
#
#   GMD_TEST_SUITES   the other releases (default "trixie sid"); empty: Debian 12 only
#   GMD_TEST_PIP      NVIDIA's pip builds of UCX to test against (default: packaging/pip-ucx.sh list,
#                     one per minor 1.14-1.22); empty: none
#   GMD_TEST_ONLY     unit: the Debian 12 build and its unit and cuda tests, nothing else
#   GMD_VM_JOBS       rxe tests side by side in the VM (ctest -j; default 2, packaging/common.sh)
set -uo pipefail
# test.sh --threaded-check BUILD: every unit case that GMD_THREADED_TEST_REGEX names is in a binary
# marked THREADED (BUILD/threaded-tests), else the ThreadSanitizer build would not build it.
# threaded_regex BUILD: that pattern, as gtest/CMakeLists.txt wrote it into BUILD/threaded-tests.
threaded_regex() { sed -n 's/^# GMD_THREADED_TEST_REGEX //p' "$1/threaded-tests"; }
if [[ ${1:-} == --threaded-check ]]; then
  list=$2/threaded-tests
  regex=$(threaded_regex "$2")
  [[ -n $regex ]] || { echo "FAIL: no GMD_THREADED_TEST_REGEX in $list"; exit 1; }
  missing=$(ctest --test-dir "$2" -N -L unit -R "$regex" | sed -n 's/^ *Test *#[0-9]*: \([^.]*\)\..*/\1/p' |
            sort -u | grep -vxF -f <(grep -v '^#' "$list"))
  [[ -z $missing ]] && exit 0
  echo "FAIL: cases matching '$regex' in binaries not marked THREADED (gtest/CMakeLists.txt): $missing"
  exit 1
fi
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

GMD_DEPS+=(debootstrap ninja-build)
gmd_install_deps || exit 1
suites=${GMD_TEST_SUITES-trixie sid}
pips=${GMD_TEST_PIP-$("$GMD_SRC/packaging/pip-ucx.sh" list)}
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
  grep -q ': FAIL' "$GMD_STAGE_LOG" && rc=1
  gmd_log "summary"
  echo "UCX: bookworm $host_ucx$(awk '{printf ", %s %s", $2, $3}' "$GMD_STAGE_LOG.ucx" 2>/dev/null)"
  cat "$GMD_STAGE_LOG"
  echo "VM boots: $(wc -l <"$GMD_VM_BOOT_LOG")$(awk '{printf "%s%s", NR == 1 ? " (" : ", ", $2 == "start" ? "session" : "one command"} END {if (NR) printf ")"}' "$GMD_VM_BOOT_LOG")"
  echo "slowest tests:"
  gmd_slowest_tests 10 "$GMD_TEST_LOGS"/*.log
  echo "total: $((SECONDS - start)) s"
  # What failed, last, where a reader of only the output's end sees it: each failed stage's name,
  # its test cases that failed, and the last lines of its log (the host lane's output is not on
  # the screen).
  local stage
  local -a failed
  mapfile -t failed < <(sed -n 's/^stage \([^:]*\): FAIL.*/\1/p' "$GMD_STAGE_LOG")
  # RELEASE/NAME -> its log's file name, as gmd_stage (packaging/common.sh) makes it.
  stage_log() { local n=${1#*/}; echo "${1%%/*}.${n//\//-}.log"; }
  for stage in "${failed[@]}"; do
    gmd_log "FAILED: $stage (build-logs/$(stage_log "$stage")), its last lines:"
    tail -n 25 "$GMD_TEST_LOGS/$(stage_log "$stage")" 2>/dev/null
  done
  for stage in "${failed[@]}"; do
    echo "failed stage $stage:" \
      "$(grep -hoE '(Test +#[0-9]+: [^ ]+ [.]+[^0-9]*(Failed|Timeout|Exception)|^([0-9]+: )?FAIL[^ ]*: .{0,100}|\[  FAILED  \] [A-Za-z][^ ,]*)' \
           "$GMD_TEST_LOGS/$(stage_log "$stage")" 2>/dev/null | sed 's/ \.\.*[*]*/ /' | sort -u | head -n 5 | paste -sd ';' -)"
  done
  rm -f "$GMD_STAGE_LOG.ucx"
  if [ $rc -eq 0 ]; then gmd_log "all test stages passed"; else gmd_log "some test stage FAILED"; fi
  exit $rc
}

# --- builds and host tests ----------------------------------------------------------------------------
# The soft-RoCE VM boots while Debian 12's build runs (one VM session for every release's rxe tests).
boot_pid=""
if [[ $only != unit ]] && ! gmd_have_rdma; then
  export GMD_VM_SESSION=$GMD_SRC/.vm-cache/session GMD_VM_SESSION_OWNER=$$
  gmd_stage bookworm vm-boot "$GMD_SRC/gtest/rxe/run-in-vm" --session-start "$GMD_VM_SESSION" \
    >"$GMD_TEST_LOGS/vm-boot.out" 2>&1 &
  boot_pid=$!
fi
stage build gmd_build "$GMD_BUILD" -G Ninja
unit_tests() {
  gmd_log "tests: unit, cuda ($GMD_BUILD)"
  gmd_stage bookworm unit+cuda ctest --test-dir "$GMD_BUILD" --output-on-failure -j "$GMD_JOBS" \
    -L 'unit|cuda'
}
if [[ $only == unit ]]; then
  unit_tests
  summary
fi

# --- the rest, in two lanes side by side --------------------------------------------------------------
# The host lane: Debian 12's unit and cuda tests, each other Debian release's root, build and unit
# tests, each pip release's build and unit tests, then the sanitizer builds, which build and run only
# the unit tests (targets gmd_unit_tests, gmd_threaded_tests). The VM lane: everything that needs
# RDMA, in one soft-RoCE VM for all releases (a run-in-vm session), each release once its build is
# there. The VM leaves part of the cores idle (commands wait on each other and on the network); the
# builds take that part. Each lane's output goes to its stage logs (build-logs/).
# The ThreadSanitizer cases: those GMD_THREADED_TEST_REGEX names, after the check that each is built.
tsan_unit() {
  "$GMD_SRC/packaging/test.sh" --threaded-check "$GMD_BUILD" || return 1
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} ctest --test-dir "$GMD_SRC/build-tsan" \
    --output-on-failure -j "$GMD_JOBS" -L unit \
    -R "$(threaded_regex "$GMD_SRC/build-tsan")"
}
host_lane() {
  local suite
  # The VM first: the host lane yields the cores to it (nice 10) and takes what it leaves. The guest's
  # CPUs are qemu threads; taken from it in the middle of a spinning wait or a lock held in its
  # kernel, they burn their next turn on it, so an even share cost the VM more than its time: Debian
  # 12's rxe tests took 958 s beside the builds against 350 s alone.
  renice -n 10 -p "$BASHPID" >/dev/null
  # Debian 12's unit tests first, beside its rxe tests in the VM lane.
  unit_tests
  # The other releases first: the VM lane waits for their builds.
  for suite in $suites; do
    "$GMD_SRC/packaging/test-root.sh" "$suite" build
    echo $? >"$GMD_TEST_LOGS/built-$suite"
  done
  # Then the pip releases, each with the plugins of Debian 12 and of the pip release of the minor
  # before it loaded into its ucx_info.
  local spec name minor last_minor="" last=() prev=()
  for spec in $pips; do
    name=$("$GMD_SRC/packaging/pip-ucx.sh" name "$spec")
    minor=${name#pip-}
    minor=${minor%%-*}
    [[ $minor != "$last_minor" ]] && prev=("${last[@]}")
    "$GMD_SRC/packaging/test-pip.sh" "$spec" build "$GMD_BUILD/md/libuct_gmd.so" "${prev[@]}"
    echo $? >"$GMD_TEST_LOGS/built-${spec//=/-}"
    last=("$GMD_SRC/build-$name/md/libuct_gmd.so") last_minor=$minor
  done
  gmd_stage bookworm asan-build gmd_build "$GMD_SRC/build-asan" -G Ninja -DGMD_ENABLE_ASAN=ON \
    -DGMD_ENABLE_UBSAN=ON -DGMD_BUILD_BENCH=OFF -- --target gmd_unit_tests &&
    gmd_stage bookworm asan-unit ctest --test-dir "$GMD_SRC/build-asan" --output-on-failure \
      -j "$GMD_JOBS" -L unit
  # ThreadSanitizer: only the binaries marked THREADED (gtest/CMakeLists.txt) and in them the cases
  # that run threads; first a check that no such case sits in a binary it would not build.
  gmd_stage bookworm tsan-build gmd_build "$GMD_SRC/build-tsan" -G Ninja -DGMD_ENABLE_TSAN=ON \
    -DGMD_BUILD_BENCH=OFF -- --target gmd_threaded_tests &&
    gmd_stage bookworm tsan-unit tsan_unit
}
gmd_log "host lane (Debian 12's unit tests; Debian 13 and unstable: roots, builds, unit tests; pip builds; sanitizers) in the background:" \
  "build-logs/host-lane.log"
host_lane >"$GMD_TEST_LOGS/host-lane.log" 2>&1 &
host_pid=$!

if [[ -n $boot_pid ]]; then
  wait "$boot_pid" || unset GMD_VM_SESSION  # each command then boots a VM of its own
  cat "$GMD_TEST_LOGS/vm-boot.out"
fi
gmd_log "tests: rxe ($GMD_BUILD)"
stage rxe ctest --test-dir "$GMD_BUILD" --output-on-failure -L rxe -j "$GMD_VM_JOBS"

# The Debian 12 package, installed into a clean Debian 12 root.
if [[ -n $suites ]]; then
  gmd_log "bookworm: Debian package (cpack), installed into a clean bookworm root"
  rm -f "$GMD_BUILD"/ucx-gmd_*.deb
  stage package bash -c "cd '$GMD_BUILD' && cpack -G DEB >/dev/null &&
    '$GMD_SRC/packaging/package-check.sh' bookworm '$GMD_BUILD'/ucx-gmd_*.deb"
fi

plugins=("$GMD_BUILD/md/libuct_gmd.so")
for suite in $suites; do
  while [[ ! -s $GMD_TEST_LOGS/built-$suite ]] && kill -0 "$host_pid" 2>/dev/null; do sleep 1; done
  if [[ $(cat "$GMD_TEST_LOGS/built-$suite" 2>/dev/null) == 0 ]]; then
    "$GMD_SRC/packaging/test-root.sh" "$suite" vm || rc=1
  else
    echo "$suite: no build (see build-logs/host-lane.log): its VM stages did not run"
    rc=1
  fi
  plugins+=("$GMD_SRC/build-$suite/md/libuct_gmd.so")
done
for spec in $pips; do
  while [[ ! -s $GMD_TEST_LOGS/built-${spec//=/-} ]] && kill -0 "$host_pid" 2>/dev/null; do sleep 1; done
  "$GMD_SRC/packaging/test-pip.sh" "$spec" vm || rc=1
done
if [[ -n ${GMD_VM_SESSION:-} ]]; then
  "$GMD_SRC/gtest/rxe/run-in-vm" --session-stop "$GMD_VM_SESSION"
fi
gmd_log "waiting for the host lane"
wait "$host_pid"

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
