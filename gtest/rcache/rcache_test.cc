// Unit tests of gmd's registration cache: one test (or more) per rule of the design notes, through
// a fake backend whose oracle knows who registered what. No real memory is touched here (the
// backend does not read it); rcache_ucm_test.cc covers real system calls.
#include "rcache/rcache.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/common/fake_backend.h"
#include "gtest/rcache/stress.h"
#include "rcache/cache_impl.h"

namespace gmd::rcache::test {

using gmd::test::FakeBackend;
namespace {

constexpr std::uintptr_t kPage = 4096;
constexpr std::uintptr_t kBase = 0x100000000ull;  // fake addresses, never dereferenced

void* at(std::uintptr_t page) { return reinterpret_cast<void*>(kBase + page * kPage); }

class RcacheTest : public ::testing::Test {
 protected:
  void make(Config cfg = Config{}) { ASSERT_EQ(Cache::create(cfg, &cache_), Status::kOk); }
  // A cache limited to two regions, full: pages 0 (*a) and 2 (*b), both held.
  void makeFullOfTwo(Region** a, Region** b) {
    Config cfg;
    cfg.max_regions = 2;
    make(cfg);
    *a = get(0, 1);
    *b = get(2, 1);
  }
  // The same with both released, page 0 first (the next victim); its record.
  FakeBackend::Record* makeFullOfTwoUnused() {
    Region *a, *b;
    makeFullOfTwo(&a, &b);
    FakeBackend::Record* ra = FakeBackend::record(a);
    put(a);
    put(b);
    return ra;
  }
  void SetUp() override { make(); }
  // Region a at `a_page` (`a_pages` long) and b at `b_page` (one page), released in that order:
  // a's hold parked in this thread's empty slot, b unused. Their records.
  std::pair<FakeBackend::Record*, FakeBackend::Record*> parkedThenUnused(std::uintptr_t a_page,
                                                                         std::size_t a_pages,
                                                                         std::uintptr_t b_page) {
    Region* a = get(a_page, a_pages);
    Region* b = get(b_page, 1);
    const auto records = std::make_pair(FakeBackend::record(a), FakeBackend::record(b));
    put(a);
    put(b);
    return records;
  }

  // get() with oracle bookkeeping.
  Region* get(std::uintptr_t first_page, std::size_t pages, unsigned access = kAccessLocalRead,
              Status expect = Status::kOk) {
    Region* r = nullptr;
    const Status st = cache_->get(at(first_page), pages * kPage, access, MemType::kHost, &be_, &r);
    EXPECT_EQ(st, expect) << statusString(st);
    if (st != Status::kOk) return nullptr;
    EXPECT_NE(r, nullptr);
    FakeBackend::hold(r);
    return r;
  }
  void put(Region* r) {
    FakeBackend::release(r);
    cache_->put(r);
  }
  void invalidate(std::uintptr_t first_page, std::size_t pages) {
    cache_->invalidate(at(first_page), pages * kPage);
  }

