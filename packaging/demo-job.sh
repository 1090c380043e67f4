#!/usr/bin/env bash
# What packaging/demo.sh runs where the RDMA devices are: UCX lists gmd, then data moves through
# gmd's registrations and gmd prints its counters. Usage: demo-job.sh BUILD_DIR
set -euo pipefail
build=$1
plugin=$build/md/libuct_gmd.so
export LD_PRELOAD=$plugin

echo "==> ucx_info -d with gmd loaded (component gmd)"
ucx_info -d | awk '/Component: gmd/{g=1} /Component:/&&!/gmd/{g=0} g'

echo "==> RDMA WRITE/READ between devices through gmd registrations (UCX_GMD_PRINT_STATS=y)"
unset LD_PRELOAD
UCX_GMD_PRINT_STATS=y "$build/gtest/md/gmd_md_rxe_test" --gtest_filter='GmdRdma.*:GmdMd.SeedScenario*'
