// MPI one-sided communication between two ranks, every result verified: MPI_Put, MPI_Get,
// MPI_Accumulate, MPI_Fetch_and_op and MPI_Compare_and_swap, with active target synchronisation
// (MPI_Win_fence) and passive target (MPI_Win_lock / MPI_Win_flush / MPI_Win_unlock). Sizes run from
// 1 byte (UCP's short puts) through a few KiB (bcopy) to 1 MiB (zero-copy). Run by
// gtest/mpi/mpi_osc_check.sh under Open MPI's osc ucx over gmd_rc.
//
// Each rank prints "osc: rank R: N checks verified" when everything matched; any mismatch prints
// what differed and aborts with a non-zero status.
//
// Usage: gmd_mpi_osc [ROUNDS]   (default 3: the whole sequence repeated, windows reused)
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t kBytes = std::size_t{1} << 21;  // the byte window: 2 MiB
constexpr int kWords = 64;                              // the int64 window
constexpr int kFetchAdds = 200;                         // per rank, passive target
const std::size_t kSizes[] = {1, 7, 8, 64, 100, 1000, 4096, 8000, 65536, 1 << 20};

int g_rank = 0;
long g_checks = 0;

[[noreturn]] void fail(const char* what, long long got, long long want) {
  std::fprintf(stderr, "osc: rank %d: FAIL: %s: got %lld, expected %lld\n", g_rank, what, got,
               want);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

void expect(bool ok, const char* what, long long got, long long want) {
  if (!ok) fail(what, got, want);
  ++g_checks;
}

std::uint8_t byteOf(int writer, int round, std::size_t size, std::size_t i) {
  return static_cast<std::uint8_t>(writer * 97 + round * 31 + size * 13 + i * 7 + 1);
}

// Every byte of buf[0, size) written by `writer` for (round, size).
void checkBytes(const std::uint8_t* buf, int writer, int round, std::size_t size, const char* what) {
  for (std::size_t i = 0; i < size; ++i) {
    if (buf[i] != byteOf(writer, round, size, i)) {
      std::fprintf(stderr, "osc: rank %d: %s of %zu bytes, byte %zu differs\n", g_rank, what, size, i);
      fail(what, buf[i], byteOf(writer, round, size, i));
    }
  }
  ++g_checks;
}

void fillBytes(std::uint8_t* buf, int writer, int round, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) buf[i] = byteOf(writer, round, size, i);
}

// Active target: puts into the peer, gets back what the peer wrote into itself, accumulates.
void activeTarget(MPI_Win bytes_win, std::uint8_t* bytes, MPI_Win words_win, std::int64_t* words,
                  int round) {
  const int peer = 1 - g_rank;
  std::vector<std::uint8_t> src(kBytes), dst(kBytes);
  for (const std::size_t size : kSizes) {
    // Put: my pattern into the peer's window at offset 0.
    fillBytes(src.data(), g_rank, round, size);
    MPI_Win_fence(0, bytes_win);
    MPI_Put(src.data(), static_cast<int>(size), MPI_BYTE, peer, 0, static_cast<int>(size),
            MPI_BYTE, bytes_win);
    MPI_Win_fence(0, bytes_win);
    checkBytes(bytes, peer, round, size, "MPI_Put (fence)");

    // Get: the peer writes its own pattern into its window, I read it back.
    MPI_Win_fence(0, bytes_win);
    fillBytes(bytes + kBytes / 2, g_rank, round + 100, size);
    MPI_Win_fence(0, bytes_win);
    std::fill(dst.begin(), dst.begin() + static_cast<long>(size), 0);
    MPI_Get(dst.data(), static_cast<int>(size), MPI_BYTE, peer, kBytes / 2,
            static_cast<int>(size), MPI_BYTE, bytes_win);
    MPI_Win_fence(0, bytes_win);
    checkBytes(dst.data(), peer, round + 100, size, "MPI_Get (fence)");
  }

  // Accumulate: both ranks add into both windows, each word i gets (1 + 2) * (i + 1) * 5 in total
  // over five epochs, on top of what was there.
  MPI_Win_fence(0, words_win);
  for (int i = 0; i < kWords; ++i) words[i] = 1000 * round;
  MPI_Win_fence(0, words_win);
  std::vector<std::int64_t> add(kWords);
  for (int i = 0; i < kWords; ++i) add[i] = (g_rank + 1) * (i + 1);
  for (int e = 0; e < 5; ++e) {
    MPI_Accumulate(add.data(), kWords, MPI_INT64_T, peer, 0, kWords, MPI_INT64_T, MPI_SUM,
                   words_win);
    MPI_Accumulate(add.data(), kWords, MPI_INT64_T, g_rank, 0, kWords, MPI_INT64_T, MPI_SUM,
                   words_win);
    MPI_Win_fence(0, words_win);
  }
  for (int i = 0; i < kWords; ++i) {
    expect(words[i] == 1000 * round + 3 * (i + 1) * 5, "MPI_Accumulate MPI_SUM (fence)", words[i],
           1000 * round + 3 * (i + 1) * 5);
  }
  // No epoch after these: passive target follows.
  MPI_Win_fence(MPI_MODE_NOSUCCEED, bytes_win);
  MPI_Win_fence(MPI_MODE_NOSUCCEED, words_win);
}

