// Two MPI ranks exchange CUDA device buffers, as a CUDA-aware MPI program does: the pointers handed to
// MPI are device pointers (cuMemAlloc), and the program never touches device memory with the CPU. It
// uses the CUDA driver API only (cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent,
// cuMemAlloc_v2, cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemFree_v2), linked as any CUDA program is, so
// the test driver serves it exactly as a real driver would.
//
//  1. MPI_Send/MPI_Recv (rank 0 to 1), MPI_Isend/MPI_Irecv (1 to 0) and MPI_Sendrecv (both ways) of
//     device buffers from 1 B to MAX_BYTES at odd sizes and at an odd offset into the allocation:
//     every protocol UCP has (eager short, bcopy, zcopy, rendezvous, pipelines). Receive buffers are
//     poisoned through the driver first; every byte is checked after a copy back to the host.
//  2. The stale-address scenario, both sides: send from a device buffer into a device buffer, free
//     both (cuMemFree), allocate again (the driver hands back the same addresses), new contents, send
//     again: the new bytes must arrive, at eager and rendezvous sizes. A registration cache that
//     kept the old allocation's handle sends the old bytes, or delivers into pages nobody maps.
//
// Usage: gmd_mpi_cuda_exchange [MAX_BYTES [REALLOC_ROUNDS]]   (defaults 16 MiB, 4)
// Exit status 0 when every byte of every exchange matched.
#include <cuda.h>
#include <mpi.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pattern.h"

namespace {

using gmd::mpi_test::checkPattern;
using gmd::mpi_test::fillPattern;
using gmd::mpi_test::patternByte;

int g_rank = 0;

[[noreturn]] void die(const char* what, long detail = 0) {
  std::fprintf(stderr, "rank %d: FAIL: %s (%ld)\n", g_rank, what, detail);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

void cu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) die(what, static_cast<long>(r));
}

void mpi(int r, const char* what) {
  if (r != MPI_SUCCESS) die(what, r);
}

// The seed of the message rank `from` sends in exchange `tag` (gtest/mpi/pattern.h).
std::uint64_t seedOf(int from, std::uint64_t tag) {
  return (static_cast<std::uint64_t>(from + 1) << 56) ^ (tag << 24);
}

// Writes the pattern into device memory through the driver.
void fillDevice(CUdeviceptr dst, std::size_t len, int from, std::uint64_t tag,
                std::vector<std::uint8_t>& host) {
  host.resize(len);
  fillPattern(host.data(), len, seedOf(from, tag));
  if (len > 0) cu(cuMemcpyHtoD(dst, host.data(), len), "cuMemcpyHtoD (fill)");
}

void poisonDevice(CUdeviceptr dst, std::size_t len, std::vector<std::uint8_t>& host) {
  host.assign(len, 0xa5);
  if (len > 0) cu(cuMemcpyHtoD(dst, host.data(), len), "cuMemcpyHtoD (poison)");
}

// Copies device memory back and checks it; returns the offset of the first wrong byte, or len.
std::size_t checkDevice(CUdeviceptr src, std::size_t len, int from, std::uint64_t tag,
                        std::vector<std::uint8_t>& host) {
  host.assign(len, 0);
  if (len > 0) cu(cuMemcpyDtoH(host.data(), src, len), "cuMemcpyDtoH (check)");
  return checkPattern(host.data(), len, seedOf(from, tag));
}

