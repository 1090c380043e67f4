// Registration cache with many regions: the two-level index (leaves split, merge and disappear as
// regions come and go) and the eviction heap, checked against a model, plus lock-free hits while
// writers reshape the index. Fake addresses and the fake backend: no memory is touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gtest/common/fake_backend.h"
#include "gtest/rcache/stress.h"
#include "rcache/rcache.h"

namespace gmd::rcache::test {

using gmd::test::FakeBackend;
namespace {

constexpr std::uintptr_t kPage = 4096;
constexpr std::uintptr_t kBase = 0x200000000ull;  // fake addresses, never dereferenced

void* at(std::uintptr_t page) { return reinterpret_cast<void*>(kBase + page * kPage); }

class RcacheScaleTest : public ::testing::Test {
 protected:
  void make(Config cfg) { ASSERT_EQ(Cache::create(cfg, &cache_), Status::kOk); }
  void SetUp() override {
    Config cfg;
    cfg.max_unused_bytes = SIZE_MAX;
    make(cfg);
  }
  Region* get(std::uintptr_t page, std::size_t pages) {
    Region* r = nullptr;
    const Status st =
        cache_->get(at(page), pages * kPage, kAccessLocalRead, MemType::kHost, &be_, &r);
    EXPECT_EQ(st, Status::kOk) << statusString(st);
    if (st != Status::kOk) return nullptr;
    FakeBackend::hold(r);
    return r;
  }
  void put(Region* r) {
    FakeBackend::release(r);
    cache_->put(r);
  }