  FakeBackend be_;
  std::unique_ptr<Cache> cache_;
};

// ---- Rule 1: page alignment
// -----------------------------------------------------------------------

TEST_F(RcacheTest, Rule1AlignsOutwardsToPages) {
  Region* r = nullptr;
  ASSERT_EQ(cache_->get(static_cast<char*>(at(3)) + 100, kPage, kAccessLocalRead, MemType::kHost,
                        &be_, &r),
            Status::kOk);
  EXPECT_EQ(r->start(), kBase + 3 * kPage);
  EXPECT_EQ(r->end(), kBase + 5 * kPage);  // 100 bytes into page 3 + one page reaches page 4
  EXPECT_EQ(FakeBackend::record(r)->start, r->start());
  EXPECT_EQ(FakeBackend::record(r)->length, 2 * kPage);
  cache_->put(r);
}

TEST_F(RcacheTest, Rule1AlignmentIsConfigurable) {
  Config cfg;
  cfg.alignment = 64 * 1024;
  make(cfg);
  Region* r = get(17, 1);
  EXPECT_EQ(r->start() % cfg.alignment, 0u);
  EXPECT_EQ(r->end() % cfg.alignment, 0u);
  EXPECT_LE(r->start(), kBase + 17 * kPage);
  EXPECT_GE(r->end(), kBase + 18 * kPage);
  put(r);
}

// ---- Rule 2: hits need coverage and access; a hit takes a reference
// ----------------------------------

TEST_F(RcacheTest, Rule2HitNeedsFullCoverage) {
  Region* a = get(0, 3);
  Region* b = get(1, 1);  // inside: hit
  EXPECT_EQ(a, b);
  EXPECT_EQ(be_.regCalls(), 1);
  put(b);
  Region* c = get(2, 2);  // sticks out of [0, 3): miss
  EXPECT_NE(c, a);
  EXPECT_EQ(be_.regCalls(), 2);
  put(c);
  put(a);
  const Stats s = cache_->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
}

// A hit looks first at the region the thread released last (its parked hold), then in the index:
// that region must still cover the whole request, at its start as at its end.
TEST_F(RcacheTest, Rule2TheRegionReleasedLastServesOnlyWhatItCovers) {
  Region* a = get(2, 2);  // [2, 4)
  put(a);
  Region* b = get(1, 2);  // [1, 3): begins before a
  EXPECT_NE(b, a);
  EXPECT_LE(b->start(), kBase + 1 * kPage);
  EXPECT_GE(b->end(), kBase + 3 * kPage);
  put(b);
  Region* c = get(3, 2);  // [3, 5): ends after b
  EXPECT_NE(c, b);
  EXPECT_LE(c->start(), kBase + 3 * kPage);
  EXPECT_GE(c->end(), kBase + 5 * kPage);
  put(c);
  Region* d = get(1, 4);  // [1, 5): c, the union of all three
  EXPECT_EQ(d, c);
  put(d);
  Region* e = nullptr;
  ASSERT_TRUE(cache_->find(at(4), kPage, kAccessLocalRead, &e));
  EXPECT_EQ(e, c);
  cache_->put(e);
  EXPECT_FALSE(cache_->find(at(4), 2 * kPage, kAccessLocalRead, &e)) << "[4, 6) ends after c";
  EXPECT_FALSE(cache_->find(at(0), 2 * kPage, kAccessLocalRead, &e)) << "[0, 2) begins before c";
  const Stats s = cache_->stats();
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(be_.regCalls(), 3);
}

// Stats::locked_hits tells the hits the writer lock answered from the lock-free ones: a get() with
// an invalidation queued (here: queued while a writer held the lock) applies it under the lock and
// finds its region there; the next get() is lock-free again.
TEST_F(RcacheTest, HitsFoundUnderTheLockAreCountedApart) {
  Region* a = get(0, 2);
  put(a);
  EXPECT_EQ(a, get(0, 2));  // lock-free
  put(a);
  detail::WriterLock& lock = static_cast<detail::CacheImpl*>(cache_.get())->writerLockForTests();
  lock.lock();
  invalidate(10, 1);  // another range: can only be queued
  lock.unlock();
  EXPECT_EQ(a, get(0, 2));  // the queue first, under the lock: a hit there
  put(a);
  Stats s = cache_->stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.locked_hits, 1u);
  EXPECT_EQ(a, get(0, 2));  // nothing queued now: lock-free
  put(a);
  s = cache_->stats();
  EXPECT_EQ(s.hits, 3u);
  EXPECT_EQ(s.locked_hits, 1u);
  EXPECT_EQ(s.misses, 1u);
}

// A thread that takes regions from two caches in turn (one memory domain per device) finds its
// slot of neither cache in its thread-local shortcut at each get() and put() (it holds one cache's
// at a time), so each call goes the way of a first use. Every hit is still lock-free and the
// right region, and an invalidation in one cache leaves the other's region alone.
TEST_F(RcacheTest, TwoCachesInTurnHitLockFreeAndAnInvalidationStaysInItsCache) {
  // The same backend for both: only the cache tells their regions apart.
  std::unique_ptr<Cache> other;
  ASSERT_EQ(Status::kOk, Cache::create(Config{}, &other));
  auto otherGet = [&](std::uintptr_t page) {
    Region* r = nullptr;
    EXPECT_EQ(Status::kOk, other->get(at(page), kPage, kAccessLocalRead, MemType::kHost, &be_, &r));
    return r;
  };
  Region* a = get(0, 1);
  FakeBackend::Record* const ra = FakeBackend::record(a);
  put(a);
  Region* b = otherGet(0);  // the same address, in the other cache
  FakeBackend::Record* const rb = FakeBackend::record(b);
  other->put(b);
  for (int k = 0; k < 100; ++k) {
    ASSERT_EQ(a, get(0, 1)) << "round " << k;
    put(a);
    ASSERT_EQ(b, otherGet(0)) << "round " << k;
    other->put(b);
  }
  Stats s = cache_->stats();
  EXPECT_EQ(s.hits, 100u);
  EXPECT_EQ(s.locked_hits, 0u);
  EXPECT_EQ(other->stats().hits, 100u);
  EXPECT_EQ(other->stats().locked_hits, 0u);
  // Both holds parked again, then the range freed as this cache sees it.
  EXPECT_EQ(a, get(0, 1));
  put(a);
  other->put(otherGet(0));
  invalidate(0, 1);
  Region* a2 = get(0, 1);
  EXPECT_NE(a, a2) << "the invalidated region was handed out";
  EXPECT_EQ(1, ra->deregs.load());
  put(a2);
  EXPECT_EQ(b, otherGet(0)) << "the other cache lost its region";
  other->put(b);
  EXPECT_EQ(0, rb->deregs.load());
  s = cache_->stats();
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.hits, 101u);
  EXPECT_EQ(other->stats().hits, 102u);
  other.reset();
  EXPECT_EQ(1, rb->deregs.load());
}

TEST_F(RcacheTest, Rule2HitNeedsRequestedAccess) {
  Region* a = get(0, 2, kAccessLocalRead);
  put(a);
  Region* b = get(0, 2, kAccessLocalRead | kAccessRemoteWrite);
  EXPECT_NE(a, b);
  EXPECT_EQ(b->access() & (kAccessLocalRead | kAccessRemoteWrite),
            kAccessLocalRead | kAccessRemoteWrite);
  put(b);
  Region* c = get(0, 1, kAccessRemoteWrite);  // b has it: hit
  EXPECT_EQ(c, b);
  put(c);
}

TEST_F(RcacheTest, Rule2HitNeedsSameBackendAndMemType) {
  FakeBackend other;
  Region* a = get(0, 1);
  put(a);
  Region* b = nullptr;
  ASSERT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &other, &b), Status::kOk);
  EXPECT_NE(a, b);
  EXPECT_EQ(b->backend(), &other);
  cache_->put(b);
  cache_.reset();
  be_.expectAllDeregisteredOnce();
  other.expectAllDeregisteredOnce();
}

