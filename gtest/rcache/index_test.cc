// The registration cache's two-level index on its own (rcache/index.h), against a std::map model:
// lookups, overlap walks, splits and merges of leaves, purges, and the structural invariants of
// rcache/README.md (invariant 1); lock-free readers against a writer editing leaves in place. No
// cache, no backend.
#include "rcache/index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace gmd::rcache::detail {
namespace {

struct alignas(64) Node {  // entries keep lengths in the low bits of a node's address
  std::uintptr_t s = 0, e = 0;
  std::uintptr_t start() const { return s; }
  std::uintptr_t end() const { return e; }
  Node* nextUnindex() const { return next_unindex_; }
  void setNextUnindex(Node* n) { next_unindex_ = n; }
  Node* next_unindex_ = nullptr;
  bool in_index_ = false;
};

using TestIndex = Index<Node>;
constexpr std::uintptr_t kPage = 4096;

class IndexTest : public ::testing::Test {
 protected:
  ~IndexTest() override {
    if (index_ != nullptr) {
      // The index owns its current top and leaves only until detached (as the cache's destructor).
      TestIndex::TopT* top = index_->detach();
      for (std::size_t i = 0; i < top->size; ++i) TestIndex::releaseLeaf(top->leaf(i));
      TestIndex::releaseTop(top);
    }
    index_.reset();
    freeAll(reclaim_.retired.takeAll());
  }
  void TearDown() override {
    // Nobody reads: everything retired is collectable at once.
    freeAll(reclaim_.collect(/*force=*/true));
  }
  static void freeAll(Reclaimed freed) {
    EXPECT_EQ(freed.records, nullptr) << "the index retires objects, never records";
    Retired* list = freed.objects;
    while (list != nullptr) {
      Retired* next = list->next_retired;
      ASSERT_TRUE(TestIndex::freeRetired(list))
          << "the index retired something of kind " << int(list->kind);
      list = next;
    }
  }
  Node* make(std::uintptr_t first_page, std::uintptr_t pages) {
    nodes_.push_back(std::make_unique<Node>());
    Node* n = nodes_.back().get();
    n->s = first_page * kPage;
    n->e = (first_page + pages) * kPage;
    return n;
  }
  void insert(Node* n) {
    ASSERT_TRUE(index_->insert(n));
    EXPECT_TRUE(n->in_index_);
    model_[n->s] = n;
  }
  void remove(Node* n) {
    index_->queuePurge(n);
    model_.erase(n->s);
  }
  // Invariant 1: leaves sorted and disjoint, within their key range, key 0 is 0, no empty leaf
  // unless it is the only one; and the entries are exactly the model's.
  void checkStructure() {
    const auto* top = index_->top();
    ASSERT_GE(top->size, 1u);
    EXPECT_EQ(top->slots()[0].key, 0u);
    std::vector<Node*> seen;
    std::uintptr_t prev_end = 0;
    for (std::size_t i = 0; i < top->size; ++i) {
      const auto* leaf = top->leaf(i);
      if (top->size > 1) {
        EXPECT_NE(leaf->count(), 0u) << "empty leaf " << i;
      }
      EXPECT_LE(leaf->count(), kLeafMax);
      const std::uintptr_t lo = top->slots()[i].key;
      const std::uintptr_t hi = i + 1 < top->size ? top->slots()[i + 1].key : UINTPTR_MAX;
      if (i + 1 < top->size) {
        EXPECT_LT(lo, hi) << "keys out of order at " << i;
      }
      for (std::size_t k = 0; k < leaf->count(); ++k) {
        const auto e = leaf->entry(k);
        EXPECT_GE(e.start, lo);
        EXPECT_LT(e.start, hi);
        EXPECT_GE(e.start, prev_end) << "entries overlap or are out of order";
        EXPECT_EQ(e.start, e.region()->s);
        EXPECT_EQ(e.end(), e.region()->e);
        prev_end = e.end();
        seen.push_back(e.region());
      }
    }
    std::vector<Node*> want;
    for (auto& [s, n] : model_) want.push_back(n);
    EXPECT_EQ(seen, want);
  }
  // The floor entry (copied into last_floor_), or null.
  const TestIndex::Entry* floor(std::uintptr_t addr) {
    EXPECT_TRUE(index_->top()->floor(addr, &last_floor_)) << "no writer edits the leaf";
    return last_floor_.region() != nullptr ? &last_floor_ : nullptr;
  }
  TestIndex::Entry last_floor_{};

