#!/bin/bash
# Open MPI one-sided communication (osc ucx) over gmd_rc alone (UCX_TLS=gmd_rc,self, or $UCX_TLS):
# gtest/mpi/mpi_osc.cc on two ranks, rank 0 on the first RDMA device, rank 1 on the last (rxe0 and
# rxe1 in the soft-RoCE VM; gtest/mpi/mpi_check.sh --rank picks them). Passes when both ranks
# verified every Put, Get, Accumulate, Fetch_and_op and Compare_and_swap result, with fence and with
# lock/unlock, and gmd's counters show that gmd registered memory.
# Usage: mpi_osc_check.sh PATH/TO/libuct_gmd.so PATH/TO/gmd_mpi_osc [ROUNDS]
set -u
plugin=$1
prog=$2
shift 2
source "$(dirname "$0")/mpi_setup.sh"
mpi_setup mpirun openmpi-bin || exit 1
export LD_PRELOAD=$plugin UCX_TLS=${UCX_TLS:-gmd_rc,self} UCX_GMD_PRINT_STATS=y
out=$(timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx --mca osc ucx \
        --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self \
        -x LD_PRELOAD -x UCX_TLS -x UCX_GMD_PRINT_STATS \
        "$(dirname "$0")/mpi_check.sh" --rank "$prog" "$@" 2>&1)
rc=$?
echo "$out"
fail=0
((rc == 0)) || { echo "FAIL: mpirun exited $rc$( ((rc == 124)) && echo ' (stalled)')"; fail=1; }
(($(echo "$out" | grep -c '^osc: rank [01]: [1-9][0-9]* checks verified') == 2)) ||
  { echo "FAIL: not both ranks verified their one-sided results"; fail=1; }
echo "$out" | grep -Eq '^gmd [^ ]+: reg_hits=[0-9]+ reg_misses=[1-9]' ||
  { echo "FAIL: gmd's counters show no registrations (gmd did not carry the windows)"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: MPI one-sided (osc ucx) over UCX_TLS=$UCX_TLS verified every result"
exit $fail
