// A miss widens the request to the union with the overlapping regions (rule 3) and registers it
// outside the lock. When a neighbour's pages are unmapped in between, registering the union fails
// (EFAULT, as ibv_reg_mr does), although the caller's own pages are all mapped: the cache must then
// retry with the request alone, as UCX's cache does, and still keep out of the index what an
// invalidation raced.
//
// The backend here checks every page it is asked to register with a real system call (msync()
// fails with ENOMEM on an unmapped page) and fails like the verbs backend would. The first cases
// unmap the neighbour deterministically, from the backend's seam between the lock and the
// registration; the threaded one re-maps pages for real while other threads register buffers that
// share pages with it, with invalidations delivered by libucm.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rcache/rcache.h"
#include "rcache/ucm_monitor.h"

namespace gmd::rcache::test {
namespace {

const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

// Registers only mapped pages, like ibv_reg_mr: EFAULT otherwise. `beforeCheck` runs inside reg(),
// before the pages are checked: the seam between the cache's lock and the registration.
class MappedPagesBackend final : public Backend {
 public:
  Result reg(std::uintptr_t start, std::size_t length, unsigned, MemoryKind,
             Registration* out) noexcept override {
    calls_.fetch_add(1);
    std::function<void(std::uintptr_t, std::size_t)> hook;
    {
      std::lock_guard<std::mutex> g(mutex_);
      hook.swap(before_check_);  // once
    }
    if (hook) hook(start, length);
    // Pinning takes time (ibv_reg_mr costs microseconds per page): the window of the race.
    if (delay_us_ != 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    for (std::uintptr_t p = start; p < start + length; p += kPage) {
      if (msync(reinterpret_cast<void*>(p), kPage, MS_ASYNC) != 0 && errno == ENOMEM) {
        failures_.fetch_add(1);
        return Result(Status::kIoError, EFAULT);
      }
    }
    out->lkey = out->rkey = 1;
    out->handle = nullptr;
    live_.fetch_add(1);
    return Status::kOk;
  }
  void dereg(const Registration&) noexcept override { live_.fetch_sub(1); }
  const char* name() const noexcept override { return "mapped-pages"; }

  void beforeCheck(std::function<void(std::uintptr_t, std::size_t)> f) {
    std::lock_guard<std::mutex> g(mutex_);
    before_check_ = std::move(f);
  }
  void delay(int us) { delay_us_ = us; }
  long calls() const { return calls_.load(); }
  long failures() const { return failures_.load(); }
  long live() const { return live_.load(); }

 private:
  std::mutex mutex_;
  std::function<void(std::uintptr_t, std::size_t)> before_check_;
  std::atomic<long> calls_{0}, failures_{0}, live_{0};
  int delay_us_ = 0;
};

class RcacheRemapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(Status::kOk, Cache::create(Config{}, &cache_));
    base_ = static_cast<std::uint8_t*>(
        mmap(nullptr, 16 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(MAP_FAILED, static_cast<void*>(base_));
  }
  void TearDown() override {
    cache_.reset();
    EXPECT_EQ(0, be_.live()) << "registrations left after the cache";
    munmap(base_, 16 * kPage);  // holes included
  }
  std::uint8_t* at(std::size_t page) { return base_ + page * kPage; }
  Result get(std::size_t page, std::size_t pages, Region** r) {
    return cache_->get(at(page), pages * kPage, kAccessLocalRead, MemType::kHost, &be_, r);
  }
  // What the unmap hook does: the pages go, the cache hears of it.
  void unmapPages(std::size_t page, std::size_t pages) {
    ASSERT_EQ(0, munmap(at(page), pages * kPage));
    cache_->invalidate(at(page), pages * kPage);
  }

  MappedPagesBackend be_;
  std::unique_ptr<Cache> cache_;
  std::uint8_t* base_ = nullptr;
};

TEST_F(RcacheRemapTest, UnionFailingBecauseANeighbourWasUnmappedRetriesTheRequestAlone) {
  Region* a = nullptr;
  ASSERT_EQ(Status::kOk, get(0, 2, &a));  // pages 0-1
  cache_->put(a);
  // Between the lock and the registration of the union (pages 0-3), page 0 goes.
  be_.beforeCheck([&](std::uintptr_t, std::size_t) { unmapPages(0, 1); });
  Region* b = nullptr;
  const Result st = get(1, 3, &b);  // pages 1-3, all mapped
  ASSERT_EQ(Status::kOk, st.status) << "errno " << st.error;
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(at(1)), b->start());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(at(4)), b->end());
  EXPECT_EQ(1, be_.failures());  // the union, once
  EXPECT_EQ(3, be_.calls());     // a, the union, the request alone
  // Nothing raced the request's own pages: its registration is cached.
  Region* again = nullptr;
  ASSERT_EQ(Status::kOk, get(1, 3, &again));
  EXPECT_EQ(b, again);
  cache_->put(again);
  cache_->put(b);
  const Stats s = cache_->stats();
  EXPECT_EQ(1u, s.regions);
  EXPECT_EQ(3 * kPage, s.pinned_bytes);
  EXPECT_EQ(3 * kPage, s.unused_bytes);
}

TEST_F(RcacheRemapTest, RetriedRequestRacedByAnInvalidationOfItsOwnPagesIsNotIndexed) {
  Region* a = nullptr;
  ASSERT_EQ(Status::kOk, get(0, 2, &a));
  cache_->put(a);
  be_.beforeCheck([&](std::uintptr_t, std::size_t) {
    unmapPages(0, 1);
    // Page 2 is replaced by a fresh page (mapped again at once): the caller may use what it gets,
    // but nobody else may.
    ASSERT_NE(MAP_FAILED, mmap(at(2), kPage, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
    cache_->invalidate(at(2), kPage);
  });
  Region* b = nullptr;
  ASSERT_EQ(Status::kOk, get(1, 3, &b).status);
  Region* again = nullptr;
  ASSERT_EQ(Status::kOk, get(1, 3, &again));
  EXPECT_NE(b, again) << "a registration raced by an invalidation was indexed";
  cache_->put(again);
  cache_->put(b);
  cache_->progress();
  EXPECT_EQ(1u, cache_->stats().regions);
}

TEST_F(RcacheRemapTest, RequestThatFailsOnItsOwnPagesStillFails) {
  Region* a = nullptr;
  ASSERT_EQ(Status::kOk, get(0, 2, &a));
  cache_->put(a);
  be_.beforeCheck([&](std::uintptr_t, std::size_t) { unmapPages(2, 1); });  // the caller's page
  Region* b = nullptr;
  const Result st = get(1, 3, &b);
  EXPECT_EQ(Status::kIoError, st.status);
  EXPECT_EQ(EFAULT, st.error);
  EXPECT_EQ(2, be_.failures());  // the union, then the request alone
  EXPECT_EQ(1, be_.live());      // only a
  const Stats s = cache_->stats();
  EXPECT_EQ(1u, s.regions);
  EXPECT_EQ(2 * kPage, s.pinned_bytes);
}

// Through real system calls: buffers of three pages, each sharing its first and last page with
// its neighbours. One thread keeps its buffer registered for a while, releases it, unmaps and maps
// again the middle page (its own, shared with nobody); the others register and release theirs,
// whose pages are always mapped, and their misses widen over the re-mapping thread's region while
// it is cached (nothing unused stays cached, so every user request is a miss). libucm delivers
// the invalidations. No registration of a mapped buffer may fail.
TEST(RcacheRemapConcurrency, ThreadsSharingPagesWithARemappingNeighbourNeverFail) {
#if defined(__SANITIZE_THREAD__)
  // As RcacheUcmStress: glibc madvise()s an exiting thread's stack after ThreadSanitizer tore the
  // thread down, and libucm's hook then crashes TSan's runtime. The seam cases above run under it.
  GTEST_SKIP() << "libucm hooks on thread exit crash ThreadSanitizer's runtime";
#endif
  Config config;
  config.max_unused_bytes = 0;
  std::unique_ptr<Cache> cache;
  ASSERT_EQ(Status::kOk, Cache::create(config, &cache));
  UcmMonitor monitor;
  ASSERT_EQ(Status::kOk, monitor.subscribe(cache.get()));
  MappedPagesBackend be;
  be.delay(20);
  constexpr std::size_t kPages = 7;  // users' buffers 0 and 2 around the re-mapping buffer 1
  auto* base = static_cast<std::uint8_t*>(
      mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(MAP_FAILED, static_cast<void*>(base));
  auto buffer = [&](int i) { return base + 2 * static_cast<std::size_t>(i) * kPage; };
  std::atomic<bool> stop{false};
  std::atomic<long> failures{0}, registrations{0}, attempts{0}, remaps{0};
  // The users go on past their 2,000 requests each until the re-mapping thread has re-mapped its
  // page a few times under them: on a loaded machine it may not be scheduled before they finish
  // (remaps was 0 in 7 of 30 runs beside a benchmark). A deadline keeps a starved thread a failure,
  // not a hang.
  constexpr long kMinRemaps = 20;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string first_failure;
  std::mutex failure_mutex;

  std::thread remapper([&] {
    std::uint8_t* mid = buffer(1) + kPage;
    while (!stop.load()) {
      Region* r = nullptr;
      if (cache->get(buffer(1), 3 * kPage, kAccessLocalRead, MemType::kHost, &be, &r) ==
          Status::kOk) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));  // the neighbours widen over it
        cache->put(r);
      }
      munmap(mid, kPage);
      if (mmap(mid, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
               0) == MAP_FAILED) {
        break;
      }
      remaps.fetch_add(1);
    }
  });
  std::vector<std::thread> users;
  for (int i : {0, 2}) {
    users.emplace_back([&, i] {
      for (int k = 0; k < 2000 || (remaps.load() < kMinRemaps &&
                                   std::chrono::steady_clock::now() < deadline);
           ++k) {
        attempts.fetch_add(1);
        Region* r = nullptr;
        const Result st =
            cache->get(buffer(i), 3 * kPage, kAccessLocalRead, MemType::kHost, &be, &r);
        if (!st.ok()) {
          if (failures.fetch_add(1) == 0) {
            std::lock_guard<std::mutex> g(failure_mutex);
            first_failure = std::string(statusString(st.status)) + " errno " +
                            std::to_string(st.error) + " for buffer " + std::to_string(i);
          }
          continue;
        }
        registrations.fetch_add(1);
        cache->put(r);
      }
    });
  }
  for (auto& t : users) t.join();
  stop.store(true);
  remapper.join();
  EXPECT_EQ(0, failures.load()) << "first: " << first_failure;
  EXPECT_GE(attempts.load(), 4000);
  EXPECT_EQ(attempts.load(), registrations.load());
  EXPECT_GE(remaps.load(), kMinRemaps);
  monitor.unsubscribe(cache.get());
  cache.reset();
  EXPECT_EQ(0, be.live());
  munmap(base, kPages * kPage);
}

}  // namespace
}  // namespace gmd::rcache::test