TEST_F(RcacheTest, Rule2FindHitsOnlyValidCoveringRegionsWithAccess) {
  Region* a = get(0, 3, kAccessLocalRead | kAccessRemoteRead);
  put(a);
  Region* r = nullptr;
  ASSERT_TRUE(cache_->find(at(1), kPage, kAccessRemoteRead, &r));
  EXPECT_EQ(a, r);
  EXPECT_FALSE(cache_->find(at(1), kPage, kAccessRemoteWrite, &r)) << "access not held";
  EXPECT_FALSE(cache_->find(at(2), 2 * kPage, kAccessLocalRead, &r)) << "not covered";
  EXPECT_FALSE(cache_->find(at(1), 0, kAccessLocalRead, &r)) << "zero length";
  cache_->put(a);  // the hold find() took
  const Stats s = cache_->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u) << "find() misses are not counted";
  invalidate(0, 1);
  EXPECT_FALSE(cache_->find(at(1), kPage, kAccessLocalRead, &r)) << "invalidated region found";
  EXPECT_EQ(be_.regCalls(), 1) << "find() never registers";
}

TEST_F(RcacheTest, Rule2HeldRegionIsNotDeregisteredUntilReleased) {
  Region* a = get(0, 1);
  invalidate(0, 1);
  cache_->progress();
  EXPECT_EQ(be_.live(), 1);
  put(a);
  EXPECT_EQ(be_.live(), 0);
  EXPECT_EQ(be_.premature(), 0);
}

// ---- Rule 3: overlapping misses register the union
// --------------------------------------------------

TEST_F(RcacheTest, Rule3OverlapRegistersUnionAndKeepsOldForHolder) {
  Region* a = get(0, 2, kAccessLocalRead);
  Region* b = get(1, 2, kAccessRemoteRead);  // overlaps a on page 1
  ASSERT_NE(a, b);
  EXPECT_EQ(b->start(), kBase);
  EXPECT_EQ(b->end(), kBase + 3 * kPage);
  EXPECT_EQ(b->access(), kAccessLocalRead | kAccessRemoteRead);
  EXPECT_EQ(cache_->stats().merges, 1u);
  // a left the index: a request inside a's range now hits b.
  Region* c = get(0, 1);
  EXPECT_EQ(c, b);
  put(c);
  // a is still registered for its holder, deregistered at its release.
  EXPECT_EQ(be_.live(), 2);
  put(a);
  EXPECT_EQ(be_.live(), 1);
  put(b);
  EXPECT_EQ(be_.live(), 1);  // b stays cached
  cache_.reset();
  be_.expectAllDeregisteredOnce();
}

TEST_F(RcacheTest, Rule3UnusedOverlappedRegionsAreDeregistered) {
  put(get(0, 1));
  put(get(4, 1));
  Region* u = get(0, 5);
  EXPECT_EQ(u->start(), kBase);
  EXPECT_EQ(u->end(), kBase + 5 * kPage);
  EXPECT_EQ(be_.live(), 1);  // both absorbed regions deregistered, outside the lock, at once
  put(u);
  EXPECT_EQ(cache_->stats().regions, 1u);
}

// ---- Rule 4: invalidation
// -------------------------------------------------------------------------

thread_local bool tls_inside_invalidate = false;

TEST_F(RcacheTest, Rule4InvalidateNeverDeregistersInside) {
  be_.forbidDeregWhile(&tls_inside_invalidate);
  for (int i = 0; i < 8; ++i) put(get(static_cast<std::uintptr_t>(i) * 2, 1));
  tls_inside_invalidate = true;
  invalidate(0, 16);
  tls_inside_invalidate = false;
  EXPECT_EQ(be_.deregsInForbidden(), 0);
  EXPECT_EQ(be_.live(), 8);                // queued, not yet deregistered
  EXPECT_EQ(cache_->stats().regions, 0u);  // ... but they left the index at once
  EXPECT_EQ(cache_->stats().invalidations_unused, 8u);
  cache_->progress();
  EXPECT_EQ(be_.live(), 0);
}

TEST_F(RcacheTest, Rule4InvalidateLeavesIndexImmediatelyEvenInUse) {
  Region* a = get(0, 4);
  invalidate(2, 1);
  Region* b = get(0, 1);  // a is invalid: never returned again
  EXPECT_NE(a, b);
  EXPECT_EQ(be_.live(), 2);
  const Stats s = cache_->stats();
  EXPECT_EQ(s.invalidations_in_use, 1u);
  EXPECT_EQ(s.deferred_deregs, 1u);
  put(a);
  EXPECT_EQ(be_.live(), 1);
  put(b);
}

TEST_F(RcacheTest, Rule4SharedPageKeptUntilBothBuffersAreDone) {
  // Two in-flight buffers share page 2: [0, 3) and [2, 5) (one region after the merge, two holds).
  Region* a = get(0, 3);
  Region* b = get(2, 3);
  invalidate(2, 1);  // page 2 goes away
  cache_->progress();
  EXPECT_EQ(be_.live(), 2);
  put(b);
  EXPECT_EQ(be_.live(), 1);  // a still holds the registration of page 2
  put(a);
  EXPECT_EQ(be_.live(), 0);
  EXPECT_EQ(be_.premature(), 0);
}

TEST_F(RcacheTest, Rule4InvalidateOfUnrelatedRangeKeepsRegion) {
  Region* a = get(0, 2);
  put(a);
  invalidate(2, 10);
  Region* b = get(0, 2);
  EXPECT_EQ(a, b);
  put(b);
}

// ---- Rule 5: the seed scenario
// ----------------------------------------------------------------------

