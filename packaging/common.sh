# Shared by packaging/demo.sh and packaging/test.sh: Debian 12 dependencies and the build.
# shellcheck shell=bash

GMD_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GMD_BUILD=${GMD_BUILD:-$GMD_SRC/build}
GMD_JOBS=${GMD_JOBS:-$(nproc)}
# rxe tests side by side in the soft-RoCE VM (ctest -j; tests that need the VM alone are RUN_SERIAL).
# One test at a time leaves the guest's CPUs idle while a test waits (connections, peer failure,
# process starts); two at a time took Debian 13's rxe tests from 586-647 s to 388 s on an idle
# machine. The checks that counted on being alone (the QP count of the scale test, the destroy
# rounds of the contract test) are fixed; GMD_VM_JOBS=1 runs them one at a time.
GMD_VM_JOBS=${GMD_VM_JOBS:-2}

gmd_log() { printf '\n==> %s\n' "$*"; }

# Build and run-time dependencies, from Debian's packages only.
GMD_DEPS=(build-essential cmake pkg-config libucx-dev ucx-utils libibverbs-dev librdmacm-dev
          rdma-core ibverbs-utils ibverbs-providers rdmacm-utils libgtest-dev libgmock-dev
          libbenchmark-dev openmpi-bin libopenmpi-dev mpich libmpich-dev netpipe-openmpi
          qemu-system-x86 busybox-static kmod cpio iproute2 python3-venv)

gmd_install_deps() {
  local missing=()
  for p in "${GMD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "gmd: missing packages (run as root to install): ${missing[*]}" >&2
    return 1
  fi
  gmd_log "installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# gmd_build BUILD_DIR [cmake options...] [-- build options...] (e.g. -- --target gmd_unit_tests)
gmd_build() {
  local dir=$1
  shift
  local -a conf=() bopts=()
  while (($#)); do
    if [[ $1 == -- ]]; then shift; bopts=("$@"); break; fi
    conf+=("$1")
    shift
  done
  gmd_log "configuring $dir ${conf[*]}"
  cmake -S "$GMD_SRC" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
        -DGMD_WERROR=ON "${conf[@]}" || return 1
  gmd_log "building $dir ${bopts[*]}"
  cmake --build "$dir" -j "$GMD_JOBS" "${bopts[@]}"
}

# gmd_has PATTERN TEXT: whether a line of TEXT matches grep's PATTERN. TEXT goes in as a here-string:
# under pipefail, `echo "$text" | grep -q` fails when grep has its match and quits before echo has
# written the whole text (echo dies of SIGPIPE, status 141), which a long ucx_info -c -f output does
# now and then.
gmd_has() { grep -q -- "$1" <<<"$2"; }

# True when this machine has an RDMA device of its own (no VM needed).
gmd_have_rdma() {
  [ -d /sys/class/infiniband ] && [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]
}

# --- stages (packaging/test.sh, packaging/test-root.sh) ------------------------------------------------
# gmd_stage RELEASE NAME COMMAND...: runs COMMAND, its output shown and kept in
# $GMD_TEST_LOGS/RELEASE.NAME.log, and records "stage RELEASE/NAME: PASS|FAIL (N s)" on stdout and in
# $GMD_STAGE_LOG (when set). Returns COMMAND's status.
gmd_stage() {
  local release=$1 name=$2 t=$SECONDS rc result=PASS line log=/dev/null
  shift 2
  [[ -n ${GMD_TEST_LOGS:-} ]] && log=$GMD_TEST_LOGS/$release.${name//\//-}.log
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || result=FAIL
  line="stage $release/$name: $result ($((SECONDS - t)) s)"
  echo "$line"
  [[ -n ${GMD_STAGE_LOG:-} ]] && echo "$line" >>"$GMD_STAGE_LOG"
  return "$rc"
}

# gmd_slowest_tests N LOG...: the N slowest ctest entries in stage logs, "seconds release/stage test".
gmd_slowest_tests() {
  local n=$1
  shift
  awk '
    match($0, /Test +#[0-9]+: [^ ]+ \.+ *(\*\*\*)?[A-Za-z*]+[ A-Za-z()]* +[0-9.]+ sec/) {
      s = substr($0, RSTART, RLENGTH)
      split(s, w, " +")
      name = ""
      for (i = 1; i <= length(w); i++) if (w[i] ~ /^#[0-9]+:$/) { name = w[i + 1]; break }
      secs = w[length(w) - 1]
      # RELEASE.NAME.log -> RELEASE/NAME (a release may hold dots: pip-1.17; a name holds none)
      rel = FILENAME; sub(/.*\//, "", rel); sub(/\.log$/, "", rel)
      # (host-lane.log repeats the logs of its stages and is skipped)
      if (!match(rel, /\.[^.]*$/)) next
      rel = substr(rel, 1, RSTART - 1) "/" substr(rel, RSTART + 1)
      printf "%9.2f s  %-18s %s\n", secs, rel, name
    }' "$@" | sort -rn | head -n "$n"
}
