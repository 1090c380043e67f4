#!/bin/sh
# ucx_info with gmd preloaded: component gmd with one MD per RDMA device, each gmd_rc resource's
# system device (unknown on virtual devices), and the UCX_GMD_* variables.
# Usage: ucx_info_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
fail=0
devices=$(ls /sys/class/infiniband 2>/dev/null)
[ -n "$devices" ] || { echo "FAIL: no RDMA devices"; exit 1; }
out=$(LD_PRELOAD=$plugin ucx_info -d 2>&1)
echo "$out" | grep -q 'Component: gmd' || { echo "FAIL: ucx_info -d does not list component gmd"; fail=1; }
for d in $devices; do
  # Each "Memory domain: NAME" line comes right before its "Component:" line.
  echo "$out" | grep -B1 'Component: gmd$' | grep -q "Memory domain: $d\$" ||
    { echo "FAIL: no gmd memory domain $d"; fail=1; }
done
# Each gmd_rc resource shows its system device: the NIC's PCI function, unknown for a virtual device.
gmd_out=$(echo "$out" | awk '/Component: gmd/{g=1} /Component:/&&!/gmd/{g=0} g')
for d in $devices; do
  sys=$(echo "$gmd_out" | awk -v dev="$d" '$2 == "Device:" && index($3, dev ":") == 1 { f = 1; next }
                                          f && /System device:/ { sub(/.*System device: /, ""); print; exit }')
  if [ -z "$sys" ]; then
    echo "FAIL: gmd_rc on $d shows no system device"; fail=1
  elif [ -e "/sys/class/infiniband/$d/device" ] && [ "$sys" = "<unknown>" ]; then
    echo "FAIL: gmd_rc on PCI device $d shows no system device"; fail=1
  elif [ ! -e "/sys/class/infiniband/$d/device" ] && [ "$sys" != "<unknown>" ]; then
    echo "FAIL: gmd_rc on virtual device $d shows system device $sys"; fail=1
  else
    echo "gmd_rc on $d: system device $sys"
  fi
done
echo "$gmd_out" | sed -n '1,40p'
cfg=$(LD_PRELOAD=$plugin ucx_info -c -f 2>&1)
for v in RCACHE_MAX_REGIONS RCACHE_MAX_SIZE RCACHE_MAX_UNUSED RCACHE_ADDR_ALIGN RCACHE_MEM_PRIO \
         RCACHE_OVERHEAD RCACHE_PURGE_ON_FORK CUDA_FREE_MODE DMABUF CUDA_MANAGED PRINT_STATS; do
  echo "$cfg" | grep -q "UCX_GMD_$v=" || { echo "FAIL: ucx_info -c does not show UCX_GMD_$v"; fail=1; }
done
echo "$cfg" | grep 'UCX_GMD_'
[ $fail -eq 0 ] && echo "PASS: ucx_info lists gmd with MDs: $(echo $devices)"
exit $fail