TEST_F(RcacheTest, SeedScenarioPageRemappedYieldsNewRegistration) {
  // Register pages 0-2, then page 1 (a hit).
  Region* whole = get(0, 3);
  Region* page1 = get(1, 1);
  ASSERT_EQ(whole, page1);
  FakeBackend::Record* old_rec = FakeBackend::record(whole);
  // Release 0-2; page 1 is still in flight.
  put(whole);
  // Page 2 is unmapped (the hook fires) and a new page is mapped there.
  invalidate(2, 1);
  // Registering 0-2 again yields a new registration of the new page...
  Region* again = get(0, 3);
  EXPECT_NE(again, page1);
  EXPECT_NE(FakeBackend::record(again), old_rec);
  EXPECT_EQ(old_rec->deregs.load(), 0);  // ... while page 1's holder keeps the old one
  EXPECT_EQ(be_.live(), 2);
  put(again);
  put(page1);
  EXPECT_EQ(old_rec->deregs.load(), 1);  // deregistered at its last release, exactly once
  EXPECT_EQ(be_.premature(), 0);
}

TEST_F(RcacheTest, Rule5InvalidRegionNeverReturnedAgain) {
  // Region objects may be recycled at the same address: compare registrations, not pointers.
  Region* a = get(0, 1);
  FakeBackend::Record* ra = FakeBackend::record(a);
  put(a);
  invalidate(0, 1);
  for (int i = 0; i < 3; ++i) {
    Region* b = get(0, 1);
    EXPECT_EQ(FakeBackend::record(b)->deregs.load(), 0);
    EXPECT_NE(FakeBackend::record(b), ra);
    put(b);
  }
  EXPECT_EQ(ra->deregs.load(), 1);
}

// ---- Rule 6: limits, LRU eviction, resource failures
// ------------------------------------------------

TEST_F(RcacheTest, Rule6MaxRegionsEvictsLeastRecentlyUsed) {
  Config cfg;
  cfg.max_regions = 3;
  make(cfg);
  Region* a = get(0, 1);
  Region* b = get(2, 1);
  Region* c = get(4, 1);
  FakeBackend::Record *ra = FakeBackend::record(a), *rb = FakeBackend::record(b),
                      *rc = FakeBackend::record(c);
  put(a);
  put(b);
  put(c);
  put(get(0, 1));  // a used again: b is now the least recently used
  Region* d = get(6, 1);
  EXPECT_EQ(cache_->stats().evictions, 1u);
  EXPECT_EQ(rb->deregs.load(), 1);
  EXPECT_EQ(ra->deregs.load(), 0);
  EXPECT_EQ(rc->deregs.load(), 0);
  EXPECT_EQ(cache_->stats().regions, 3u);
  put(d);
}

TEST_F(RcacheTest, Rule6EvictsUnusedOnlyAndFailsWhenAllInUse) {
  Region *a, *b;
  makeFullOfTwo(&a, &b);
  FakeBackend::Record* ra = FakeBackend::record(a);
  get(4, 1, kAccessLocalRead, Status::kNoResource);
  EXPECT_EQ(be_.live(), 2);
  EXPECT_EQ(cache_->stats().evictions, 0u);
  put(a);
  Region* c = get(4, 1);  // now a can go
  EXPECT_EQ(ra->deregs.load(), 1);
  put(b);
  put(c);
}

// A miss that evicts deregisters its victims itself, before it registers (so that a device with
// a registration limit never sees more than the cache's limits), and nobody else touches them.
TEST_F(RcacheTest, Rule6AMissDeregistersItsVictimsBeforeItRegisters) {
  FakeBackend::Record* ra = makeFullOfTwoUnused();
  int live_at_reg = -1;
  be_.onReg([&](std::uintptr_t, std::size_t) { live_at_reg = be_.live(); });
  Region* c = get(4, 1);
  be_.onReg(nullptr);
  EXPECT_EQ(live_at_reg, 1) << "the victim was still registered when the new region was";
  EXPECT_EQ(ra->deregs.load(), 1);
  EXPECT_EQ(cache_->stats().evictions, 1u);
  EXPECT_EQ(cache_->stats().regions, 2u);
  // The victim left the index: its range is a miss again (and evicts b).
  Region* a2 = get(0, 1);
  EXPECT_NE(FakeBackend::record(a2), ra);
  put(c);
  put(a2);
}

// A miss whose registration fails after it evicted still deregisters and retires its victims:
// counters stay exact, nothing leaks (the backend checks every registration is deregistered once,
// LeakSanitizer the regions), and the cache works on.
TEST_F(RcacheTest, Rule6VictimsOfAMissThatFailsAreStillDeregisteredAndFreed) {
  FakeBackend::Record* ra = makeFullOfTwoUnused();
  be_.failNext(Status::kIoError);
  get(4, 1, kAccessLocalRead, Status::kIoError);
  EXPECT_EQ(ra->deregs.load(), 1);
  EXPECT_EQ(be_.live(), 1);
  EXPECT_EQ(cache_->stats().regions, 1u);
  EXPECT_EQ(cache_->stats().evictions, 1u);
  cache_->progress();
  Region* c = get(4, 1);
  Region* d = get(6, 1);  // evicts b
  EXPECT_EQ(cache_->stats().regions, 2u);
  EXPECT_EQ(be_.live(), 2);
  put(c);
  put(d);
}

TEST_F(RcacheTest, Rule6MaxPinnedBytes) {
  Config cfg;
  cfg.max_pinned_bytes = 4 * kPage;
  make(cfg);
  Region* a = get(0, 2);
  FakeBackend::Record* ra = FakeBackend::record(a);
  put(a);
  Region* b = get(10, 2);
  Region* c = get(20, 2);  // 6 pages > 4: a (unused) is evicted
  EXPECT_EQ(ra->deregs.load(), 1);
  EXPECT_LE(cache_->stats().pinned_bytes, 4 * kPage);
  get(30, 5, kAccessLocalRead, Status::kExceedsLimit);  // alone over the limit
  put(b);
  put(c);
}

