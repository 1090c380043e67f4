// Invalidation bursts larger than the queue (rcache/invalidation_queue.h): while a writer holds
// the lock (pre-empted inside the cache), invalidate() can only queue, and past the ring's capacity
// it widens the smallest range covering what did not fit. Afterwards only the regions inside the
// freed ranges' cover are gone; every other region is still a hit.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/common/fake_backend.h"
#include "rcache/cache_impl.h"
#include "rcache/rcache.h"

namespace gmd::rcache::test {

using gmd::test::FakeBackend;
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::uintptr_t kBase = std::uintptr_t{1} << 40;  // never dereferenced
void* at(std::uintptr_t page) { return reinterpret_cast<void*>(kBase + page * kPage); }

TEST(RcacheBurstStress, BurstPastTheQueueDropsOnlyTheFreedRangesFromSeveralThreads) {
  std::unique_ptr<Cache> cache;
  ASSERT_EQ(Status::kOk, Cache::create(Config{}, &cache));
  FakeBackend be;
  // Kept: pages [0, 500) and [1500, 2000); freed: [500, 1500). One page per region.
  constexpr std::uintptr_t kFreedLo = 500, kFreedHi = 1500, kPages = 2000;
  std::vector<FakeBackend::Record*> rec(kPages);
  for (std::uintptr_t p = 0; p < kPages; ++p) {
    Region* r = nullptr;
    ASSERT_EQ(Status::kOk, cache->get(at(p), kPage, kAccessLocalRead, MemType::kHost, &be, &r));
    rec[p] = FakeBackend::record(r);
    cache->put(r);
  }
  // A writer pre-empted inside the cache: invalidate() can only queue.
  detail::WriterLock& lock = static_cast<detail::CacheImpl*>(cache.get())->writerLockForTests();
  lock.lock();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25000;  // 100k in all, far past the ring's 1024
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        const std::uintptr_t p = kFreedLo + (static_cast<std::uintptr_t>(k) * kThreads + t) %
                                                (kFreedHi - kFreedLo);
        cache->invalidate(at(p), kPage);
      }
    });
  }
  for (auto& th : threads) th.join();  // none blocked on the held lock
  lock.unlock();
  const long regs_before = be.regCalls();
  for (std::uintptr_t p = 0; p < kPages; ++p) {
    Region* r = nullptr;
    ASSERT_EQ(Status::kOk, cache->get(at(p), kPage, kAccessLocalRead, MemType::kHost, &be, &r));
    const bool freed = p >= kFreedLo && p < kFreedHi;
    if (freed) {
      EXPECT_NE(rec[p], FakeBackend::record(r)) << "page " << p << " was freed, yet a hit";
    } else {
      EXPECT_EQ(rec[p], FakeBackend::record(r)) << "page " << p << " is outside, yet a miss";
    }
    cache->put(r);
  }
  EXPECT_EQ(regs_before + static_cast<long>(kFreedHi - kFreedLo), be.regCalls());
  const Stats s = cache->stats();
  EXPECT_GT(s.invalidation_overflows, 0u) << "the burst fitted in the queue; it tested nothing";
  EXPECT_EQ(kPages, s.regions);
  for (std::uintptr_t p = kFreedLo; p < kFreedHi; ++p) EXPECT_EQ(1, rec[p]->deregs.load());
  cache.reset();
  be.expectAllDeregisteredOnce();
}

}  // namespace
}  // namespace gmd::rcache::test
