#!/bin/sh
# ucx_info with gmd preloaded and the fake CUDA driver: component gmd_copy with MD gmd_cuda, and
# transport gmd_copy on device cuda (an accelerator); with a driver that reports no device, the
# component is there without a memory domain.
# Usage: ucx_info_copy_check.sh PATH/TO/libuct_gmd.so FAKE_DRIVER NODEVICE_FAKE_DRIVER
set -u
plugin=$1 fake=$2 nodevice=$3
fail=0
out=$(GMD_CUDA_DRIVER_PATH=$fake LD_PRELOAD=$plugin ucx_info -d 2>&1)
# "Memory domain: NAME" comes right before its "Component:" line.
echo "$out" | grep -B1 'Component: gmd_copy$' | grep -q 'Memory domain: gmd_cuda$' ||
  { echo "FAIL: ucx_info -d does not list MD gmd_cuda of component gmd_copy"; fail=1; }
copy_out=$(echo "$out" | awk '/Memory domain: gmd_cuda$/{g=1; print; next} /Memory domain:/{g=0} g')
echo "$copy_out" | grep -q 'Transport: gmd_copy$' || { echo "FAIL: no transport gmd_copy"; fail=1; }
echo "$copy_out" | grep -q 'Device: cuda$' || { echo "FAIL: gmd_copy is not on device cuda"; fail=1; }
echo "$copy_out" | grep -q 'Type: accelerator$' || { echo "FAIL: device cuda is not an accelerator"; fail=1; }
echo "$copy_out" | sed -n '1,30p'

none=$(GMD_CUDA_DRIVER_PATH=$nodevice LD_PRELOAD=$plugin ucx_info -d 2>&1)
if echo "$none" | grep -q 'Memory domain: gmd_cuda$'; then
  echo "FAIL: MD gmd_cuda listed with a driver that has no device"; fail=1
fi
[ $fail -eq 0 ] && echo "PASS: ucx_info lists gmd_copy (MD gmd_cuda, device cuda) with a CUDA device only"
exit $fail