TEST_F(RcacheTest, Rule6MaxUnusedBytes) {
  Config cfg;
  cfg.max_unused_bytes = 2 * kPage;
  make(cfg);
  Region* a = get(0, 1);
  Region* b = get(2, 1);
  Region* c = get(4, 1);
  FakeBackend::Record *ra = FakeBackend::record(a), *rc = FakeBackend::record(c);
  put(a);
  put(b);
  EXPECT_EQ(cache_->stats().unused_bytes, 2 * kPage);
  put(c);  // 3 pages unused > 2: the least recently released (a) goes
  cache_->progress();
  EXPECT_LE(cache_->stats().unused_bytes, 2 * kPage);
  EXPECT_EQ(ra->deregs.load(), 1);
  EXPECT_EQ(rc->deregs.load(), 0);
  EXPECT_EQ(cache_->stats().evictions, 1u);
}

TEST_F(RcacheTest, Rule6NoResourceEvictsAndRetriesOnce) {
  put(get(0, 1));
  put(get(2, 1));
  be_.failNext(Status::kNoResource);
  Region* c = get(4, 1);  // fails once, evicts the two unused regions, succeeds on retry
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(be_.regCalls(), 4);
  EXPECT_EQ(be_.live(), 1);
  EXPECT_EQ(cache_->stats().evictions, 2u);
  put(c);
}

TEST_F(RcacheTest, Rule6NoResourceTwiceFailsWithClearStatus) {
  be_.failNext(Status::kNoResource, 2);
  get(0, 1, kAccessLocalRead, Status::kNoResource);
  EXPECT_EQ(be_.regCalls(), 2);  // one retry, no more
  EXPECT_EQ(cache_->stats().regions, 0u);
  EXPECT_EQ(cache_->stats().pinned_bytes, 0u);
}

// ---- Rule 7: a failed registration leaves nothing behind
// ---------------------------------------------

TEST_F(RcacheTest, Rule7FailedRegistrationLeavesNothing) {
  be_.failNext(Status::kIoError);
  get(0, 2, kAccessLocalRead, Status::kIoError);
  Stats s = cache_->stats();
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_EQ(be_.live(), 0);
  Region* a = get(0, 2);  // a fresh miss, not a stale entry
  EXPECT_EQ(be_.regCalls(), 2);
  put(a);
}

TEST_F(RcacheTest, Rule7FailedMergeKeepsExistingRegions) {
  Region* a = get(0, 2);
  put(a);
  be_.failNext(Status::kUnsupported, 2);  // the union, then the request alone
  get(1, 3, kAccessLocalRead, Status::kUnsupported);
  Region* b = get(0, 2);  // the old region is still indexed and valid
  EXPECT_EQ(a, b);
  put(b);
}

// ---- Rule 8: concurrency and re-entrancy
// ------------------------------------------------------------

TEST_F(RcacheTest, Rule8ReentrantInvalidateFromDeregistration) {
  // A deregistration that unmaps memory raises an invalidation on the same thread, inside the
  // cache.
  Region* victim = get(10, 1);
  FakeBackend::Record* rv = FakeBackend::record(victim);
  put(victim);
  Region* a = get(0, 1);
  put(a);
  FakeBackend::Record* arec = FakeBackend::record(a);
  be_.onDereg([&](FakeBackend::Record* rec) {
    if (rec == arec) cache_->invalidate(at(10), kPage);
  });
  invalidate(0, 1);
  cache_->progress();  // deregisters a, whose deregistration invalidates page 10
  EXPECT_EQ(rv->deregs.load(), 1);
  be_.onDereg(nullptr);
  Region* b = get(10, 1);
  EXPECT_NE(FakeBackend::record(b), rv);
  put(b);
}

TEST_F(RcacheTest, Rule8InvalidationDuringRegistrationIsNeverCached) {
  // The memory being registered is unmapped while the backend registers it (same thread, inside
  // get()). The requester may use what it asked for, but nobody gets it from the cache afterwards.
  bool once = true;
  be_.onReg([&](std::uintptr_t, std::size_t) {
    if (once) {
      once = false;
      cache_->invalidate(at(0), kPage);
    }
  });
  Region* a = get(0, 2);
  Region* b = get(0, 2);
  EXPECT_NE(a, b);
  put(a);
  put(b);
  EXPECT_EQ(be_.live(), 1);
}

TEST_F(RcacheTest, Rule3OverlapRegisteredWhileAMissRegistersIsMergedAway) {
  // A miss that found nothing overlapping its request registers without a first pass under the
  // lock; a region registered meanwhile over part of its range (here from inside its backend
  // call) must not stay indexed beside the new one.
  Region* b = nullptr;
  be_.onReg([&](std::uintptr_t start, std::size_t) {
    if (start == reinterpret_cast<std::uintptr_t>(at(2)) && b == nullptr) {
      b = get(1, 2);  // pages 1-2, over page 2
    }
  });
  Region* a = get(2, 2);  // pages 2-3
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->start(), reinterpret_cast<std::uintptr_t>(at(2)));
  EXPECT_EQ(cache_->stats().merges, 1u);
  Region* r = nullptr;
  EXPECT_TRUE(cache_->find(at(2), 2 * kPage, kAccessLocalRead, &r));
  EXPECT_EQ(r, a);
  if (r != nullptr) cache_->put(r);
  EXPECT_FALSE(cache_->find(at(1), kPage, kAccessLocalRead, &r)) << "b is out of the index";
  put(b);  // its last hold: deregistered
  put(a);
  EXPECT_EQ(be_.live(), 1);
  EXPECT_EQ(cache_->stats().regions, 1u);
}

