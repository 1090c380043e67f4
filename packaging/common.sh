# Shared by packaging/demo.sh and packaging/test.sh: Debian 12 dependencies and the build.
# shellcheck shell=bash

GMD_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GMD_BUILD=${GMD_BUILD:-$GMD_SRC/build}
GMD_JOBS=${GMD_JOBS:-$(nproc)}

gmd_log() { printf '\n==> %s\n' "$*"; }

# Build and run-time dependencies, from Debian's packages only.
GMD_DEPS=(build-essential cmake pkg-config libucx-dev ucx-utils libibverbs-dev librdmacm-dev
          rdma-core ibverbs-utils ibverbs-providers rdmacm-utils libgtest-dev libgmock-dev
          libbenchmark-dev openmpi-bin libopenmpi-dev
          qemu-system-x86 busybox-static kmod cpio iproute2)

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

# gmd_build BUILD_DIR [cmake options...]
gmd_build() {
  local dir=$1
  shift
  gmd_log "configuring $dir $*"
  cmake -S "$GMD_SRC" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
        -DGMD_WERROR=ON "$@"
  gmd_log "building $dir"
  cmake --build "$dir" -j "$GMD_JOBS"
}

# True when this machine has an RDMA device of its own (no VM needed).
gmd_have_rdma() {
  [ -d /sys/class/infiniband ] && [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]
}