  FakeBackend be_;
  std::unique_ptr<Cache> cache_;
};

// Model: the cached regions as disjoint page intervals, first page -> end page. Random requests
// invalidate what they would overlap first, so that every miss registers exactly the request and
// the model stays exact; big invalidations empty whole stretches of the index (leaves merge and
// disappear), inserts in random order split leaves, and regions of several pages straddle the key
// of a leaf whose first entry left (the lookup falls back to the leaf before).
TEST_F(RcacheScaleTest, ManyRegionsMatchModel) {
  constexpr std::uintptr_t kPages = 6000;
  std::mt19937_64 rng(stressSeed());
  std::map<std::uintptr_t, std::uintptr_t> model;
  auto overlapping = [&](std::uintptr_t first, std::uintptr_t end) {
    auto it = model.upper_bound(first);
    if (it != model.begin() && std::prev(it)->second > first) --it;
    auto last = it;
    while (last != model.end() && last->first < end) ++last;
    return std::make_pair(it, last);
  };
  auto covering =
      [&](std::uintptr_t page) -> const std::pair<const std::uintptr_t, std::uintptr_t>* {
    auto it = model.upper_bound(page);
    if (it == model.begin()) return nullptr;
    --it;
    return it->second > page ? &*it : nullptr;
  };
  std::uint64_t expect_hits = 0, expect_misses = 0;
  std::size_t max_regions = 0;
  for (int op = 0; op < 40000; ++op) {
    const unsigned kind = static_cast<unsigned>(rng() % 100);
    if (kind < 55) {  // a miss on a free (or freed) range
      const std::uintptr_t first = rng() % (kPages - 8);
      const std::uintptr_t end = first + 1 + rng() % 4;
      auto [a, b] = overlapping(first, end);
      if (a != b) {
        cache_->invalidate(at(first), (end - first) * kPage);
        model.erase(a, b);
      }
      Region* r = get(first, end - first);
      ASSERT_NE(r, nullptr);
      ASSERT_EQ(r->start(), kBase + first * kPage);
      ASSERT_EQ(r->end(), kBase + end * kPage);
      put(r);
      model[first] = end;
      ++expect_misses;
    } else if (kind < 85 && !model.empty()) {  // a hit on a sub-range of a cached region
      auto it = model.lower_bound(rng() % kPages);
      if (it == model.end()) it = model.begin();
      const std::uintptr_t first = it->first + rng() % (it->second - it->first);
      const std::uintptr_t end = first + 1 + rng() % (it->second - first);
      Region* r = get(first, end - first);
      ASSERT_NE(r, nullptr);
      ASSERT_EQ(r->start(), kBase + it->first * kPage) << "op " << op;
      ASSERT_EQ(r->end(), kBase + it->second * kPage) << "op " << op;
      put(r);
      ++expect_hits;
    } else if (kind < 95) {  // find() on any page: a hit exactly where the model has a region
      const std::uintptr_t page = rng() % kPages;
      Region* r = nullptr;
      const auto* c = covering(page);
      ASSERT_EQ(cache_->find(at(page), kPage, kAccessLocalRead, &r), c != nullptr)
          << "op " << op << " page " << page;
      if (r != nullptr) {
        EXPECT_EQ(r->start(), kBase + c->first * kPage);
        cache_->put(r);
        ++expect_hits;
      }
    } else if (kind < 98) {  // a wide invalidation
      const std::uintptr_t first = rng() % kPages;
      const std::uintptr_t end = std::min(kPages, first + 1 + rng() % 600);
      cache_->invalidate(at(first), (end - first) * kPage);
      auto [a, b] = overlapping(first, end);
      model.erase(a, b);
      cache_->progress();  // find() answers false while deregistrations wait
    } else {
      cache_->progress();
    }
    max_regions = std::max(max_regions, model.size());
  }
  cache_->progress();
  EXPECT_GT(max_regions, 300u) << "too few regions to exercise several leaves";
  // Every page answers as the model says.
  for (std::uintptr_t page = 0; page < kPages; ++page) {
    Region* r = nullptr;
    const auto* c = covering(page);
    ASSERT_EQ(cache_->find(at(page), kPage, kAccessLocalRead, &r), c != nullptr) << page;
    if (r != nullptr) {
      EXPECT_EQ(r->start(), kBase + c->first * kPage);
      EXPECT_EQ(r->end(), kBase + c->second * kPage);
      cache_->put(r);
      ++expect_hits;
    }
  }
  const Stats s = cache_->stats();
  EXPECT_EQ(s.hits, expect_hits);
  EXPECT_EQ(s.misses, expect_misses);
  EXPECT_EQ(s.merges, 0u);
  EXPECT_EQ(s.regions, model.size());
  EXPECT_EQ(be_.live(), static_cast<long>(model.size()));
  // Invalidate everything: the index empties, every registration goes exactly once.
  cache_->invalidate(at(0), kPages * kPage);
  cache_->progress();
  EXPECT_EQ(cache_->stats().regions, 0u);
  EXPECT_EQ(be_.live(), 0);
  Region* r = nullptr;
  EXPECT_FALSE(cache_->find(at(0), kPage, kAccessLocalRead, &r));
  put(get(10, 1));  // and fills again
  cache_.reset();
  be_.expectAllDeregisteredOnce();
}

// Inserting in ascending and descending order splits leaves at either end; then removing every
// other region and then the rest shrinks and merges them. Every remaining region keeps hitting.
TEST_F(RcacheScaleTest, SplitsAndMergesKeepEveryRegionReachable) {
  constexpr std::uintptr_t kN = 1500;
  std::vector<std::uintptr_t> order(kN);
  std::iota(order.begin(), order.end(), std::uintptr_t{0});
  for (std::uintptr_t k : order) put(get(2 * k, 1));                // ascending
  for (std::uintptr_t k = kN; k-- > 0;) put(get(2 * (kN + k), 1));  // descending, above
  auto expectCached = [&](std::uintptr_t k, bool cached) {
    Region* r = nullptr;
    ASSERT_EQ(cache_->find(at(2 * k), kPage, kAccessLocalRead, &r), cached) << k;
    if (r != nullptr) {
      EXPECT_EQ(r->start(), kBase + 2 * k * kPage);
      cache_->put(r);
    }
  };
  for (std::uintptr_t k = 0; k < 2 * kN; ++k) expectCached(k, true);
  for (std::uintptr_t k = 0; k < 2 * kN; k += 2) cache_->invalidate(at(2 * k), kPage);
  cache_->progress();
  for (std::uintptr_t k = 0; k < 2 * kN; ++k) expectCached(k, k % 2 == 1);
  // Regions of three pages that straddle the freed pages, in the gaps.
  for (std::uintptr_t k = 2; k < 2 * kN; k += 4) {
    Region* r = get(2 * k - 1, 3);  // pages 2k-1 .. 2k+1: between regions 2k-2 and 2k+2
    ASSERT_NE(r, nullptr);
    put(r);
  }
  for (std::uintptr_t k = 1; k < 2 * kN; k += 2) cache_->invalidate(at(2 * k), kPage);
  cache_->progress();
  for (std::uintptr_t k = 2; k < 2 * kN; k += 4) {
    for (std::uintptr_t p = 2 * k - 1; p <= 2 * k + 1; ++p) {
      Region* r = nullptr;
      ASSERT_TRUE(cache_->find(at(p), kPage, kAccessLocalRead, &r)) << p;
      EXPECT_EQ(r->start(), kBase + (2 * k - 1) * kPage);
      cache_->put(r);
    }
  }
  EXPECT_EQ(cache_->stats().regions, (2 * kN) / 4);
  EXPECT_EQ(be_.live(), static_cast<long>((2 * kN) / 4));
}

// With max_regions N and N unused regions released in a random order (some of them used again,
// some held), every further miss evicts exactly the least recently released unused region.
TEST_F(RcacheScaleTest, EvictionFollowsReleaseOrderAtScale) {
  constexpr std::size_t kN = 600;
  Config cfg;
  cfg.max_regions = kN;
  cfg.max_unused_bytes = SIZE_MAX;
  make(cfg);
  std::mt19937_64 rng(stressSeed());
  std::vector<Region*> held(kN);
  std::vector<FakeBackend::Record*> rec(kN);
  for (std::size_t k = 0; k < kN; ++k) {
    held[k] = get(2 * k, 1);
    rec[k] = FakeBackend::record(held[k]);
  }
  std::vector<std::size_t> order(kN);  // release order: the eviction order we expect
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t k : order) put(held[k]);
  // Use a tenth of them again: they move to the back.
  std::vector<std::size_t> again(order.begin(), order.begin() + kN / 10);
  std::shuffle(again.begin(), again.end(), rng);
  order.erase(order.begin(), order.begin() + kN / 10);
  for (std::size_t k : again) {
    put(get(2 * k, 1));
    order.push_back(k);
  }
  // Hold five of the oldest: eviction passes over them.
  std::vector<Region*> kept;
  for (std::size_t j = 0; j < 5; ++j) {
    const std::size_t k = order[3 * j];
    kept.push_back(get(2 * k, 1));
  }
  for (std::size_t j = 5; j-- > 0;) order.erase(order.begin() + static_cast<long>(3 * j));
  for (std::size_t m = 0; m < order.size(); ++m) {
    Region* fresh = get(2 * (kN + m), 1);  // a miss: one eviction
    ASSERT_NE(fresh, nullptr);
    for (std::size_t j = 0; j <= m; ++j) {
      ASSERT_EQ(rec[order[j]]->deregs.load(), 1) << "miss " << m << " evicted out of order";
    }
    if (m + 1 < order.size()) {
      ASSERT_EQ(rec[order[m + 1]]->deregs.load(), 0) << "miss " << m << " evicted too much";
    }
    put(fresh);
    if (m == 0) {
      // The held ones are still there.
      for (Region* r : kept) EXPECT_EQ(FakeBackend::record(r)->deregs.load(), 0);
    }
  }
  for (Region* r : kept) EXPECT_EQ(FakeBackend::record(r)->deregs.load(), 0);
  EXPECT_EQ(cache_->stats().evictions, order.size());
  EXPECT_EQ(cache_->stats().regions, kN);
  for (Region* r : kept) put(r);
}

// Threads hit their own regions (lock-free) while a writer fills and empties thousands of others
// around them, so leaves split, merge and disappear and the Top is replaced under the readers.
// Every hit returns the reader's own region, readers never miss, nothing is deregistered while
// held (the backend's oracle), and the sanitizers see no race or use after free.
TEST_F(RcacheScaleTest, HitsStayCorrectWhileWritersReshapeTheIndex) {
  constexpr int kReaders = 3;
  constexpr std::uintptr_t kSpread = 3000;  // pages the writer churns through (its regions: even)
  auto readerPage = [](int t) { return kSpread / 4 * static_cast<std::uintptr_t>(t + 1) + 1; };
  std::vector<Region*> own;
  for (int t = 0; t < kReaders; ++t) {
    own.push_back(get(readerPage(t), 1));
    put(own.back());
  }
  std::atomic<bool> stop{false};
  std::atomic<long> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&, t] {
      long n = 0;
      while (!stop.load(std::memory_order_relaxed) || n < 1000) {
        Region* r = nullptr;
        if (cache_->get(at(readerPage(t)), kPage, kAccessLocalRead, MemType::kHost, &be_, &r) !=
            Status::kOk) {
          wrong.fetch_add(1);
          continue;
        }
        if (r != own[static_cast<std::size_t>(t)]) wrong.fetch_add(1);
        FakeBackend::hold(r);
        FakeBackend::release(r);
        cache_->put(r);
        ++n;
      }
    });
  }
  std::mt19937_64 rng(stressSeed() + 1);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(stressSeconds() / 2);
  std::uint64_t writer_misses = 0;
  int rounds = 0;
  while (std::chrono::steady_clock::now() < deadline || rounds < 2) {
    std::vector<std::uintptr_t> pages;
    for (std::uintptr_t p = 0; p < kSpread; p += 2) pages.push_back(p);
    std::shuffle(pages.begin(), pages.end(), rng);
    for (std::uintptr_t p : pages) put(get(p, 1));
    writer_misses += pages.size();
    std::shuffle(pages.begin(), pages.end(), rng);
    for (std::size_t k = 0; k < pages.size(); ++k) {
      cache_->invalidate(at(pages[k]), kPage);  // even pages only
      // Drain the queue now and then: a full queue would be applied conservatively (the whole
      // index dropped, readers' regions included).
      if (k % 256 == 255) cache_->progress();
    }
    cache_->progress();
    ++rounds;
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  const Stats s = cache_->stats();
  EXPECT_EQ(s.invalidation_overflows, 0u);
  EXPECT_EQ(s.misses, writer_misses + kReaders) << "a reader missed its own region";
  EXPECT_EQ(s.regions, static_cast<std::uint64_t>(kReaders));
  EXPECT_EQ(be_.premature(), 0);
  cache_.reset();
  be_.expectAllDeregisteredOnce();
}