TEST_F(RcacheTest, Rule8ConcurrentHitsOnOneRegionCountExactly) {
  put(get(0, 16));
  constexpr int kThreads = 4, kIters = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        Region* r = nullptr;
        ASSERT_EQ(cache_->get(at(static_cast<std::uintptr_t>((t + i) % 16)), kPage,
                              kAccessLocalRead, MemType::kHost, &be_, &r),
                  Status::kOk);
        cache_->put(r);
      }
    });
  }
  for (auto& t : ts) t.join();
  const Stats s = cache_->stats();
  EXPECT_EQ(s.hits, static_cast<std::uint64_t>(kThreads) * kIters);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.unused_bytes, 16 * kPage);
}

TEST_F(RcacheTest, Rule8ConcurrentInvalidateAndGet) {
  // Readers hammer page ranges while another thread invalidates them; afterwards nothing is held,
  // every registration is deregistered exactly once after destruction and none while held.
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t) {
    ts.emplace_back([&, t] {
      unsigned i = static_cast<unsigned>(t);
      while (!stop.load()) {
        Region* r = nullptr;
        if (cache_->get(at(i % 32), 2 * kPage, kAccessLocalRead, MemType::kHost, &be_, &r) ==
            Status::kOk) {
          FakeBackend::hold(r);
          FakeBackend::release(r);
          cache_->put(r);
        }
        i += 7;
      }
    });
  }
  for (int k = 0; k < 20000; ++k) invalidate(static_cast<std::uintptr_t>(k % 33), 1);
  stop = true;
  for (auto& t : ts) t.join();
  cache_.reset();
  EXPECT_EQ(be_.live(), 0);
  EXPECT_EQ(be_.premature(), 0);
  be_.expectAllDeregisteredOnce();
}

// ---- Rule 9: fork
// ---------------------------------------------------------------------------------

TEST_F(RcacheTest, Rule9ForkChildNeverUsesParentRegistrations) {
  Region* cached = get(0, 1);
  FakeBackend::Record* rcached = FakeBackend::record(cached);
  put(cached);
  Region* held = get(4, 1);
  FakeBackend::Record* rheld = FakeBackend::record(held);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: plain checks and _exit codes (no gtest machinery across fork).
    int code = 0;
    const long deregs_at_fork = be_.deregCalls();
    Region* r = nullptr;
    if (cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &be_, &r) != Status::kOk) {
      code = 10;
    } else if (FakeBackend::record(r) == rcached) {
      code = 11;  // handed out the parent's registration
    }
    if (code == 0 && cache_->stats().regions != 1) code = 12;
    Region* h = nullptr;
    if (code == 0 &&
        (cache_->get(at(4), kPage, kAccessLocalRead, MemType::kHost, &be_, &h) != Status::kOk ||
         h == held)) {
      code = 15;  // the parent's held registration is not the child's either
    }
    if (h != nullptr) cache_->put(h);
    if (r != nullptr) cache_->put(r);
    cache_->put(held);  // the parent's: must not be deregistered by the child
    cache_->invalidate(at(0), 64 * kPage);
    cache_->progress();
    if (code == 0 && be_.deregCalls() != deregs_at_fork + 2) code = 13;  // only the child's own
    if (code == 0 && rheld->deregs.load() != 0) code = 14;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child check failed (see codes in the test)";
  // The parent keeps what it holds; what nobody held was deregistered just before the fork.
  EXPECT_EQ(1, rcached->deregs.load());
  EXPECT_EQ(0, rheld->deregs.load());
  EXPECT_EQ(1u, cache_->stats().regions);
  Region* again = get(4, 1);
  EXPECT_EQ(again, held);
  put(again);
  put(held);
  Region* fresh = get(0, 1);
  EXPECT_NE(rcached, FakeBackend::record(fresh));
  put(fresh);
}

// What UCX's cache does before fork(): unused registrations are deregistered in the parent, so that
// with ibv_fork_init() only memory the application still holds registered is do-not-fork.
TEST_F(RcacheTest, Rule9ForkDeregistersUnusedRegionsInTheParentFirst) {
  Region* a = get(0, 2);
  Region* b = get(8, 1);
  Region* held = get(16, 1);
  FakeBackend::Record* ra = FakeBackend::record(a);
  FakeBackend::Record* rb = FakeBackend::record(b);
  put(a);
  put(b);
  const std::uint64_t evictions = cache_->stats().evictions;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The parent deregistered them before the fork: the child's copy of the records says so.
    _exit(ra->deregs.load() == 1 && rb->deregs.load() == 1 ? 0 : 20);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(0, WEXITSTATUS(status)) << "the unused regions were still registered at fork";
  EXPECT_EQ(1, ra->deregs.load());
  EXPECT_EQ(1, rb->deregs.load());
  EXPECT_EQ(0, FakeBackend::record(held)->deregs.load());
  const Stats st = cache_->stats();
  EXPECT_EQ(1u, st.regions);
  EXPECT_EQ(0u, st.unused_bytes);
  EXPECT_EQ(evictions + 2, st.evictions);
  put(held);
}

// ---- Rule 10: counters -------------------------------------------------------------------------

TEST_F(RcacheTest, Rule10CountersTrackEveryEvent) {
  Region* a = get(0, 2);  // miss
  Region* b = get(1, 1);  // hit
  Region* c = get(1, 3);  // miss + merge of a (held: deferred): c covers pages 0-3
  put(b);
  put(c);
  Region* d = get(10, 1);  // miss
  put(d);
  invalidate(10, 1);       // unused invalidation
  Region* e = get(20, 1);  // miss
  invalidate(20, 1);       // in-use invalidation (deferred)
  Stats s = cache_->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.merges, 1u);
  EXPECT_EQ(s.invalidations_unused, 1u);
  EXPECT_EQ(s.invalidations_in_use, 1u);
  EXPECT_EQ(s.deferred_deregs, 2u);
  EXPECT_EQ(s.regions, 3u);  // a (held, out of the index), c (cached), e (held, invalid)
  EXPECT_EQ(s.pinned_bytes, (2 + 4 + 1) * kPage);
  EXPECT_EQ(s.unused_bytes, 4 * kPage);
  put(a);
  put(e);
  s = cache_->stats();
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(s.pinned_bytes, 4 * kPage);
}

