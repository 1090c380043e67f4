#!/usr/bin/env bash
# What packaging/demo.sh runs where the RDMA devices are: UCX lists gmd, then an Open MPI program
# moves all its data over UCX through gmd's transport alone (UCX_TLS=gmd_rc,self: active messages,
# rendezvous and wire-up over gmd_rc, no tcp), re-maps its buffers and checks every byte, and gmd
# prints its counters for the processes that moved data. Usage: demo-job.sh BUILD_DIR
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
plugin=$build/md/libuct_gmd.so

echo "==> ucx_info -d with gmd loaded: component gmd, its memory domains and transport"
LD_PRELOAD=$plugin ucx_info -d | awk '/Component: gmd/{g=1} /Component:/&&!/gmd/{g=0} g'

export UCX_TLS=gmd_rc,self
echo "==> Open MPI (pml ucx) with UCX_TLS=$UCX_TLS: every message, small and large, over gmd_rc;"
echo "    large messages verified, buffers re-mapped, gmd's counters of the ranks that moved data"
# Processes that only probed UCX (and registered nothing) print all-zero counter lines: drop them.
"$src/gtest/mpi/mpi_check.sh" "$plugin" "$build/gtest/mpi/gmd_mpi_remap_exchange" |
  awk '!/^gmd [^ ]+: reg_hits=0 reg_misses=0 /'