  Reclaimer reclaim_;
  std::unique_ptr<TestIndex> index_ = std::make_unique<TestIndex>(&reclaim_);
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::uintptr_t, Node*> model_;
};

// The Top's search without jumps (eight ways a step) against a plain count, for every size up to
// a few steps' worth and every address next to a key; keys with gaps of 1 and equal neighbours.
TEST(IndexSearchTest, BranchFreeCountIsTheNumberOfKeysAtOrBelowForEverySize) {
  std::mt19937_64 rng(7);
  for (std::size_t n = 0; n <= 600; ++n) {
    std::vector<std::uintptr_t> keys(n);
    std::uintptr_t k = 1 + rng() % 3;
    for (auto& key : keys) {
      key = k;
      k += rng() % 4;  // 0: a key equal to the one before
    }
    std::vector<std::uintptr_t> addrs{0, UINTPTR_MAX};
    for (const std::uintptr_t key : keys) addrs.insert(addrs.end(), {key - 1, key, key + 1});
    for (const std::uintptr_t a : addrs) {
      const auto want =
          static_cast<std::size_t>(std::upper_bound(keys.begin(), keys.end(), a) - keys.begin());
      const std::size_t got =
          countAtOrBelowNoBranch(n, a, [&](std::size_t i) { return &keys.at(i); });
      ASSERT_EQ(got, want) << n << " keys, address " << a;
    }
  }
}

TEST_F(IndexTest, EmptyIndexFindsNothing) {
  EXPECT_EQ(floor(0), nullptr);
  EXPECT_EQ(floor(UINTPTR_MAX), nullptr);
  EXPECT_TRUE(TestIndex::isEmptyTop(index_->current()));
  int calls = 0;
  index_->forEachOverlap(0, UINTPTR_MAX, [&](const TestIndex::Entry&) { ++calls; });
  EXPECT_EQ(calls, 0);
  checkStructure();
}

TEST_F(IndexTest, FloorIsTheEntryWithTheGreatestStartAtOrBelow) {
  Node* a = make(10, 2);
  Node* b = make(20, 4);
  insert(a);
  insert(b);
  EXPECT_EQ(floor(9 * kPage + 4095), nullptr);
  EXPECT_EQ(floor(10 * kPage)->region(), a);
  EXPECT_EQ(floor(19 * kPage)->region(), a) << "floor, even past a's end: the caller checks end";
  EXPECT_EQ(floor(20 * kPage)->region(), b);
  EXPECT_EQ(floor(UINTPTR_MAX)->region(), b);
  checkStructure();
}

TEST_F(IndexTest, OverlapWalkVisitsExactlyTheOverlappingEntriesInOrder) {
  for (std::uintptr_t p = 0; p < 300; p += 3) insert(make(p, 2));  // [p, p+2), gaps of one page
  checkStructure();
  ASSERT_GT(index_->top()->size, 1u) << "300/3 entries must have split the first leaf";
  for (std::uintptr_t s : {0u, 1u, 2u, 5u, 100u, 150u, 299u}) {
    for (std::uintptr_t len : {1u, 2u, 3u, 40u, 200u}) {
      std::vector<Node*> got, want;
      index_->forEachOverlap(s * kPage, (s + len) * kPage,
                             [&](const TestIndex::Entry& e) { got.push_back(e.region()); });
      for (auto& [start, n] : model_) {
        if (n->s < (s + len) * kPage && s * kPage < n->e) want.push_back(n);
      }
      EXPECT_EQ(got, want) << "[" << s << ", +" << len << ") pages";
    }
  }
}

TEST_F(IndexTest, RandomInsertionsAndPurgesKeepTheInvariants) {
  std::mt19937 rng(42);
  std::vector<std::uintptr_t> pages(4000);
  for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = 2 * i;  // one page, one gap
  std::shuffle(pages.begin(), pages.end(), rng);
  for (std::uintptr_t p : pages) insert(make(p, 1));
  checkStructure();
  const std::size_t leaves_full = index_->top()->size;
  EXPECT_GE(leaves_full, pages.size() / kLeafMax) << "leaves hold at most kLeafMax entries";

  // Every lookup lands on its entry; a gap page floors to the entry below it.
  for (std::uintptr_t p = 0; p < 2 * pages.size(); ++p) {
    const auto* e = floor(p * kPage + 17);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->region()->s, (p & ~std::uintptr_t{1}) * kPage) << p;
    EXPECT_EQ(e->end(), e->region()->e) << p;
    EXPECT_TRUE(e->reaches(e->region()->e));
    EXPECT_FALSE(e->reaches(e->region()->e + 1));
  }