// ---- Bad input ---------------------------------------------------------------------------------

TEST_F(RcacheTest, BadInputReturnsInvalidParam) {
  Region* r = nullptr;
  EXPECT_EQ(cache_->get(at(0), 0, kAccessLocalRead, MemType::kHost, &be_, &r),
            Status::kInvalidParam);
  EXPECT_EQ(cache_->get(reinterpret_cast<void*>(UINTPTR_MAX - 100), 4096, kAccessLocalRead,
                        MemType::kHost, &be_, &r),
            Status::kInvalidParam);  // wraps around
  EXPECT_EQ(cache_->get(at(0), SIZE_MAX / 2, kAccessLocalRead, MemType::kHost, &be_, &r),
            Status::kInvalidParam);  // absurd
  EXPECT_EQ(cache_->get(at(0), kPage, 1u << 20, MemType::kHost, &be_, &r), Status::kInvalidParam);
  EXPECT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, nullptr, &r),
            Status::kInvalidParam);
  EXPECT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &be_, nullptr),
            Status::kInvalidParam);
  EXPECT_EQ(r, nullptr);
  EXPECT_EQ(be_.regCalls(), 0);
  // Invalidations of odd ranges do not crash.
  cache_->invalidate(reinterpret_cast<void*>(UINTPTR_MAX - 100), 4096);
  cache_->invalidate(nullptr, SIZE_MAX);
  cache_->invalidate(at(0), 0);
  cache_->put(nullptr);
  cache_->progress();
}

TEST_F(RcacheTest, BadInputPutOfUnheldRegionIsRefused) {
  Region* a = get(0, 1);
  put(a);
  cache_->put(a);  // not held any more: logged and ignored
  Region* b = get(0, 1);
  EXPECT_EQ(a, b);
  put(b);
  EXPECT_EQ(be_.live(), 1);
}

// ---- Parked holds (rcache/cache.cc): put() keeps a valid region's hold in its thread's slot, and
// the thread's next hit on it takes it back; every writer pass takes the parked holds out first.

// Counted as what it is: unused once released, in use again once hit, with one registration.
TEST_F(RcacheTest, ReleasedRegionIsUnusedInTheStatsAndHitAgain) {
  Region* a = get(0, 1);
  put(a);
  EXPECT_EQ(cache_->stats().unused_bytes, kPage);
  Region* b = get(0, 1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(cache_->stats().unused_bytes, 0u);
  EXPECT_EQ(cache_->stats().hits, 1u);
  put(b);
  EXPECT_EQ(be_.regCalls(), 1);
  EXPECT_EQ(be_.live(), 1);
}

// A hold parked by a thread that is gone is nobody's: the next invalidation counts the region as
// unused and it is deregistered, as if that thread had released it.
TEST_F(RcacheTest, ParkedHoldOfAThreadThatExitedIsReleasedByAnInvalidation) {
  FakeBackend::Record* ra = nullptr;
  std::thread t([&] {
    Region* a = get(0, 1);
    ra = FakeBackend::record(a);
    put(a);
  });
  t.join();
  invalidate(0, 1);
  cache_->progress();
  ASSERT_NE(ra, nullptr);
  EXPECT_EQ(ra->deregs.load(), 1);
  EXPECT_EQ(be_.live(), 0);
  const Stats s = cache_->stats();
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(s.invalidations_unused, 1u);
  EXPECT_EQ(s.invalidations_in_use, 0u);
}

// The owner taking its parked hold back against writers taking it out: another thread hits and
// releases page 0 in a loop while this one makes writer passes (a miss and an invalidation of
// page 2 each round). Each hold is released once: page 0 is never deregistered while held (the
// oracle), never registered again, and deregistered once after its own invalidation.
TEST_F(RcacheTest, ParkedHoldsTakenBackAndTakenOutConcurrently) {
  Region* a0 = get(0, 1);
  FakeBackend::Record* ra = FakeBackend::record(a0);
  put(a0);
  std::atomic<bool> stop{false};
  std::atomic<long> hits{0};
  std::thread t([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      Region* a = get(0, 1);
      if (a == nullptr) return;
      if (FakeBackend::record(a) != ra) {
        ADD_FAILURE() << "page 0 registered again";
        put(a);
        return;
      }
      put(a);
      hits.fetch_add(1, std::memory_order_relaxed);
    }
  });
  for (int i = 0; i < 5000 || hits.load() < 1000; ++i) {
    put(get(2, 1));
    invalidate(2, 1);
    if (i > 1000000) break;
  }
  stop = true;
  t.join();
  EXPECT_GE(hits.load(), 1000);
  EXPECT_EQ(ra->deregs.load(), 0);
  Region* a = get(0, 1);
  EXPECT_EQ(FakeBackend::record(a), ra);
  put(a);
  invalidate(0, 1);
  cache_->progress();
  EXPECT_EQ(ra->deregs.load(), 1);
  EXPECT_EQ(be_.live(), 0);
  EXPECT_EQ(cache_->stats().regions, 0u);
}

