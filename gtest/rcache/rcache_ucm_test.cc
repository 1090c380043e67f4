// The cache fed by the libucm adapter, through real system calls (in the spirit of libfabric's
// mr_cache_evict test): munmap/mmap at the same address, mmap MAP_FIXED over a mapping, brk shrink
// and regrow, madvise(MADV_DONTNEED), mremap, shmdt. Each case registers memory, changes the pages
// under it, and checks that the next request is a miss with a new registration.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "gtest/common/fake_backend.h"
#include "gtest/rcache/stress.h"
#include "rcache/rcache.h"
#include "rcache/ucm_monitor.h"

namespace gmd::rcache::test {

using gmd::test::FakeBackend;
namespace {

constexpr std::size_t kPage = 4096;

class RcacheUcmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(Cache::create(Config{}, &cache_), Status::kOk);
    ASSERT_EQ(monitor_.subscribe(cache_.get()), Status::kOk);
  }
  void TearDown() override {
    monitor_.unsubscribe(cache_.get());
    cache_.reset();
    be_.expectAllDeregisteredOnce();
  }
  FakeBackend::Record* getPut(void* addr, std::size_t len) {
    Region* r = nullptr;
    EXPECT_EQ(cache_->get(addr, len, kAccessLocalRead, MemType::kHost, &be_, &r), Status::kOk);
    if (r == nullptr) return nullptr;
    FakeBackend::Record* rec = FakeBackend::record(r);
    cache_->put(r);
    return rec;
  }
  // Registers [addr, addr + len), checks the second request hits, runs `change`, and checks the
  // next request is a new registration while the old one is deregistered.
  template <typename F>
  void expectChangeInvalidates(void* addr, std::size_t len, F change) {
    FakeBackend::Record* first = getPut(addr, len);
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(getPut(addr, len), first);  // cached
    const Stats before = cache_->stats();
    change();
    const Stats after = cache_->stats();
    EXPECT_GT(after.invalidations_unused, before.invalidations_unused) << "no unmap event seen";
    FakeBackend::Record* second = getPut(addr, len);
    EXPECT_NE(second, first);
    EXPECT_EQ(first->deregs.load(), 1);
  }

  FakeBackend be_;
  UcmMonitor monitor_{UcmMonitor::kDefaultPriority};
  std::unique_ptr<Cache> cache_;
};

void* mapPages(std::size_t n, void* hint = nullptr, int extra_flags = 0) {
  void* p = mmap(hint, n * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags,
                 -1, 0);
  EXPECT_NE(p, MAP_FAILED) << std::strerror(errno);
  return p;
}

TEST_F(RcacheUcmTest, MunmapThenMmapAtSameAddress) {
  void* p = mapPages(4);
  expectChangeInvalidates(p, 4 * kPage, [&] {
    ASSERT_EQ(munmap(p, 4 * kPage), 0);
    ASSERT_EQ(mapPages(4, p, MAP_FIXED_NOREPLACE), p);
  });
  munmap(p, 4 * kPage);
}

TEST_F(RcacheUcmTest, MmapFixedOverMapping) {
  void* p = mapPages(4);
  expectChangeInvalidates(p, 4 * kPage, [&] { ASSERT_EQ(mapPages(2, p, MAP_FIXED), p); });
  munmap(p, 4 * kPage);
}

TEST_F(RcacheUcmTest, MadviseDontneed) {
  void* p = mapPages(4);
  expectChangeInvalidates(static_cast<char*>(p) + kPage, kPage,
                          [&] { ASSERT_EQ(madvise(p, 4 * kPage, MADV_DONTNEED), 0); });
  munmap(p, 4 * kPage);
}

TEST_F(RcacheUcmTest, MremapMovesPages) {
  void* p = mapPages(4);
  void* q = nullptr;
  expectChangeInvalidates(p, 4 * kPage, [&] {
    q = mremap(p, 4 * kPage, 8 * kPage, MREMAP_MAYMOVE);
    ASSERT_NE(q, MAP_FAILED) << std::strerror(errno);
    if (q == p) {
      // Grown in place: shrink it back, which unmaps the tail for sure.
      ASSERT_EQ(mremap(p, 8 * kPage, 2 * kPage, 0), p);
    }
    if (q != p) {
      ASSERT_EQ(mapPages(4, p, MAP_FIXED_NOREPLACE), p);
    }
  });
  if (q != p) munmap(q, 8 * kPage);
  munmap(p, 4 * kPage);
}

TEST_F(RcacheUcmTest, ShmdtDetachesSegment) {
  const int id = shmget(IPC_PRIVATE, 4 * kPage, IPC_CREAT | 0600);
  if (id < 0) GTEST_SKIP() << "System V shared memory unavailable: " << std::strerror(errno);
  void* p = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(p, reinterpret_cast<void*>(-1)) << std::strerror(errno);
  expectChangeInvalidates(p, 4 * kPage, [&] {
    ASSERT_EQ(shmdt(p), 0);
    ASSERT_EQ(mapPages(4, p, MAP_FIXED_NOREPLACE), p);
  });
  munmap(p, 4 * kPage);
}