  // Purge three quarters in random batches (an invalidation queues a batch, a purge applies it).
  std::vector<Node*> victims;
  for (auto& [s, n] : model_) {
    if (rng() % 4 != 0) victims.push_back(n);
  }
  std::shuffle(victims.begin(), victims.end(), rng);
  for (std::size_t i = 0; i < victims.size(); i += 97) {
    for (std::size_t k = i; k < std::min(victims.size(), i + 97); ++k) remove(victims[k]);
    EXPECT_TRUE(index_->dirty());
    ASSERT_TRUE(index_->purge());
    EXPECT_FALSE(index_->dirty());
    for (std::size_t k = i; k < std::min(victims.size(), i + 97); ++k) {
      EXPECT_FALSE(victims[k]->in_index_);
    }
  }
  checkStructure();
  EXPECT_LT(index_->top()->size, leaves_full) << "shrunken leaves merge";

  // Removing the rest leaves the one empty leaf.
  for (auto it = model_.begin(); it != model_.end();) {
    Node* n = it->second;
    ++it;
    remove(n);
  }
  ASSERT_TRUE(index_->purge());
  checkStructure();
  EXPECT_EQ(index_->top()->size, 1u);
  EXPECT_EQ(floor(UINTPTR_MAX), nullptr);
}

// The writers' searches start from the positions the last ones found (the miss cycle: walk, purge,
// insert, walk again). Each step here leaves such a position behind and the next one makes it stale
// in its own way (an entry inserted or purged before it in the same leaf, a split, a merge, a new
// top): every walk must still visit exactly the overlapping entries, every insertion land in order.
// Positions are only guesses: the readers' (Top::floor() keeps one per thread) and the writers'
// (the last two they found, and one a reader suggests) go stale with every edit, split, merge and
// new top. Each lookup and walk here starts from one that such changes made stale, or from a
// random one, and must still find exactly what the model holds.
TEST_F(IndexTest, RememberedPositionsOfReadersAndWritersNeverMisleadThemWhenLeavesChange) {
  std::mt19937 rng(7);
  std::uint64_t reader_pos = ReadPos::kNone;  // one reader's position, kept across every change
  auto readerFloor = [&](std::uintptr_t page, std::uint64_t* pos) {
    const std::uintptr_t addr = page * kPage + 5;
    TestIndex::Entry e{};
    ASSERT_TRUE(index_->top()->floor(addr, &e, pos)) << "no writer edits the leaf";
    auto it = model_.upper_bound(addr);
    Node* want = it == model_.begin() ? nullptr : std::prev(it)->second;
    EXPECT_EQ(e.region(), want) << "floor of page " << page;
  };
  for (std::uintptr_t p = 0; p < 4 * 3000; p += 4) insert(make(p, 1));  // [p, p+1), gaps of three
  std::vector<Node*> live;
  for (auto& [s, n] : model_) live.push_back(n);
  auto walk = [&](std::uintptr_t s, std::uintptr_t len) {
    std::vector<Node*> got, want;
    index_->forEachOverlap(s * kPage, (s + len) * kPage,
                           [&](const TestIndex::Entry& e) { got.push_back(e.region()); });
    for (auto it = model_.upper_bound(s * kPage); it != model_.begin();) {  // the floor entry
      --it;
      if (it->second->e > s * kPage) want.push_back(it->second);
      break;
    }
    for (auto it = model_.upper_bound(s * kPage); it != model_.end() && it->first < (s + len) * kPage;
         ++it) {
      want.push_back(it->second);
    }
    EXPECT_EQ(got, want) << "[" << s << ", +" << len << ") pages";
  };
  for (int step = 0; step < 4000; ++step) {
    const std::uintptr_t at = rng() % (4 * 3000 + 8);
    readerFloor(at, &reader_pos);  // from where the last step's lookup ended, before its changes
    std::uint64_t garbage = (std::uint64_t{rng()} << 32) | rng() % 70;
    readerFloor(at + rng() % 3, &garbage);
    index_->suggest(rng() % 2 != 0 ? reader_pos : (std::uint64_t{rng() % 400} << 32) | rng() % 70);
    walk(at, 1);
    switch (rng() % 4) {
      case 0: {  // a purge before the remembered position, then an insertion at it
        Node* victim = live[rng() % live.size()];
        if (victim->in_index_ && model_.count(victim->s) != 0) remove(victim);
        if (model_.count(at * kPage) == 0 && (model_.empty() || [&] {
              auto it = model_.upper_bound(at * kPage);
              return (it == model_.end() || it->first >= (at + 1) * kPage) &&
                     (it == model_.begin() || std::prev(it)->second->e <= at * kPage);
            }())) {
          Node* n = make(at, 1);
          insert(n);
          live.push_back(n);
        } else {
          ASSERT_TRUE(index_->purge());
        }
        break;
      }
      case 1: {  // a burst that empties leaves (merges, a new top)
        auto it = model_.lower_bound(at * kPage);
        for (int k = 0; k < 60 && it != model_.end(); ++k) {
          Node* n = (it++)->second;
          remove(n);
        }
        ASSERT_TRUE(index_->purge());
        break;
      }
      case 2: {  // insertions just below the remembered position (shift it; split its leaf)
        for (std::uintptr_t p = at; p > 0 && p + 80 > at; --p) {
          if (model_.count(p * kPage) != 0 || model_.count((p - 1) * kPage) != 0 ||
              model_.count((p + 1) * kPage) != 0) {
            continue;
          }
          Node* n = make(p, 1);
          insert(n);
          live.push_back(n);
        }
        break;
      }
      default:
        break;
    }
    readerFloor(at + rng() % 2, &reader_pos);
    walk(at, 1 + rng() % 40);
    if (step % 250 == 0) checkStructure();
  }
  checkStructure();
}