// A hold parked on a region its thread no longer takes gives way: after kStaleParkMisses (8) hits
// elsewhere, the thread's next release releases it and parks its own. Seen here through
// max_unused_bytes: released, the old region is unused over the limit and evicted at once; left
// parked, it stayed held (and registered) until the next writer pass.
TEST_F(RcacheTest, AParkedHoldItsThreadKeepsMissingGivesWayToTheNextRelease) {
  Config cfg;
  cfg.max_unused_bytes = kPage;
  make(cfg);
  // a parked: held, not unused; b unused (the slot was taken), one page, within the limit.
  const auto [ra, rb] = parkedThenUnused(0, 2, 4);
  for (int i = 0; i < 7; ++i) put(get(4, 1));
  EXPECT_EQ(ra->deregs.load(), 0) << "7 hits elsewhere: a's hold stays parked";
  for (int i = 0; i < 13; ++i) put(get(4, 1));
  EXPECT_EQ(ra->deregs.load(), 1)
      << "a's hold released (b's parked): two unused pages, over max_unused_bytes, a evicted";
  EXPECT_EQ(rb->deregs.load(), 0);
  const Stats s = cache_->stats();
  EXPECT_EQ(s.hits, 20u);
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(s.unused_bytes, kPage);
  invalidate(4, 1);
  cache_->progress();
  EXPECT_EQ(rb->deregs.load(), 1);
  EXPECT_EQ(be_.live(), 0);
}

// The same give-way while another thread's writer passes take parked holds out: each hold is
// released exactly once (a region deregistered while held, or never, fails the oracle).
TEST_F(RcacheTest, AParkedHoldGivesWayWhileWritersTakeItOut) {
  const auto [ra, rb] = parkedThenUnused(0, 1, 2);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load(std::memory_order_relaxed)) cache_->progress();
  });
  for (int round = 0; round < 2000; ++round) {
    const std::uintptr_t page = (round & 1) != 0 ? 0 : 2;  // 10 hits on one, then on the other
    for (int i = 0; i < 10; ++i) {
      Region* r = get(page, 1);
      ASSERT_NE(r, nullptr);
      ASSERT_EQ(FakeBackend::record(r), page == 0 ? ra : rb);
      put(r);
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(ra->deregs.load(), 0);
  EXPECT_EQ(rb->deregs.load(), 0);
  const Stats s = cache_->stats();
  EXPECT_EQ(s.regions, 2u);
  EXPECT_EQ(s.unused_bytes, 2 * kPage);
  invalidate(0, 4);
  cache_->progress();
  EXPECT_EQ(ra->deregs.load(), 1);
  EXPECT_EQ(rb->deregs.load(), 1);
  EXPECT_EQ(be_.live(), 0);
}

TEST(RcacheConfig, InvalidLimitsAreRejected) {
  std::unique_ptr<Cache> c;
  Config cfg;
  for (std::size_t a : {std::size_t{0}, std::size_t{3}, std::size_t{1000}, std::size_t{2048},
                        std::size_t{3} << 12, std::size_t{1} << 40}) {
    cfg = Config{};
    cfg.alignment = a;
    EXPECT_EQ(Cache::create(cfg, &c), Status::kInvalidParam) << "alignment " << a;
  }
  cfg = Config{};
  cfg.max_regions = 0;
  EXPECT_EQ(Cache::create(cfg, &c), Status::kInvalidParam);
  cfg = Config{};
  cfg.max_pinned_bytes = 100;
  EXPECT_EQ(Cache::create(cfg, &c), Status::kInvalidParam);
  cfg = Config{};
  cfg.max_unused_bytes = SIZE_MAX - 1;
  EXPECT_EQ(Cache::create(cfg, &c), Status::kInvalidParam);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(Cache::create(Config{}, nullptr), Status::kInvalidParam);
  EXPECT_EQ(Cache::create(Config{}, &c), Status::kOk);
  EXPECT_NE(c, nullptr);
}

TEST(RcacheStatus, EveryStatusHasAString) {
  for (Status s : {Status::kOk, Status::kInvalidParam, Status::kNoMemory, Status::kNoResource,
                   Status::kExceedsLimit, Status::kUnsupported, Status::kIoError}) {
    EXPECT_STRNE(statusString(s), "unknown");
  }
}

TEST_F(RcacheTest, DestroyDeregistersEverythingOnce) {
  for (int i = 0; i < 50; ++i) put(get(static_cast<std::uintptr_t>(i) * 3, 2));
  invalidate(0, 10);
  cache_.reset();
  EXPECT_EQ(be_.live(), 0);
  be_.expectAllDeregisteredOnce();
}

}  // namespace
}  // namespace gmd::rcache::test

// ---- Randomised stress (explicit invalidation before each unmap)
// ----------------------------------

namespace gmd::rcache::test {
namespace {

TEST(RcacheStress, RandomizedThreadsWithRealMemoryExplicitFeed) {
  FakeBackend be;
  std::unique_ptr<Cache> cache;
  ASSERT_EQ(Cache::create(Config{}, &cache), Status::kOk);
  {
    StressPool pool;
    runStress(cache.get(), &be, &pool, StressOptions{});
  }
  cache.reset();
  be.expectAllDeregisteredOnce();
}

// The same under a limit of 16 regions (the threads hold at most 8 at once): most misses evict,
// so the eviction order takes, sets aside and re-keys regions that other threads get, release
// and invalidate meanwhile. No stale hit, no failed get, each registration deregistered once.
TEST(RcacheStress, RandomizedThreadsEvictingUnderARegionLimit) {
  FakeBackend be;
  Config cfg;
  cfg.max_regions = 16;
  std::unique_ptr<Cache> cache;
  ASSERT_EQ(Cache::create(cfg, &cache), Status::kOk);
  {
    StressPool pool;
    runStress(cache.get(), &be, &pool, StressOptions{});
  }
  EXPECT_GT(cache->stats().evictions, 1000u);
  cache.reset();
  be.expectAllDeregisteredOnce();
}

}  // namespace
}  // namespace gmd::rcache::test
