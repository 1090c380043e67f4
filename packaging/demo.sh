#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine (as root): installs what it needs, builds gmd, loads it
# into UCX and moves data through it, printing gmd's counters. It runs on this machine's own RDMA
# devices when it has any, else inside the project's soft-RoCE VM (gtest/rxe/run-in-vm).
set -euo pipefail
source "$(dirname "$0")/common.sh"

gmd_install_deps
gmd_build "$GMD_BUILD" -DGMD_BUILD_BENCH=OFF
if gmd_have_rdma; then
  gmd_log "running on this machine's RDMA devices: $(ls /sys/class/infiniband | tr '\n' ' ')"
  exec "$GMD_SRC/packaging/demo-job.sh" "$GMD_BUILD"
fi
gmd_log "no RDMA device here: running inside the soft-RoCE VM (rxe0, rxe1)"
exec "$GMD_SRC/gtest/rxe/run-in-vm" -- "$GMD_SRC/packaging/demo-job.sh" "$GMD_BUILD"
