#!/usr/bin/env bash
# What packaging/demo.sh runs where the RDMA devices are: UCX lists gmd, then an Open MPI program
# moves data over UCX through gmd's transport and registrations (UCX_TLS=gmd_rc,tcp,self), re-maps its
# buffers and checks every byte, and gmd prints its counters. Usage: demo-job.sh BUILD_DIR
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
plugin=$build/md/libuct_gmd.so

echo "==> ucx_info -d with gmd loaded: component gmd, its memory domains and transport"
LD_PRELOAD=$plugin ucx_info -d | awk '/Component: gmd/{g=1} /Component:/&&!/gmd/{g=0} g'

echo "==> Open MPI (pml ucx) over gmd_rc: large messages verified, buffers re-mapped, gmd's counters"
"$src/gtest/mpi/mpi_check.sh" "$plugin" "$build/gtest/mpi/gmd_mpi_remap_exchange"