// Ascending insertions (what allocators and sequential registrations produce) fill each leaf to
// kLeafMax and start the next one beside it: every leaf but the last is full, and a leaf that was
// full keeps its block (no copy). Insertions below a full leaf's last entry still split it evenly.
TEST_F(IndexTest, AscendingInsertionsFillLeavesAndStartTheNextWithoutCopying) {
  constexpr std::uintptr_t kN = 10 * kLeafMax + 7;
  for (std::uintptr_t p = 0; p < kN; ++p) insert(make(2 * p, 1));
  checkStructure();
  const auto* top = index_->top();
  ASSERT_EQ(top->size, (kN + kLeafMax - 1) / kLeafMax);
  for (std::size_t i = 0; i + 1 < top->size; ++i) {
    EXPECT_EQ(top->leaf(i)->count(), kLeafMax) << "leaf " << i;
  }
  EXPECT_EQ(top->leaf(top->size - 1)->count(), kN % kLeafMax);
  const auto* full = top->leaf(3);
  insert(make(2 * (kN + 5), 1));  // appended to the last leaf: leaf 3 is left alone
  EXPECT_EQ(index_->top()->leaf(3), full);
  insert(make(2 * (3 * kLeafMax + 10) + 1, 1));  // inside full leaf 3: an even split
  top = index_->top();
  EXPECT_EQ(top->size, (kN + kLeafMax - 1) / kLeafMax + 1);
  EXPECT_EQ(top->leaf(3)->count() + top->leaf(4)->count(), kLeafMax + 1);
  EXPECT_GE(top->leaf(3)->count(), kLeafMax / 2);
  EXPECT_GE(top->leaf(4)->count(), kLeafMax / 2);
  checkStructure();
}

TEST_F(IndexTest, QueuePurgeOfAnUnindexedNodeDoesNothing) {
  Node* a = make(1, 1);
  index_->queuePurge(a);
  EXPECT_FALSE(index_->dirty());
  insert(a);
  remove(a);
  EXPECT_TRUE(index_->dirty());
  EXPECT_TRUE(index_->purge());
  index_->queuePurge(a);  // out of the index now: nothing to queue
  EXPECT_FALSE(index_->dirty());
  checkStructure();
}

TEST_F(IndexTest, TheOnlyLeafStaysEmptyForTheNextInsertion) {
  // A cache that registers and drops one region at a time (a miss in an empty cache) edits its one
  // leaf in place: nothing is allocated, nothing retired.
  Node* a = make(1, 1);
  insert(a);
  const TestIndex::LeafT* leaf = index_->current()->leaf(0);
  remove(a);
  ASSERT_TRUE(index_->purge());
  EXPECT_FALSE(a->in_index_);
  EXPECT_EQ(index_->current()->leaf(0), leaf);
  EXPECT_EQ(leaf->count(), 0u);
  EXPECT_EQ(floor(UINTPTR_MAX), nullptr);
  EXPECT_EQ(reclaim_.retired.takeAll().objects, nullptr) << "nothing to reclaim";
  checkStructure();
  Node* b = make(7, 2);
  insert(b);
  EXPECT_EQ(index_->current()->leaf(0), leaf);
  EXPECT_EQ(floor(8 * kPage)->region(), b);
  checkStructure();
}

TEST_F(IndexTest, TheInsertionCountIsEvenBetweenInsertionsAndCountsEachTwice) {
  // Readers without the lock read it before a lookup (CacheImpl::bareMiss()): odd while an entry
  // is being placed, and it changes with every insert(), failed ones included.
  EXPECT_EQ(index_->insertions(), 0u);
  insert(make(1, 1));
  EXPECT_EQ(index_->insertions(), 2u);
  insert(make(3, 1));
  EXPECT_EQ(index_->insertions(), 4u);
}

