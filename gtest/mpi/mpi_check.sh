#!/bin/bash
# Open MPI over UCX (pml ucx) with gmd loaded and UCX_TLS=gmd_rc,tcp,self (or $UCX_TLS; left unset
# with GMD_MPI_TLS=default: UCX's own selection): the two-rank remap exchange test. Rank 0 uses the
# first RDMA device, rank 1 the last (rxe0 and rxe1 in the soft-RoCE VM). Passes when the program
# verified every byte and gmd's counters show registration-cache hits (unless GMD_MPI_NEED_HITS=0:
# with sm in UCX_TLS both ranks of one host may move everything through shared memory). With UCX_TLS
# unset, UCX_SHM_DEVICES set empty leaves UCP the network transports, as between two hosts.
# Usage: mpi_check.sh PATH/TO/libuct_gmd.so PATH/TO/gmd_mpi_remap_exchange [PROGRAM ARGS...]
set -u
if [[ ${1:-} == --rank ]]; then
  # Per-rank wrapper: pick this rank's device and the netdev behind it.
  shift
  devs=($(ls /sys/class/infiniband))
  rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}  # Open MPI, MPICH (hydra)
  ((rank == 0)) && dev=${devs[0]} || dev=${devs[-1]}
  nd=$(rdma link show "$dev/1" 2>/dev/null | sed -n 's/.*netdev \([^ ]*\).*/\1/p')
  export UCX_NET_DEVICES=$dev:1${nd:+,$nd}
  exec "$@"
fi
plugin=$1
prog=$2
shift 2
source "$(dirname "$0")/mpi_setup.sh"
mpi_setup mpirun openmpi-bin || exit 1
export LD_PRELOAD=$plugin UCX_GMD_PRINT_STATS=y
tls_env=(-x UCX_TLS)
if [[ ${GMD_MPI_TLS:-} == default ]]; then
  unset UCX_TLS  # UCX's own selection (it must close rc_verbs for gmd_rc, never pick UD)
  tls_env=()
else
  export UCX_TLS=${UCX_TLS:-gmd_rc,tcp,self}
fi
# UCX_SHM_DEVICES set and empty: no shared-memory transport, as between ranks on two hosts.
[[ -v UCX_SHM_DEVICES ]] && tls_env+=(-x UCX_SHM_DEVICES)
out=$(timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx \
        --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self \
        -x LD_PRELOAD "${tls_env[@]}" -x UCX_GMD_PRINT_STATS \
        "$0" --rank "$prog" "$@" 2>&1)
rc=$?
echo "$out"
fail=0
((rc == 0)) || { echo "FAIL: mpirun exited $rc"; fail=1; }
(($(echo "$out" | grep -c 'exchanges of .* bytes verified') == 2)) ||
  { echo "FAIL: not both ranks verified their exchanges"; fail=1; }
# UCP from 1.16 caches registrations itself in front of the MD (gmd reports its memory types as
# cacheable, which UCP 1.18's datatype iterator requires): gmd then sees each buffer once, a miss.
ucx_minor=$(ucx_info -v | head -n 1 | grep -Eo '1\.[0-9]+' | head -n 1 | cut -d. -f2)
if [[ ${GMD_MPI_NEED_HITS:-1} != 0 ]]; then
  if ((${ucx_minor:-0} >= 16)); then
    echo "$out" | grep -Eq '^gmd [^ ]+: reg_hits=[0-9]+ reg_misses=[1-9]' ||
      { echo "FAIL: gmd's counters show no registrations (gmd did not carry the traffic)"; fail=1; }
  else
    echo "$out" | grep -Eq '^gmd [^ ]+: reg_hits=[1-9]' ||
      { echo "FAIL: gmd's counters show no registration hits (gmd did not carry the traffic)"; fail=1; }
  fi
fi
[ $fail -eq 0 ] && echo "PASS: MPI over UCX_TLS=${UCX_TLS-(unset)} verified every byte, before and after re-mapping"
exit $fail
