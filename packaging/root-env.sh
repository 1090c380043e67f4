# Shared by packaging/test-root.sh and packaging/cross-load-check.sh: running commands inside a Debian
# root of another release (packaging/debian-root.sh) with this checkout at its own path.
# shellcheck shell=bash

# gmd_in_root ROOT COMMAND... — run COMMAND (a shell command line) as root inside ROOT, in the
# checkout. Mounts (proc, sys, dev, the checkout) live in a private mount namespace, so nothing stays
# mounted on this machine (the soft-RoCE VM sees this machine's filesystem).
# The host's CUDA toolkit (headers, the driver stub, libcudart), when it has one, is bound read-only at
# the root's /usr/local/cuda: Debian ships no toolkit a root could install for every release, and
# gmd's CUDA paths build against the headers alone (the driver is loaded at run time).
gmd_in_root() {
  local root=$1 cuda=""
  shift
  mkdir -p "$root$GMD_SRC" || return 1
  if [[ -f ${CUDA_HOME:-/usr/local/cuda}/include/cuda.h ]]; then
    cuda=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
    mkdir -p "$root/usr/local/cuda" || return 1
  fi
  unshare -m bash -c '
    set -e
    root=$1 src=$2 cuda=$3
    shift 3
    mount --make-rprivate /
    for m in proc sys dev dev/pts; do mount --bind "/$m" "$root/$m"; done
    mount --bind "$src" "$root$src"
    if [ -n "$cuda" ]; then
      mount --bind "$cuda" "$root/usr/local/cuda"
      mount -o remount,bind,ro "$root/usr/local/cuda"
    fi
    exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
         HOME=/root LANG=C.UTF-8 /bin/bash -c "cd \"$src\" && $*"
  ' _ "$root" "$GMD_SRC" "$cuda" "$@"
}

# The UCX version of a root (Debian's version of ucx-utils, e.g. 1.18.1+ds-2+b1 → 1.18.1).
gmd_root_ucx_version() {
  local v
  v=$(cat "$1/.gmd-ucx-version" 2>/dev/null) || return 1
  v=${v%%-*}
  echo "${v%%+*}"
}
