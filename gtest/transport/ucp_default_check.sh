#!/bin/bash
# UCP's own transport selection (UCX_TLS unset) with gmd preloaded, on every RDMA device: some
# endpoint lane is gmd_rc and none is another RDMA transport's; and with UCX_UNIFIED_MODE=y (the only
# mode in which UCP prunes dominated ifaces), where UCX has its rc_verbs, UCP closes it because gmd_rc
# dominates it (a superset of its capability flags, the same latency, bandwidth and overhead, a
# higher priority: docs/transport.md, "Selection"). Where UCX has no rc_verbs (Debian unstable's UCX
# 1.23 is built without verbs transports) only the lanes are checked.
# Usage: ucp_default_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
ulimit -l unlimited 2>/dev/null
devs=($(ls /sys/class/infiniband 2>/dev/null))
((${#devs[@]} > 0)) || { echo "FAIL: no RDMA devices"; exit 1; }
unset UCX_TLS
version=$(ucx_info -v | head -n 1 | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)
fail=0
for d in "${devs[@]}"; do
  dev=$d:1
  # ucx_info -e connects a worker to itself; the debug log says which ifaces UCP closed and why.
  out=$(LD_PRELOAD=$plugin UCX_LOG_LEVEL=debug UCX_NET_DEVICES=$dev timeout 120 ucx_info -e -u t 2>&1)
  if ! echo "$out" | grep -Eq "lane\[[0-9]+\]:.*gmd_rc/$dev"; then
    echo "FAIL: UCX $version, $dev: no endpoint lane on gmd_rc"
    echo "$out" | grep -E 'lane\[|ERROR' | head -n 10
    fail=1
  fi
  if echo "$out" | grep -E 'lane\[' | grep -Eq '(rc_verbs|ud_verbs|rc_mlx5|ud_mlx5|dc_mlx5)/'; then
    echo "FAIL: UCX $version, $dev: a lane on another RDMA transport:"
    echo "$out" | grep -E 'lane\[' | grep -E '(rc_verbs|ud_verbs|rc_mlx5|ud_mlx5|dc_mlx5)/' | head -n 5
    fail=1
  fi
  if ucx_info -d 2>/dev/null | grep -Eq 'Transport: rc_verbs'; then
    out=$(LD_PRELOAD=$plugin UCX_UNIFIED_MODE=y UCX_LOG_LEVEL=debug UCX_NET_DEVICES=$dev \
          timeout 120 ucx_info -e -u t 2>&1)
    closed=$(echo "$out" | grep -Eo "closing resource\[[0-9]+\] rc_verbs/$dev, since resource\[[0-9]+\] [a-z_0-9]+/$dev is better" | head -n 1)
    if [[ $closed != *"gmd_rc/$dev is better" ]]; then
      echo "FAIL: UCX $version, $dev: UCP kept rc_verbs (gmd_rc does not dominate it)${closed:+: $closed}"
      fail=1
    else
      echo "UCX $version, $dev: $closed"
    fi
  else
    echo "UCX $version, $dev: UCX has no rc_verbs here; lanes checked only"
  fi
  echo "$out" | grep -E '^#.*lane\[' | sed "s/^#  */    $dev: /"
done
[ $fail -eq 0 ] && echo "PASS: UCX $version with UCX_TLS unset puts every RDMA lane on gmd_rc"
exit $fail
