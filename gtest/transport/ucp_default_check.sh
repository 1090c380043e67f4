#!/bin/bash
# UCP's own transport selection (UCX_TLS unset) with gmd preloaded, on every RDMA device, for a peer
# on another host (ucx_info -e -P inter: the peer worker's address holds only inter-node transports):
# some endpoint lane is gmd_rc and none is another RDMA transport's, by default and with
# UCX_UNIFIED_MODE=y (the only mode in which UCP prunes dominated ifaces). In unified mode:
#  - where UCX has its rc_verbs on the device, UCP closes it because gmd_rc dominates it (a superset of
#    its capability flags, the same latency, bandwidth and overhead, a higher priority:
#    docs/transport.md, "Selection");
#  - where UCX has no transport of its own on the device (Debian unstable's UCX 1.23 is built without
#    verbs transports), gmd_rc is the only one listed there and UCP closes nothing on it.
# Usage: ucp_default_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
source "$(dirname "${BASH_SOURCE[0]}")/perftest_server.sh"
perftest_setup || exit 1
unset UCX_TLS
version=$(ucx_info -v | head -n 1 | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)
rdma_tls='(rc_verbs|ud_verbs|rc_mlx5|ud_mlx5|dc_mlx5|gga_mlx5)'
fail=0

# transports_on DEVICE: the transports ucx_info -d lists for DEVICE, one a line
transports_on() {
  awk -v dev="$1" '/Transport:/ { tl = $3 } /Device:/ && $3 == dev { print tl }' | sort -u
}
plain=$(ucx_info -d 2>&1)
with=$(LD_PRELOAD=$plugin ucx_info -d 2>&1)

# lanes DEVICE MODE OUTPUT: the lanes in OUTPUT (ucx_info -e at debug level) are right for DEVICE
lanes() {
  local dev=$1 mode=$2 out=$3
  if ! echo "$out" | grep -Eq "lane\[[0-9]+\]:.*gmd_rc/$dev"; then
    echo "FAIL: UCX $version, $dev ($mode): no endpoint lane on gmd_rc"
    echo "$out" | grep -E 'lane\[|ERROR' | head -n 10
    fail=1
  fi
  if echo "$out" | grep -E 'lane\[' | grep -Eq "$rdma_tls/"; then
    echo "FAIL: UCX $version, $dev ($mode): a lane on another RDMA transport:"
    echo "$out" | grep -E 'lane\[' | grep -E "$rdma_tls/" | head -n 5
    fail=1
  fi
  echo "$out" | grep -E '^#.*lane\[' | sed "s/^#  */    $dev ($mode): /"
}

for d in "${devs[@]}"; do
  dev=$d:1
  own=$(echo "$plain" | transports_on "$dev" | tr '\n' ' ')
  listed=$(echo "$with" | transports_on "$dev" | tr '\n' ' ')
  echo "UCX $version, $dev: UCX's own transports: ${own:-none}; with gmd: ${listed:-none}"
  # ucx_info -e connects a worker to a second one; the debug log says which ifaces UCP closed and why.
  out=$(LD_PRELOAD=$plugin UCX_LOG_LEVEL=debug UCX_NET_DEVICES=$dev timeout 120 ucx_info -e -u t -P inter 2>&1)
  lanes "$dev" default "$out"
  out=$(LD_PRELOAD=$plugin UCX_UNIFIED_MODE=y UCX_LOG_LEVEL=debug UCX_NET_DEVICES=$dev \
        timeout 120 ucx_info -e -u t -P inter 2>&1)
  lanes "$dev" unified "$out"
  if [[ " $own " == *" rc_verbs "* ]]; then
    closed=$(echo "$out" | grep -Eo "closing resource\[[0-9]+\] rc_verbs/$dev, since resource\[[0-9]+\] [a-z_0-9]+/$dev is better" | head -n 1)
    if [[ $closed != *"gmd_rc/$dev is better" ]]; then
      echo "FAIL: UCX $version, $dev: UCP kept rc_verbs (gmd_rc does not dominate it)${closed:+: $closed}"
      fail=1
    else
      echo "UCX $version, $dev: $closed"
    fi
  elif [[ -z $own ]]; then
    # Nothing of UCX's own to close: gmd_rc must be alone on the device and stay open.
    if [[ $listed != "gmd_rc " ]]; then
      echo "FAIL: UCX $version, $dev: UCX has no transport of its own here, but with gmd: ${listed:-none}"
      fail=1
    elif echo "$out" | grep -Eq "closing resource\[[0-9]+\] gmd_rc/$dev"; then
      echo "FAIL: UCX $version, $dev: UCP closed gmd_rc: $(echo "$out" | grep -Eo "closing resource.*gmd_rc/${dev}[^,]*, since [^ ]+ [^ ]+" | head -n 1)"
      fail=1
    else
      echo "UCX $version, $dev: UCX has no transport of its own; gmd_rc alone, kept open"
    fi
  else
    echo "FAIL: UCX $version, $dev: UCX has transports here but no rc_verbs to compare with: $own"
    fail=1
  fi
done
[ $fail -eq 0 ] && echo "PASS: UCX $version with UCX_TLS unset puts every RDMA lane on gmd_rc"
exit $fail
