#!/usr/bin/env bash
# packaging/package-check.sh SUITE DEB — installs the Debian package DEB (cpack's ucx-gmd_*.deb) into a
# clean copy of the SUITE root (packaging/debian-root.sh; an overlay, so the cached root stays clean)
# and runs `ucx_info -d` in the soft-RoCE VM inside it (the run-in-vm session of GMD_VM_SESSION if any), loading gmd as README.md says for that
# release: LD_PRELOAD of <libdir>/ucx/libuct_gmd.so for UCX up to 1.21, nothing at all from 1.22 on.
# Passes when dpkg installs it, its dependency pins the root's UCX minor, and ucx_info lists
# component gmd with a memory domain per RDMA device and transport gmd_rc. As root.
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/root-env.sh"

suite=${1:?usage: packaging/package-check.sh SUITE DEB}
deb=$(realpath "${2:?usage: packaging/package-check.sh SUITE DEB}")
[[ -f $deb ]] || { echo "FAIL: no package $deb"; exit 1; }
root=$("$GMD_SRC/packaging/debian-root.sh" "$suite") || { echo "FAIL: no $suite root"; exit 1; }
ucx=$(gmd_root_ucx_version "$root")
minor=$(echo "$ucx" | cut -d. -f2)
cache=${GMD_ROOTS_CACHE:-/var/cache/gmd/roots}
rm -rf "$cache"/.pkgcheck-"$suite".*  # left by an interrupted check (its overlay went with its mounts)
work=$(mktemp -d "$cache/.pkgcheck-$suite.XXXXXX") || { echo "FAIL: mktemp in $cache"; exit 1; }
mkdir -p "$work/upper" "$work/work" "$work/mnt"
mnt=$work/mnt

# The overlay is mounted where the soft-RoCE VM sees it (a session VM started before it does too), and
# unmounted whatever happens; dpkg runs in a private mount namespace with /proc, /sys and /dev.
mount -t overlay overlay -o "lowerdir=$root,upperdir=$work/upper,workdir=$work/work" "$mnt" ||
  { echo "FAIL: cannot mount an overlay of $root"; rm -rf "$work"; exit 1; }
trap 'umount "$mnt" 2>/dev/null || umount -l "$mnt"; rm -rf "$work"' EXIT
in_mnt() {
  unshare -m bash -c 'mount --make-rprivate / && for m in proc sys dev dev/pts; do
      mount --bind "/$m" "$1/$m" || exit 1; done && shift && exec chroot "$0" "$@"' "$mnt" "$mnt" "$@"
}
cp "$deb" "$mnt/tmp/" || exit 1
fail=0
if ! in_mnt dpkg -i "/tmp/${deb##*/}" >"$work/dpkg.log" 2>&1; then
  echo "FAIL: dpkg -i ${deb##*/} into the $ucx root:"; tail -n 5 "$work/dpkg.log"; exit 1
fi
rm -f "$mnt/tmp/${deb##*/}"
depends=$(in_mnt dpkg-query -W -f='${Depends}' ucx-gmd)
next=$((minor + 1))
[[ $depends == *"(<< 1.$next~)"* ]] ||
  { echo "FAIL: the package does not pin UCX 1.$minor: Depends: $depends"; fail=1; }
lib=$(in_mnt dpkg -L ucx-gmd | grep '/ucx/libuct_gmd.so$')
[[ -n $lib ]] || { echo "FAIL: the package has no <libdir>/ucx/libuct_gmd.so"; exit 1; }
gmd_has '^/usr/share/doc/ucx-gmd/README.md$' "$(in_mnt dpkg -L ucx-gmd)" ||
  { echo "FAIL: no README.md in /usr/share/doc/ucx-gmd"; fail=1; }
if ((minor >= 22)); then load=""; how="nothing set"; else load="LD_PRELOAD=$lib"; how="LD_PRELOAD=$lib"; fi
cd "$GMD_SRC" || exit 1
out=$(GMD_VM_ROOT=$mnt gtest/rxe/run-in-vm -- sh -c "$load ucx_info -d" 2>&1)
rc=$?
((rc == 0)) || { echo "FAIL: ucx_info -d in the VM exited $rc"; echo "$out" | tail -n 5; fail=1; }
gmd=$(echo "$out" | awk '/Component: gmd/{g=1} /Component:/&&!/gmd/{g=0} g' )
for d in rxe0 rxe1; do
  gmd_has "Memory domain: $d\$" "$(grep -B1 'Component: gmd' <<<"$out")" ||
    { echo "FAIL: ucx_info -d lists no gmd memory domain $d"; fail=1; }
done
gmd_has 'Transport: gmd_rc' "$gmd" || { echo "FAIL: ucx_info -d lists no gmd_rc"; fail=1; }
((fail == 0)) && echo "PASS: ${deb##*/} installed into a clean UCX $ucx root ($depends);" \
  "ucx_info -d with $how lists gmd on rxe0, rxe1 with gmd_rc"
exit $fail
