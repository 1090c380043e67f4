#!/bin/sh
# ucx_info with gmd preloaded and the fake CUDA driver.
#   present: component gmd_copy with MD gmd_cuda and transport gmd_copy on device cuda (an
#            accelerator); with NODEVICE_FAKE_DRIVER (a driver reporting no device), no MD.
#   absent:  a build with CUDA compiled out: component gmd_copy registered, without a memory domain.
# Usage: ucx_info_copy_check.sh present|absent PATH/TO/libuct_gmd.so FAKE_DRIVER [NODEVICE_FAKE_DRIVER]
set -u
mode=$1 plugin=$2 fake=$3 nodevice=${4:-}
fail=0
out=$(GMD_CUDA_DRIVER_PATH=$fake LD_PRELOAD=$plugin ucx_info -d 2>&1)
# The transport's variable is listed whenever the component is registered (with or without an MD).
GMD_CUDA_DRIVER_PATH=$fake LD_PRELOAD=$plugin ucx_info -c -f 2>&1 | grep -q '^UCX_GMD_COPY_MAX_OUTSTANDING=' ||
  { echo "FAIL: ucx_info -c does not show UCX_GMD_COPY_MAX_OUTSTANDING (component not registered?)"; fail=1; }
if [ "$mode" = absent ]; then
  if echo "$out" | grep -q 'Memory domain: gmd_cuda$'; then
    echo "FAIL: MD gmd_cuda listed though CUDA is compiled out"; fail=1
  fi
  [ $fail -eq 0 ] && echo "PASS: CUDA compiled out: component gmd_copy without a memory domain"
  exit $fail
fi
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
