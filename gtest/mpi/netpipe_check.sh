#!/bin/bash
# NetPIPE (Debian's netpipe-openmpi, NPopenmpi) over Open MPI's pml ucx with UCX_TLS=gmd_rc,self, in
# integrity mode (-i: every message's contents checked) from 1 B to 8 MiB. Rank 0 on the first RDMA
# device, rank 1 on the last. Passes when every size reported "Integrity check passed", none failed,
# and the sizes reached 8 MiB.
# Usage: netpipe_check.sh PATH/TO/libuct_gmd.so
set -u
plugin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/mpi_setup.sh"
mpi_setup NPopenmpi netpipe-openmpi || exit 1
np=$(command -v NPopenmpi)
work=$(mktemp -d) || { echo "FAIL: mktemp"; exit 1; }
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export LD_PRELOAD=$plugin UCX_TLS=${UCX_TLS:-gmd_rc,self}
# NetPIPE stops a sweep once one ping-pong takes more than a second, which in the emulated VM happens
# after a few MiB: each further run starts where the last one stopped, until 8 MiB is checked.
fail=0 sizes=0 passed=0 largest=0 lower=1
for attempt in 1 2 3 4 5 6; do
  out=$(timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx \
          --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self \
          -x LD_PRELOAD -x UCX_TLS "$here/mpi_check.sh" --rank "$np" -i -n 3 -l "$lower" -u 8388611 2>&1)
  rc=$?
  n=$(echo "$out" | grep -c 'bytes .* times -->')
  p=$(echo "$out" | grep -c 'Integrity check passed')
  top=$(echo "$out" | awk '/Integrity check passed/ { n = $2 } END { print n + 0 }')
  echo "run $attempt from $lower B: $p of $n sizes passed, up to $top B"
  ((rc == 0)) || { echo "FAIL: mpirun exited $rc"; echo "$out" | tail -n 5; fail=1; break; }
  ((n > 0 && p == n)) || { echo "FAIL: $p of $n sizes passed the integrity check"; fail=1; break; }
  sizes=$((sizes + n)) passed=$((passed + p))
  ((top > largest)) && largest=$top
  ((largest >= 8388608)) && break
  lower=$((largest * 3 / 2))
  ((lower > 8388608)) && lower=8388608
done
((fail != 0 || largest >= 8388608)) || { echo "FAIL: largest size checked $largest, not 8 MiB"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: NetPIPE over UCX_TLS=$UCX_TLS: $passed sizes, 1 B to $largest B, every one verified"
exit $fail
