#!/bin/bash
# Open MPI (pml ucx) with gmd loaded, two ranks exchanging CUDA device buffers
# (gtest/mpi/mpi_cuda_exchange.cc: the driver API only) through the test driver, every byte checked,
# rank 0 on the first RDMA device and rank 1 on the last.
#   GMD_MPI_CUDA_MODE=copy (default): the driver's device memory has no CPU access at all (a CPU touch
#     faults) and there is no GPUDirect: UCP must detect device memory and stage it through gmd_copy.
#   GMD_MPI_CUDA_MODE=peermem: the driver's device memory is CPU-accessible host pages and the guest
#     claims NVIDIA peer memory (a tmpfs over /sys/kernel/mm, in this command's own mount namespace),
#     so gmd registers device memory on the NIC as GPUDirect would: zero copy from device memory.
#   GMD_MPI_TLS=default: UCX_TLS unset (UCX's own selection) with shared memory left out, as between
#     two hosts; otherwise UCX_TLS=${UCX_TLS:-gmd_rc,gmd_copy,self}.
# Usage: mpi_cuda_check.sh PATH/TO/libuct_gmd.so PATH/TO/gmd_mpi_cuda_exchange FAKE_DRIVER_DIR [ARGS...]
set -u
plugin=$1
prog=$2
fake_dir=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/mpi_setup.sh"
mpi_setup mpirun openmpi-bin || exit 1
[[ -e $fake_dir/libcuda.so.1 ]] || { echo "FAIL: no test driver in $fake_dir"; exit 1; }
mode=${GMD_MPI_CUDA_MODE:-copy}
export LD_PRELOAD=$plugin UCX_GMD_PRINT_STATS=y UCX_GMD_COPY_PRINT_STATS=y
export LD_LIBRARY_PATH=$fake_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
case $mode in
  copy)
    export GMD_FAKE_CUDA_CPU_ACCESS=0 UCX_GMD_DMABUF=off ;;
  peermem)
    export GMD_FAKE_CUDA_CPU_ACCESS=1 UCX_GMD_DMABUF=off
    if [[ ! -d /sys/kernel/mm/memory_peers/nv_mem ]]; then
      # Only ever inside the test VM's per-command mount namespace (run-in-vm): never on a host.
      [[ -n ${GMD_VM_RESULTS:-} ]] || { echo "FAIL: peermem mode fakes sysfs: only inside the test VM"; exit 1; }
      mount -t tmpfs gmd-peermem /sys/kernel/mm && mkdir -p /sys/kernel/mm/memory_peers/nv_mem ||
        { echo "FAIL: cannot fake the peer-memory marker"; exit 1; }
    fi ;;
  *) echo "FAIL: GMD_MPI_CUDA_MODE=$mode (copy or peermem)"; exit 1 ;;
esac
env_args=(-x LD_PRELOAD -x LD_LIBRARY_PATH -x UCX_GMD_PRINT_STATS -x UCX_GMD_COPY_PRINT_STATS
          -x GMD_FAKE_CUDA_CPU_ACCESS -x UCX_GMD_DMABUF)
if [[ ${GMD_MPI_TLS:-} == default ]]; then
  unset UCX_TLS
  export UCX_SHM_DEVICES=
  env_args+=(-x UCX_SHM_DEVICES)
else
  export UCX_TLS=${UCX_TLS:-gmd_rc,gmd_copy,self}
  env_args+=(-x UCX_TLS)
fi
for v in UCX_MEMTYPE_CACHE UCX_PROTO_ENABLE UCX_RNDV_THRESH UCX_RNDV_SCHEME UCX_LOG_LEVEL \
         UCX_GMD_CUDA_EVENTS; do
  [[ -v $v ]] && env_args+=(-x "$v")
done
out=$(timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx \
        --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self "${env_args[@]}" \
        "$here/mpi_check.sh" --rank "$prog" "$@" 2>&1)
rc=$?
echo "$out"
fail=0
((rc == 0)) || { echo "FAIL: mpirun exited $rc"; fail=1; }
(($(echo "$out" | grep -c 'device-buffer exchanges of .* verified') == 2)) ||
  { echo "FAIL: not both ranks verified their device-buffer exchanges"; fail=1; }
(($(echo "$out" | grep -c 'exchanges after cuMemFree + cuMemAlloc verified') == 2)) ||
  { echo "FAIL: not both ranks verified the exchanges after reallocation"; fail=1; }
# Who moved the device bytes: gmd_copy's counters (bytes it copied between host and device memory)
# and gmd's GPUDirect registrations, summed over both ranks.
copied=$(echo "$out" | sed -n 's/^gmd_copy [0-9a-f]*: short_bytes=\([0-9]*\) zcopy_bytes=\([0-9]*\).*/\1 \2/p' |
         awk '{s += $1 + $2} END {print s + 0}')
gpudirect=$(echo "$out" | sed -n 's/^gmd .* gpudirect_dmabuf_regs=\([0-9]*\) gpudirect_peermem_regs=\([0-9]*\).*/\1 \2/p' |
            awk '{s += $1 + $2} END {print s + 0}')
echo "device bytes copied by gmd_copy: $copied; GPUDirect registrations: $gpudirect"
if [[ $mode == copy ]]; then
  # No GPUDirect: every device byte sent or received went through gmd_copy (at least the largest
  # message, both ways), and nothing registered device memory on the NIC.
  ((copied >= 2 * 16 * 1024 * 1024)) ||
    { echo "FAIL: gmd_copy copied $copied bytes: device memory did not go through it"; fail=1; }
  ((gpudirect == 0)) || { echo "FAIL: $gpudirect GPUDirect registrations without GPUDirect"; fail=1; }
else
  ((gpudirect > 0)) ||
    { echo "FAIL: no GPUDirect registration: device memory did not go zero-copy"; fail=1; }
fi
[ $fail -eq 0 ] &&
  echo "PASS: device buffers over UCX_TLS=${UCX_TLS-(unset)} ($mode mode): every byte verified, before and after cuMemFree + cuMemAlloc"
exit $fail