TEST_F(IndexTest, InsertAfterQueueingTheOverlappedEntriesReplacesThem) {
  Node* a = make(10, 2);
  Node* b = make(13, 2);
  insert(a);
  insert(b);
  Node* u = make(10, 5);  // the union
  remove(a);
  remove(b);
  insert(u);  // purges first
  EXPECT_FALSE(a->in_index_);
  EXPECT_FALSE(b->in_index_);
  EXPECT_EQ(floor(14 * kPage)->region(), u);
  checkStructure();
}

TEST_F(IndexTest, DetachHandsTheTopToTheCallerAndEmptiesTheIndex) {
  for (std::uintptr_t p = 0; p < 200; p += 2) insert(make(p, 1));
  TestIndex::TopT* top = index_->detach();
  EXPECT_EQ(floor(UINTPTR_MAX), nullptr);
  std::size_t entries = 0;
  for (std::size_t i = 0; i < top->size; ++i) {
    entries += top->leaf(i)->count();
    TestIndex::releaseLeaf(top->leaf(i));
  }
  TestIndex::releaseTop(top);
  EXPECT_EQ(entries, 100u);
  model_.clear();
  checkStructure();
}

// Readers look up entries that never move while the writer inserts and purges their neighbours in
// the same leaves, in place under the leaves' sequence locks (and now and then splitting or
// merging them): every lookup of a stable entry finds exactly it, and one of a churned page finds
// the churned entry or the stable one below it, never a torn entry. Nothing retired is freed
// before the readers stop (the cache's epochs are not part of the index).
TEST_F(IndexTest, ConcurrentReadersSeeEveryStableEntryWhileLeavesAreEditedInPlace) {
  constexpr std::uintptr_t kStable = 600;  // pages 0, 4, 8, ...; churn at 2, 6, 10, ...
  std::vector<Node*> stable, churn;
  for (std::uintptr_t i = 0; i < kStable; ++i) {
    stable.push_back(make(4 * i, 1));
    churn.push_back(make(4 * i + 2, 1));
    insert(stable.back());
  }
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> lookups{0}, busy{0}, wrong{0};
  std::atomic<int> started{0};
  // Reader 1 keeps its position across lookups, as the cache's readers do, and looks up the same
  // or a neighbouring page half of the time (its position then often answers, or just went
  // stale); reader 2 searches every time.
  auto reader = [&](unsigned seed, bool keep_position) {
    std::mt19937 rng(seed);
    started.fetch_add(1);
    std::uint64_t n = 0;
    std::uint64_t pos = ReadPos::kNone;
    std::uintptr_t i = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      i = keep_position && (rng() & 1) != 0 ? (i + rng() % 2) % kStable : rng() % kStable;
      const bool on_churn = (rng() & 1) != 0;
      const std::uintptr_t page = 4 * i + (on_churn ? 2 : 0);
      TestIndex::Entry e{};
      if (!keep_position) pos = ReadPos::kNone;
      if (!index_->top()->floor(page * kPage + 5, &e, &pos)) {
        busy.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const bool ok = e.region() == stable[i] || (on_churn && e.region() == churn[i]);
      if (!ok || e.start != e.region()->s || e.end() != e.region()->e) {
        wrong.fetch_add(1, std::memory_order_relaxed);
      }
      ++n;
    }
    lookups.fetch_add(n, std::memory_order_relaxed);
  };
  std::thread r1(reader, 1, true), r2(reader, 2, false);
  while (started.load() != 2) std::this_thread::yield();
  std::mt19937 rng(7);
  std::vector<Node*> in;  // churned entries now indexed
  for (int round = 0; round < 200000; ++round) {
    if (in.size() < kStable / 2 && (in.empty() || rng() % 3 != 0)) {
      Node* c = churn[rng() % kStable];
      if (c->in_index_) continue;
      ASSERT_TRUE(index_->insert(c));
      in.push_back(c);
    } else {
      const std::size_t k = rng() % in.size();
      index_->queuePurge(in[k]);
      ASSERT_TRUE(index_->purge());
      in[k] = in.back();
      in.pop_back();
    }
  }
  stop.store(true);
  r1.join();
  r2.join();
  EXPECT_EQ(wrong.load(), 0u) << "of " << lookups.load() << " lookups";
  EXPECT_GT(lookups.load(), 0u);
  for (Node* c : in) model_[c->s] = c;
  checkStructure();
}

}  // namespace
}  // namespace gmd::rcache::detail
