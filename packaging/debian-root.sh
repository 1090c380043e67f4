#!/usr/bin/env bash
# packaging/debian-root.sh SUITE  — print the path of a Debian SUITE root (trixie, sid, ...) with gmd's
# build and test dependencies, building it first when it is missing or its inputs changed.
#
# The root comes from Debian's packages only (debootstrap --variant=minbase, then apt inside it). The
# mirror is read from this machine's apt configuration at run time. Roots are cached outside the
# checkout, under $GMD_ROOTS_CACHE (default /var/cache/gmd/roots), one folder per suite; a root is
# rebuilt when this script or its package list changes (the key is stored in the root). Building needs
# root (debootstrap, chroot); using a finished root does not. Progress goes to stderr; stdout is the
# path only.
#
#   GMD_ROOT_MIRROR   Debian mirror to use (default: the first Debian archive in this machine's apt
#                     sources)
#   GMD_ROOT_REBUILD  1: rebuild even when the cached root is current
set -euo pipefail

suite=${1:?usage: debian-root.sh SUITE}
cache=${GMD_ROOTS_CACHE:-/var/cache/gmd/roots}
root=$cache/$suite

# gmd's build and test dependencies inside the root (the host's VM tooling stays on the host).
pkgs=(build-essential cmake ninja-build pkg-config libucx-dev ucx-utils libibverbs-dev librdmacm-dev
      rdma-core ibverbs-utils ibverbs-providers rdmacm-utils libgtest-dev libgmock-dev libbenchmark-dev
      openmpi-bin libopenmpi-dev iproute2 kmod procps file ca-certificates)

say() { printf 'debian-root: %s\n' "$*" >&2; }

key=$( { cat "$0"; printf '%s\n' "$suite" "${pkgs[@]}"; } | sha256sum | cut -c1-16)
if [ "${GMD_ROOT_REBUILD:-0}" != 1 ] && [ -f "$root/.gmd-root-key" ] &&
   [ "$(cat "$root/.gmd-root-key")" = "$key" ]; then
  echo "$root"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  say "the $suite root in $root is missing or out of date; building it needs root"
  exit 1
fi

# The Debian archive this machine already uses (apt's own view of its sources), not a fixed host.
mirror=${GMD_ROOT_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(apt-get indextargets --format '$(SITE) $(RELEASE)' 2>/dev/null |
           awk '$2 !~ /-security$/ && $1 ~ /\/debian\/?$/ {print $1; exit}')
fi
if [ -z "$mirror" ]; then
  say "no Debian archive found in this machine's apt sources: set GMD_ROOT_MIRROR"
  exit 1
fi

for tool in debootstrap flock; do
  command -v "$tool" >/dev/null || { say "needs $tool (apt-get install debootstrap util-linux)"; exit 1; }
done

mkdir -p "$cache"
exec 9>"$cache/.$suite.lock"
flock 9
# Another process may have finished it while this one waited.
if [ -f "$root/.gmd-root-key" ] && [ "$(cat "$root/.gmd-root-key")" = "$key" ] &&
   [ "${GMD_ROOT_REBUILD:-0}" != 1 ]; then
  echo "$root"
  exit 0
fi

mounted=()
cleanup() {
  local m
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

start=$SECONDS
tmp=$cache/.$suite.new
if [ -d "$tmp" ]; then
  for m in proc sys dev/pts dev; do umount -l "$tmp/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$tmp"
fi
say "debootstrap $suite from $mirror into $tmp"
debootstrap --variant=minbase "$suite" "$tmp" "$mirror" >&2

for m in proc sys dev dev/pts; do
  mount --bind "/$m" "$tmp/$m"
  mounted+=("$tmp/$m")
done
apt_opts=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -q)
say "installing ${#pkgs[@]} packages into the $suite root"
chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update >&2
chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y "${pkgs[@]}" >&2
chroot "$tmp" apt-get clean
cleanup
mounted=()
# Installed UCX version, for callers and summaries.
chroot "$tmp" dpkg-query -W -f='${Version}\n' ucx-utils >"$tmp/.gmd-ucx-version"
echo "$key" >"$tmp/.gmd-root-key"

if [ -d "$root" ]; then
  for m in proc sys dev/pts dev; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
fi
mv "$tmp" "$root"
say "$suite root ready in $((SECONDS - start)) s (UCX $(cat "$root/.gmd-ucx-version"))"
echo "$root"