void expectPattern(CUdeviceptr buf, std::size_t len, int from, std::uint64_t tag, const char* what,
                   std::vector<std::uint8_t>& host) {
  const std::size_t bad = checkDevice(buf, len, from, tag, host);
  if (bad != len) {
    std::fprintf(stderr,
                 "rank %d: FAIL: %s of %zu bytes (tag %" PRIu64 "): byte %zu is 0x%02x, want 0x%02x\n",
                 g_rank, what, len, tag, bad, host[bad], patternByte(seedOf(from, tag), bad));
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // As CUDA-aware applications do: the device and its context first, then MPI.
  cu(cuInit(0), "cuInit");
  CUdevice dev = 0;
  cu(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx = nullptr;
  cu(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  cu(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");

  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) die("needs exactly 2 ranks", size);
  const int peer = 1 - g_rank;
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (16u << 20);
  const int realloc_rounds = argc > 2 ? std::atoi(argv[2]) : 4;

  // Sizes: powers of two and their odd neighbours, 1 B to max_bytes.
  std::vector<std::size_t> sizes;
  for (std::size_t s = 1; s <= max_bytes; s *= 4) {
    sizes.push_back(s);
    if (s > 4 && s + 13 <= max_bytes) sizes.push_back(s + 13);
    if (s > 4) sizes.push_back(s - 3);
  }
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  constexpr std::size_t kOffset = 3;  // odd offset into the allocation

  std::vector<std::uint8_t> host;
  CUdeviceptr sbuf = 0, rbuf = 0;
  cu(cuMemAlloc(&sbuf, max_bytes + kOffset), "cuMemAlloc (send)");
  cu(cuMemAlloc(&rbuf, max_bytes + kOffset), "cuMemAlloc (recv)");

  // 1. Every size, three calling styles.
  std::uint64_t tag = 1;
  unsigned exchanges = 0;
  for (const std::size_t len : sizes) {
    for (int style = 0; style < 3; ++style, ++tag) {
      const std::size_t off = (tag % 2) ? kOffset : 0;
      const CUdeviceptr s = sbuf + off, r = rbuf + off;
      void* sp = reinterpret_cast<void*>(s);
      void* rp = reinterpret_cast<void*>(r);
      const int itag = static_cast<int>(tag % 30000);
      fillDevice(s, len, g_rank, tag, host);
      poisonDevice(r, len, host);
      const int n = static_cast<int>(len);
      if (style == 0) {  // blocking, rank 0 to rank 1
        if (g_rank == 0) {
          mpi(MPI_Send(sp, n, MPI_BYTE, peer, itag, MPI_COMM_WORLD), "MPI_Send");
        } else {
          mpi(MPI_Recv(rp, n, MPI_BYTE, peer, itag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
          expectPattern(r, len, peer, tag, "MPI_Recv", host);
        }
      } else if (style == 1) {  // non-blocking, rank 1 to rank 0
        MPI_Request req;
        if (g_rank == 1) {
          mpi(MPI_Isend(sp, n, MPI_BYTE, peer, itag, MPI_COMM_WORLD, &req), "MPI_Isend");
        } else {
          mpi(MPI_Irecv(rp, n, MPI_BYTE, peer, itag, MPI_COMM_WORLD, &req), "MPI_Irecv");
        }
        mpi(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
        if (g_rank == 0) expectPattern(r, len, peer, tag, "MPI_Irecv", host);
      } else {  // both ways at once
        mpi(MPI_Sendrecv(sp, n, MPI_BYTE, peer, itag, rp, n, MPI_BYTE, peer, itag, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
        expectPattern(r, len, peer, tag, "MPI_Sendrecv", host);
      }
      ++exchanges;
    }
  }
  std::printf("rank %d: %u device-buffer exchanges of %zu sizes (1 to %zu bytes) verified\n", g_rank,
              exchanges, sizes.size(), max_bytes);

  // 2. Free and allocate again at the same address, new contents, send again (eager and
  //    rendezvous sizes; each side frees and reallocates both its buffers).
  const std::size_t realloc_sizes[] = {64, 8192 + 5, 1u << 20};
  unsigned same_address = 0, rounds = 0;
  for (const std::size_t len : realloc_sizes) {
    if (len > max_bytes) continue;
    for (int round = 0; round < realloc_rounds; ++round, ++tag, ++rounds) {
      const CUdeviceptr old_s = sbuf, old_r = rbuf;
      cu(cuMemFree(sbuf), "cuMemFree (send)");
      cu(cuMemFree(rbuf), "cuMemFree (recv)");
      cu(cuMemAlloc(&sbuf, max_bytes + kOffset), "cuMemAlloc (send again)");
      cu(cuMemAlloc(&rbuf, max_bytes + kOffset), "cuMemAlloc (recv again)");
      if (sbuf == old_s && rbuf == old_r) ++same_address;
      fillDevice(sbuf, len, g_rank, tag, host);
      poisonDevice(rbuf, len, host);
      const int itag = static_cast<int>(tag % 30000);
      mpi(MPI_Sendrecv(reinterpret_cast<void*>(sbuf), static_cast<int>(len), MPI_BYTE, peer, itag,
                       reinterpret_cast<void*>(rbuf), static_cast<int>(len), MPI_BYTE, peer, itag,
                       MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Sendrecv (after reallocation)");
      expectPattern(rbuf, len, peer, tag, "MPI_Sendrecv after cuMemFree + cuMemAlloc", host);
    }
  }
  std::printf("rank %d: %u exchanges after cuMemFree + cuMemAlloc verified (%u at the same "
              "addresses)\n",
              g_rank, rounds, same_address);

  cu(cuMemFree(sbuf), "cuMemFree");
  cu(cuMemFree(rbuf), "cuMemFree");
  MPI_Finalize();
  return 0;
}