TEST_F(RcacheUcmTest, BrkShrinkAndRegrow) {
  // Keep glibc's malloc from moving the break behind our back while the test owns the top of the
  // heap (sanitizer allocators refuse mallopt(); they do not use brk at all).
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 16 << 20);
  free(malloc(64));
  (void)getPut(mapPages(1), kPage);  // warm the cache's own allocations up
  const std::size_t len = 8 * kPage;
  char* top = static_cast<char*>(sbrk(0));
  char* start =
      reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(top) + kPage - 1) & ~(kPage - 1));
  ASSERT_NE(sbrk(static_cast<intptr_t>(start + len - top)), reinterpret_cast<void*>(-1));
  std::memset(start, 1, len);
  expectChangeInvalidates(start, len, [&] {
    ASSERT_EQ(sbrk(0), start + len) << "someone else moved the break";
    ASSERT_NE(sbrk(-static_cast<intptr_t>(len)), reinterpret_cast<void*>(-1));
    ASSERT_NE(sbrk(static_cast<intptr_t>(len)), reinterpret_cast<void*>(-1));
  });
  ASSERT_EQ(sbrk(0), start + len);
  sbrk(-static_cast<intptr_t>(start + len - top));
}

TEST_F(RcacheUcmTest, SeedScenarioWithRealUnmap) {
  char* p = static_cast<char*>(mapPages(3));
  Region* whole = nullptr;
  Region* page1 = nullptr;
  ASSERT_EQ(cache_->get(p, 3 * kPage, kAccessLocalRead, MemType::kHost, &be_, &whole), Status::kOk);
  ASSERT_EQ(cache_->get(p + kPage, kPage, kAccessLocalRead, MemType::kHost, &be_, &page1),
            Status::kOk);
  ASSERT_EQ(whole, page1);
  FakeBackend::Record* old_rec = FakeBackend::record(whole);
  FakeBackend::hold(whole);
  FakeBackend::hold(page1);
  FakeBackend::release(whole);
  cache_->put(whole);
  ASSERT_EQ(munmap(p + 2 * kPage, kPage), 0);                                 // page 2 unmapped...
  ASSERT_EQ(mapPages(1, p + 2 * kPage, MAP_FIXED_NOREPLACE), p + 2 * kPage);  // ...and mapped anew
  FakeBackend::Record* again = getPut(p, 3 * kPage);
  EXPECT_NE(again, old_rec);
  EXPECT_EQ(old_rec->deregs.load(), 0);  // page 1's holder keeps it
  FakeBackend::release(page1);
  cache_->put(page1);
  EXPECT_EQ(old_rec->deregs.load(), 1);
  munmap(p, 3 * kPage);
}

TEST_F(RcacheUcmTest, UnsubscribedCacheSeesNoEvents) {
  monitor_.unsubscribe(cache_.get());
  void* p = mapPages(2);
  FakeBackend::Record* first = getPut(p, 2 * kPage);
  ASSERT_EQ(munmap(p, 2 * kPage), 0);
  EXPECT_EQ(cache_->stats().invalidations_unused, 0u);
  EXPECT_EQ(getPut(p, 2 * kPage), first);  // stale, as expected without a monitor
  ASSERT_EQ(monitor_.subscribe(cache_.get()), Status::kOk);
  cache_->invalidate(p, 2 * kPage);
}

TEST(RcacheUcmMonitor, PriorityIsConfigurableAndNullSinkRejected) {
  UcmMonitor m(-5);
  EXPECT_EQ(m.priority(), -5);
  EXPECT_EQ(m.subscribe(nullptr), Status::kInvalidParam);
  m.unsubscribe(nullptr);
}

TEST(RcacheUcmStress, RandomizedThreadsWithLibucmEvents) {
#if defined(__SANITIZE_THREAD__)
  // glibc madvise()s an exiting thread's stack after ThreadSanitizer has torn the thread's state
  // down; libucm's hook then takes a lock and TSan's interceptor crashes. The same stress runs
  // under TSan with explicit invalidation in rcache_test (RcacheStress).
  GTEST_SKIP() << "libucm hooks on thread exit crash ThreadSanitizer's runtime";
#endif
  FakeBackend be;
  std::unique_ptr<Cache> cache;
  ASSERT_EQ(Cache::create(Config{}, &cache), Status::kOk);
  UcmMonitor monitor;
  ASSERT_EQ(monitor.subscribe(cache.get()), Status::kOk);
  {
    StressPool pool;
    StressOptions opt;
    opt.explicit_invalidate = false;  // mmap MAP_FIXED and madvise raise the events
    runStress(cache.get(), &be, &pool, opt);
  }
  monitor.unsubscribe(cache.get());
  cache.reset();
  be.expectAllDeregisteredOnce();
}

}  // namespace
}  // namespace gmd::rcache::test
