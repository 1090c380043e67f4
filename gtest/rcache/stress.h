// Randomised multi-thread stress of the registration cache against real memory, checked by the fake
// backend's oracle: no stale hit (a region whose pages were replaced after it was registered), no
// deregistration while held, and at the end every registration deregistered exactly once.
//
// A pool of slots (a few pages each, separated by inaccessible guard pages so that no region can
// span two slots). Threads register sub-ranges of slots (sometimes two overlapping ones at once, so
// pages are shared by in-flight buffers), replace a slot's pages (mmap MAP_FIXED over it, or
// madvise(MADV_DONTNEED)), invalidate ranges without touching memory, and call progress(). Each
// page carries a token in its first word that changes whenever the page is replaced; the backend
// records the token at registration time, so a hit on a region with an old token is a stale hit.
//
// Seeded (GMD_STRESS_SEED, default 20260601) and bounded in time (GMD_STRESS_SECONDS, default 3):
// the operation sequence of each thread is reproducible, the interleaving is not.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "gtest/common/fake_backend.h"
#include "rcache/rcache.h"

namespace gmd::rcache::test {

using gmd::test::FakeBackend;

struct StressOptions {
  int threads = 4;
  bool explicit_invalidate = true;  // false: rely on a monitor (libucm) to see the unmaps
};

inline std::uint64_t stressSeed() {
  const char* s = std::getenv("GMD_STRESS_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 0) : 20260601ull;
}
inline double stressSeconds() {
  const char* s = std::getenv("GMD_STRESS_SECONDS");
  return s != nullptr ? std::strtod(s, nullptr) : 3.0;
}

class StressPool {
 public:
  static constexpr std::size_t kPage = 4096;
  static constexpr std::size_t kSlots = 16;
  static constexpr std::size_t kSlotPages = 4;
  static constexpr std::size_t kStride = (kSlotPages + 1) * kPage;  // + one guard page

  StressPool() {
    void* p = mmap(nullptr, kSlots * kStride, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<char*>(p);
    for (std::size_t s = 0; s < kSlots; ++s) remap(s);
  }
  ~StressPool() { munmap(base_, kSlots * kStride); }

  char* slot(std::size_t s) const { return base_ + s * kStride; }
  std::size_t span() const { return kSlots * kStride; }
  char* base() const { return base_; }
  std::shared_mutex& lock(std::size_t s) { return locks_[s]; }
  std::uint64_t token(std::size_t s) const { return *reinterpret_cast<std::uint64_t*>(slot(s)); }

  // New pages over the slot (the old ones are unmapped by the kernel: an unmap event).
  void remap(std::size_t s) {
    void* p = mmap(slot(s), kSlotPages * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    EXPECT_EQ(p, slot(s));
    stamp(s);
  }
  void discard(std::size_t s) {
    EXPECT_EQ(madvise(slot(s), kSlotPages * kPage, MADV_DONTNEED), 0);
    stamp(s);
  }

 private:
  void stamp(std::size_t s) {
    const std::uint64_t t = next_token_.fetch_add(1) + 1;
    for (std::size_t pg = 0; pg < kSlotPages; ++pg) {
      *reinterpret_cast<std::uint64_t*>(slot(s) + pg * kPage) = t;
    }
  }
  char* base_ = nullptr;
  std::shared_mutex locks_[kSlots];
  std::atomic<std::uint64_t> next_token_{0};
};

inline void runStress(Cache* cache, FakeBackend* be, StressPool* pool, const StressOptions& opt) {
  using Clock = std::chrono::steady_clock;
  const std::uint64_t seed = stressSeed();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(stressSeconds()));
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  be->tokenFn([](std::uintptr_t start) { return *reinterpret_cast<std::uint64_t*>(start); });
  std::atomic<long> stale{0}, ops{0}, gets{0};

  auto worker = [&](int tid) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(tid) * 0x9e3779b97f4a7c15ull);
    const std::size_t kP = StressPool::kPage;
    auto getOne = [&](std::size_t s, Region** out) {
      const std::size_t p0 = rng() % StressPool::kSlotPages;
      const std::size_t np = 1 + rng() % (StressPool::kSlotPages - p0);
      char* addr = pool->slot(s) + p0 * kP + rng() % 64;
      const std::size_t len = np * kP - 64;
      const unsigned access =
          (rng() % 4 == 0) ? (kAccessLocalRead | kAccessRemoteWrite) : kAccessLocalRead;
      Region* r = nullptr;
      const Status st = cache->get(addr, len, access, MemType::kHost, be, &r);
      if (st != Status::kOk) {
        ADD_FAILURE() << "get failed: " << statusString(st) << " (seed " << seed << ")";
        return false;
      }
      FakeBackend::hold(r);
      gets.fetch_add(1);
      const auto a = reinterpret_cast<std::uintptr_t>(addr);
      EXPECT_LE(r->start(), a);
      EXPECT_GE(r->end(), a + len);
      EXPECT_EQ(r->access() & access, access);
      // Every page of the region must be the page that was registered (tokens per slot are
      // uniform, so the region's first page stands for all of them).
      if (FakeBackend::record(r)->token != pool->token(s)) {
        stale.fetch_add(1);
        ADD_FAILURE() << "stale hit on slot " << s << " (seed " << seed << ")";
      }
      *out = r;
      return true;
    };
    auto putOne = [&](Region* r) {
      FakeBackend::release(r);
      cache->put(r);
    };
    while (Clock::now() < deadline) {
      ops.fetch_add(1);
      const std::size_t s = rng() % StressPool::kSlots;
      const unsigned op = static_cast<unsigned>(rng() % 100);
      if (op < 70) {
        std::shared_lock<std::shared_mutex> g(pool->lock(s));
        Region* r1 = nullptr;
        Region* r2 = nullptr;
        if (!getOne(s, &r1)) continue;
        if (rng() % 2 == 0) getOne(s, &r2);  // a second in-flight buffer, maybe overlapping
        if (rng() % 2 == 0) std::swap(r1, r2);
        if (r1 != nullptr) putOne(r1);
        if (r2 != nullptr) putOne(r2);
      } else if (op < 85) {
        std::unique_lock<std::shared_mutex> g(pool->lock(s));
        if (opt.explicit_invalidate) cache->invalidate(pool->slot(s), StressPool::kSlotPages * kP);
        pool->remap(s);
      } else if (op < 92) {
        std::unique_lock<std::shared_mutex> g(pool->lock(s));
        if (opt.explicit_invalidate) cache->invalidate(pool->slot(s), StressPool::kSlotPages * kP);
        pool->discard(s);
      } else if (op < 97) {
        // Invalidate without changing memory, concurrently with users of the slot.
        cache->invalidate(pool->slot(s) + (rng() % StressPool::kSlotPages) * kP, kP);
      } else {
        cache->progress();
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < opt.threads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();

  EXPECT_EQ(stale.load(), 0) << "seed " << seed;
  EXPECT_EQ(be->premature(), 0) << "seed " << seed;
  EXPECT_GT(gets.load(), 0);
  // Nothing is held now: invalidating the whole pool must leave nothing registered.
  cache->invalidate(pool->base(), pool->span());
  cache->progress();
  EXPECT_EQ(be->live(), 0) << "seed " << seed;
  const Stats st = cache->stats();
  EXPECT_EQ(st.regions, 0u);
  EXPECT_EQ(st.pinned_bytes, 0u);
  std::printf(
      "stress: seed %llu, %ld ops, %ld gets, %llu hits, %llu misses, %llu merges, "
      "%llu invalidations (%llu in use), %llu deferred\n",
      static_cast<unsigned long long>(seed), ops.load(), gets.load(),
      static_cast<unsigned long long>(st.hits), static_cast<unsigned long long>(st.misses),
      static_cast<unsigned long long>(st.merges),
      static_cast<unsigned long long>(st.invalidations_unused + st.invalidations_in_use),
      static_cast<unsigned long long>(st.invalidations_in_use),
      static_cast<unsigned long long>(st.deferred_deregs));
}

}  // namespace gmd::rcache::test
