// Registration-dominated transfer rate: rank 1 sends MESSAGE_BYTES to rank 0 ITERATIONS times, either
// from and into the same two buffers every time ("reuse": every registration after the first is a
// cache hit) or from and into buffers mapped fresh for each message and unmapped after it ("fresh":
// every message registers new pages on both sides and every unmap invalidates a registration).
// A benchmark, not a test: it prints one line with the time per message and the bandwidth, measured
// by rank 0 between two barriers. Every received message is spot-checked (one byte per page).
//
// Usage: gmd_mpi_fresh_buffers reuse|fresh [MESSAGE_BYTES [ITERATIONS]]   (defaults 1 MiB, 50)
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

[[noreturn]] void die(int rank, const char* what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, what);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

std::uint8_t* mapBuffer(std::size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::uint8_t*>(p);
}

std::uint8_t byteOf(int iter, std::size_t offset) {
  return static_cast<std::uint8_t>(iter * 131 + offset / 4096 * 7 + 1);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks != 2) die(rank, "needs exactly 2 ranks");
  if (argc < 2 || (std::strcmp(argv[1], "reuse") != 0 && std::strcmp(argv[1], "fresh") != 0)) {
    die(rank, "usage: gmd_mpi_fresh_buffers reuse|fresh [MESSAGE_BYTES [ITERATIONS]]");
  }
  const bool fresh = std::strcmp(argv[1], "fresh") == 0;
  const std::size_t len = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : (1u << 20);
  const int iters = argc > 3 ? std::atoi(argv[3]) : 50;
  if (len == 0 || len > (1ull << 31) - 1 || iters <= 0) die(rank, "bad message size or count");
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

  std::uint8_t* kept = fresh ? nullptr : mapBuffer(len);
  if (!fresh && kept == nullptr) die(rank, "mmap failed");
  const int warmup = 2;
  double start = 0;
  for (int i = -warmup; i < iters; ++i) {
    if (i == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
    }
    std::uint8_t* buf = fresh ? mapBuffer(len) : kept;
    if (buf == nullptr) die(rank, "mmap failed");
    const int tag = i + warmup;
    if (rank == 1) {
      for (std::size_t off = 0; off < len; off += page) buf[off] = byteOf(tag, off);
      MPI_Send(buf, static_cast<int>(len), MPI_BYTE, 0, tag, MPI_COMM_WORLD);
    } else {
      for (std::size_t off = 0; off < len; off += page) buf[off] = 0;  // fault the pages in
      MPI_Recv(buf, static_cast<int>(len), MPI_BYTE, 1, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (std::size_t off = 0; off < len; off += page) {
        if (buf[off] != byteOf(tag, off)) die(rank, "received bytes differ from those sent");
      }
    }
    if (fresh) munmap(buf, len);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double secs = MPI_Wtime() - start;
  if (rank == 0) {
    std::printf("%s buffers: %d messages of %zu bytes: %.1f us per message, %.2f MB/s\n",
                fresh ? "fresh" : "reused", iters, len, secs / iters * 1e6,
                static_cast<double>(len) * iters / secs / 1e6);
  }
  if (kept != nullptr) munmap(kept, len);
  MPI_Finalize();
  return 0;
}
