#!/bin/bash
# MPICH (Debian's mpich: ch4:ucx) with gmd loaded and UCX_TLS=gmd_rc,self: the two-rank remap exchange,
# built against MPICH, launched with MPICH's own mpirun.mpich (hydra). Rank 0 on the first RDMA
# device, rank 1 on the last (the --rank wrapper of mpi_check.sh). Passes when both ranks verified
# every byte and gmd's counters show registration hits.
# Usage: mpich_check.sh PATH/TO/libuct_gmd.so PATH/TO/gmd_mpich_remap_exchange [PROGRAM ARGS...]
set -u
plugin=$1
prog=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/mpi_setup.sh"
mpi_setup mpirun.mpich mpich || exit 1
tls=${UCX_TLS:-gmd_rc,self}
out=$(timeout 600 mpirun.mpich -np 2 -genv LD_PRELOAD "$plugin" -genv UCX_TLS "$tls" \
        -genv UCX_GMD_PRINT_STATS y "$here/mpi_check.sh" --rank "$prog" "$@" 2>&1)
rc=$?
echo "$out"
fail=0
((rc == 0)) || { echo "FAIL: mpirun.mpich exited $rc"; fail=1; }
(($(echo "$out" | grep -c 'exchanges of .* bytes verified') == 2)) ||
  { echo "FAIL: not both ranks verified their exchanges"; fail=1; }
echo "$out" | grep -Eq '^gmd [^ ]+: reg_hits=[1-9]' ||
  { echo "FAIL: gmd's counters show no registration hits (gmd did not carry the traffic)"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: MPICH ch4:ucx over UCX_TLS=$tls verified every byte, before and after re-mapping"
exit $fail
