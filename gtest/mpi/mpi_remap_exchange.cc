// Two MPI ranks exchange large messages (rendezvous range) many times and verify every byte; then each
// rank unmaps its buffers, maps new pages at the same addresses with new contents and exchanges again:
// the receiver must see the new contents (a registration cache that kept the old pages would deliver
// the old bytes, or write into pages nobody maps any more).
//
// Usage: gmd_mpi_remap_exchange [MESSAGE_BYTES [ROUNDS [REMAPS]]]   (defaults 4 MiB, 10, 4)
// Exit status 0 when every byte of every exchange matched.
#include <mpi.h>
#include <sys/mman.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pattern.h"

namespace {

using gmd::mpi_test::checkPattern;
using gmd::mpi_test::fillPattern;
using gmd::mpi_test::patternByte;

// The seed of the message rank `from` sends in exchange `tag` (gtest/mpi/pattern.h).
std::uint64_t seedOf(int from, std::uint64_t tag) {
  return (static_cast<std::uint64_t>(from) << 56) ^ (tag << 32);
}

std::uint8_t* mapAt(void* where, std::size_t len) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (where != nullptr ? MAP_FIXED : 0);
  void* p = mmap(where, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::uint8_t*>(p);
}

[[noreturn]] void die(int rank, const char* what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, what);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) die(rank, "needs exactly 2 ranks");
  const std::size_t len = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (4u << 20);
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
  const int remaps = argc > 3 ? std::atoi(argv[3]) : 4;
  if (len < 1 || len > (1ull << 31) - 1 || rounds < 1 || remaps < 0) die(rank, "bad arguments");
  const int peer = 1 - rank;

  std::uint8_t* sbuf = mapAt(nullptr, len);
  std::uint8_t* rbuf = mapAt(nullptr, len);
  if (sbuf == nullptr || rbuf == nullptr) die(rank, "mmap");

  std::uint64_t tag = 0;
  long exchanges = 0;
  for (int cycle = 0; cycle <= remaps; ++cycle) {
    if (cycle > 0) {
      // New pages at the same addresses; the old contents are gone for good.
      if (munmap(sbuf, len) != 0 || munmap(rbuf, len) != 0) die(rank, "munmap");
      if (mapAt(sbuf, len) != sbuf || mapAt(rbuf, len) != rbuf) {
        die(rank, "mmap at the same address");
      }
    }
    for (int r = 0; r < rounds; ++r, ++tag) {
      fillPattern(sbuf, len, seedOf(rank, tag));
      std::memset(rbuf, 0, len);
      MPI_Sendrecv(sbuf, static_cast<int>(len), MPI_BYTE, peer, static_cast<int>(tag % 32000),
                   rbuf, static_cast<int>(len), MPI_BYTE, peer, static_cast<int>(tag % 32000),
                   MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      const std::size_t bad = checkPattern(rbuf, len, seedOf(peer, tag));
      if (bad != len) {
        std::fprintf(stderr,
                     "rank %d: FAIL: exchange %" PRIu64 " (remap cycle %d): byte %zu is 0x%02x, "
                     "expected 0x%02x\n",
                     rank, tag, cycle, bad, rbuf[bad], patternByte(seedOf(peer, tag), bad));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      ++exchanges;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::printf("rank %d: %ld exchanges of %zu bytes verified, buffers re-mapped %d times at %p/%p\n",
              rank, exchanges, len, remaps, static_cast<void*>(sbuf), static_cast<void*>(rbuf));
  std::fflush(stdout);
  munmap(sbuf, len);
  munmap(rbuf, len);
  MPI_Finalize();
  return 0;
}