// Every thread gets, holds, invalidates and releases random ranges over thousands of pages, with
// limits that force evictions: the index reshapes under concurrent misses, invalidations (applied
// by whichever thread holds the writer lock, or queued) and evictions. The oracle checks that no
// registration is deregistered while held and that each is deregistered exactly once.
TEST_F(RcacheScaleTest, ConcurrentChurnOverThousandsOfRegions) {
  Config cfg;
  cfg.max_regions = 1500;
  cfg.max_unused_bytes = 1000 * kPage;
  make(cfg);
  constexpr std::uintptr_t kPages = 5000;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(stressSeconds() / 2);
  std::atomic<long> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(stressSeed() * 4 + static_cast<std::uint64_t>(t));
      std::vector<Region*> held;
      for (long op = 0; std::chrono::steady_clock::now() < deadline || op < 2000; ++op) {
        const unsigned kind = static_cast<unsigned>(rng() % 100);
        if (kind < 60) {
          const std::uintptr_t first = rng() % (kPages - 4);
          Region* r = nullptr;
          const Status st = cache_->get(at(first), kPage * (1 + rng() % 3), kAccessLocalRead,
                                        MemType::kHost, &be_, &r);
          if (st == Status::kOk) {
            FakeBackend::hold(r);
            held.push_back(r);
          } else if (st != Status::kNoResource) {  // every region held: allowed by the limits
            failures.fetch_add(1);
          }
        } else if (kind < 75) {
          cache_->invalidate(at(rng() % kPages), kPage * (1 + rng() % 8));
        } else if (kind < 77) {
          cache_->progress();
        }
        if (held.size() > 8 || (kind >= 77 && !held.empty())) {
          const std::size_t k = rng() % held.size();
          FakeBackend::release(held[k]);
          cache_->put(held[k]);
          held.erase(held.begin() + static_cast<long>(k));
        }
      }
      for (Region* r : held) {
        FakeBackend::release(r);
        cache_->put(r);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  cache_->progress();
  const Stats s = cache_->stats();
  EXPECT_LE(s.regions, cfg.max_regions);
  EXPECT_EQ(static_cast<long>(s.regions), be_.live());
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(be_.premature(), 0);
  cache_.reset();
  EXPECT_EQ(be_.live(), 0);
  be_.expectAllDeregisteredOnce();
}

}  // namespace
}  // namespace gmd::rcache::test