// Passive target on rank 0's words: fetch-adds from both ranks, compare-and-swap races, and
// exclusive-lock puts/gets between the byte windows.
void passiveTarget(MPI_Win bytes_win, std::uint8_t* bytes, MPI_Win words_win, std::int64_t* words,
                   int round) {
  const int peer = 1 - g_rank;
  // Reset under an exclusive lock of my own window, then make it visible to everyone.
  MPI_Win_lock(MPI_LOCK_EXCLUSIVE, g_rank, 0, words_win);
  for (int i = 0; i < kWords; ++i) words[i] = 0;
  MPI_Win_unlock(g_rank, words_win);
  MPI_Barrier(MPI_COMM_WORLD);

  // Fetch_and_op MPI_SUM on word 0 of rank 0, both ranks at once: old values all distinct.
  std::vector<std::int64_t> old(kFetchAdds);
  const std::int64_t one = 1;
  MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, words_win);
  for (int i = 0; i < kFetchAdds; ++i) {
    MPI_Fetch_and_op(&one, &old[i], MPI_INT64_T, 0, 0, MPI_SUM, words_win);
    MPI_Win_flush(0, words_win);
  }
  MPI_Win_unlock(0, words_win);
  for (int i = 1; i < kFetchAdds; ++i) {
    expect(old[i] > old[i - 1], "MPI_Fetch_and_op: a rank's old values increase", old[i],
           old[i - 1] + 1);
  }
  std::vector<std::int64_t> all(2 * kFetchAdds);
  MPI_Allgather(old.data(), kFetchAdds, MPI_INT64_T, all.data(), kFetchAdds, MPI_INT64_T,
                MPI_COMM_WORLD);
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 2 * kFetchAdds; ++i) {
    expect(all[i] == i, "MPI_Fetch_and_op: old values are 0 .. 2N-1, each once", all[i], i);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, words_win);
    expect(words[0] == 2 * kFetchAdds, "MPI_Fetch_and_op: the counter", words[0], 2 * kFetchAdds);
    MPI_Win_unlock(0, words_win);
  }

  // Compare_and_swap on word 1 of rank 0 (0 → rank + 1): exactly one rank wins, the other sees
  // the winner's value; then each rank swaps its own mark on a word of its own (2 + rank).
  const std::int64_t mine = g_rank + 1, zero = 0;
  std::int64_t seen = -1;
  MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, words_win);
  MPI_Compare_and_swap(&mine, &zero, &seen, MPI_INT64_T, 0, 1, words_win);
  MPI_Win_flush(0, words_win);
  std::int64_t again = -1;
  MPI_Compare_and_swap(&mine, &zero, &again, MPI_INT64_T, 0, 1, words_win);  // must fail now
  MPI_Win_flush(0, words_win);
  std::int64_t own = -1;
  MPI_Compare_and_swap(&mine, &zero, &own, MPI_INT64_T, 0, 2 + g_rank, words_win);
  MPI_Win_unlock(0, words_win);
  expect(seen == 0 || seen == 2 - g_rank, "MPI_Compare_and_swap: 0 or the other rank's mark", seen,
         0);
  expect(again != 0, "MPI_Compare_and_swap: a second swap of 0 fails", again, 1);
  expect(own == 0, "MPI_Compare_and_swap: an uncontended swap succeeds", own, 0);
  std::int64_t winners = seen == 0 ? 1 : 0, total = 0;
  MPI_Allreduce(&winners, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  expect(total == 1, "MPI_Compare_and_swap: exactly one winner", total, 1);
  if (g_rank == 0) {
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, words_win);
    expect(words[1] == 1 || words[1] == 2, "MPI_Compare_and_swap: the winner's mark", words[1], 1);
    expect(words[2] == 1 && words[3] == 2, "MPI_Compare_and_swap: each rank's own mark",
           words[2] * 10 + words[3], 12);
    MPI_Win_unlock(0, words_win);
  }

  // Exclusive-lock Put into the peer and Get of the peer's half, every size.
  std::vector<std::uint8_t> src(kBytes), dst(kBytes);
  for (const std::size_t size : kSizes) {
    // My half for the peer's gets, written under a lock of my own window.
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, g_rank, 0, bytes_win);
    fillBytes(bytes + kBytes / 2, g_rank, round + 200, size);
    MPI_Win_unlock(g_rank, bytes_win);
    MPI_Barrier(MPI_COMM_WORLD);

    fillBytes(src.data(), g_rank, round + 300, size);
    std::fill(dst.begin(), dst.begin() + static_cast<long>(size), 0);
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, peer, 0, bytes_win);
    MPI_Put(src.data(), static_cast<int>(size), MPI_BYTE, peer, 0, static_cast<int>(size),
            MPI_BYTE, bytes_win);
    MPI_Get(dst.data(), static_cast<int>(size), MPI_BYTE, peer, kBytes / 2,
            static_cast<int>(size), MPI_BYTE, bytes_win);
    MPI_Win_unlock(peer, bytes_win);
    checkBytes(dst.data(), peer, round + 200, size, "MPI_Get (lock)");
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock(MPI_LOCK_SHARED, g_rank, 0, bytes_win);
    checkBytes(bytes, peer, round + 300, size, "MPI_Put (lock)");
    MPI_Win_unlock(g_rank, bytes_win);
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // Accumulate under a shared lock with flushes: both ranks add to rank 1's word 5.
  const std::int64_t inc = g_rank == 0 ? 3 : 4;
  MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, words_win);
  for (int i = 0; i < 50; ++i) {
    MPI_Accumulate(&inc, 1, MPI_INT64_T, 1, 5, 1, MPI_INT64_T, MPI_SUM, words_win);
  }
  MPI_Win_flush(1, words_win);
  MPI_Win_unlock(1, words_win);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 1) {
    MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, words_win);
    expect(words[5] == 50 * 7, "MPI_Accumulate MPI_SUM (lock)", words[5], 50 * 7);
    MPI_Win_unlock(1, words_win);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks != 2) fail("number of ranks", ranks, 2);
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  if (rounds <= 0) fail("ROUNDS", rounds, 3);

  std::uint8_t* bytes = nullptr;
  std::int64_t* words = nullptr;
  MPI_Win bytes_win, words_win;
  MPI_Win_allocate(static_cast<MPI_Aint>(kBytes), 1, MPI_INFO_NULL, MPI_COMM_WORLD, &bytes,
                   &bytes_win);
  MPI_Win_allocate(static_cast<MPI_Aint>(kWords * sizeof(std::int64_t)), sizeof(std::int64_t),
                   MPI_INFO_NULL, MPI_COMM_WORLD, &words, &words_win);
  for (int round = 0; round < rounds; ++round) {
    activeTarget(bytes_win, bytes, words_win, words, round);
    passiveTarget(bytes_win, bytes, words_win, words, round);
  }
  MPI_Win_free(&words_win);
  MPI_Win_free(&bytes_win);
  std::printf("osc: rank %d: %ld checks verified\n", g_rank, g_checks);
  std::fflush(stdout);
  MPI_Finalize();
  return 0;
}
