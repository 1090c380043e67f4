// What a cached region costs in memory, and the pieces that decide it: the region pool's ids
// (rcache/block_pool.h: a block found from its id and back, across spans, slabs and pools), the
// eviction order's storage (rcache/lru_queue.h: its run of 8-byte items in chunks and the heap
// beside it, which grows in steps, rcache/lru_heap.h), and the cache's memory per region (one
// cache line per region, at most 96 bytes with its leaf entry and its item in the eviction order).
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gtest/common/fake_backend.h"
#include "rcache/block_pool.h"
#include "rcache/cache_impl.h"
#include "rcache/lru_heap.h"
#include "rcache/lru_queue.h"
#include "rcache/rcache.h"

namespace gmd::rcache::detail {
namespace {

using Pool = LinePool<64>;

// A region is its line and nothing else (what a region costs is its pool's: 4096 / 63 bytes), and
// a list link or an item of the eviction order names it in 4 bytes.
static_assert(sizeof(RegionImpl) == 64 && RegionPool::kPerSpan == 63);
static_assert(sizeof(LruQueue<RegionImpl>::RunItem) == 8);
static_assert(sizeof(IndexEntry<RegionImpl>) == 16 && kEntryBytes == 16);

// Every block: distinct, aligned, disjoint from every other block, found from its id and its id
// from it, the ids distinct and never 0; what is written into each survives the others' writes.
// Enough blocks for several slabs (4, 8, 16, 32, 64, 64, ... spans of 63 blocks) in two pools
// (their spans numbered in one table), and again after half are reused and one pool is gone.
TEST(BlockPoolTest, BlocksFoundFromTheirIdsAcrossSpansSlabsAndPools) {
  auto pool = std::make_unique<Pool>();
  auto other = std::make_unique<Pool>();
  constexpr std::size_t kBlocks = 20000;
  std::vector<unsigned char*> blocks;
  std::vector<unsigned char*> others;
  auto fill = [](unsigned char* b, std::size_t k) {
    std::memset(b, static_cast<int>(k * 7 + 1), 64);
  };
  auto check = [&](std::size_t k) {
    unsigned char* b = blocks[k];
    for (int i = 0; i < 64; ++i) ASSERT_EQ(b[i], static_cast<unsigned char>(k * 7 + 1)) << k;
  };
  for (std::size_t k = 0; k < kBlocks; ++k) {
    auto* b = static_cast<unsigned char*>(pool->allocate());
    ASSERT_NE(b, nullptr);
    blocks.push_back(b);
    fill(b, k);
    if (k % 3 == 0) {  // the other pool grows between them
      auto* o = static_cast<unsigned char*>(other->allocate());
      ASSERT_NE(o, nullptr);
      others.push_back(o);
    }
  }
  auto checkLayout = [&] {
    std::vector<std::uintptr_t> starts;
    std::set<std::uint32_t> ids;
    for (const auto* list : {&blocks, &others}) {
      for (unsigned char* b : *list) {
        const auto a = reinterpret_cast<std::uintptr_t>(b);
        ASSERT_EQ(a % 64, 0u);
        const std::uint32_t id = Pool::idOf(b);
        ASSERT_NE(id, 0u);
        ASSERT_EQ(Pool::at(id), static_cast<void*>(b));
        ASSERT_TRUE(ids.insert(id).second) << "two blocks with id " << id;
        starts.push_back(a);
      }
    }
    std::sort(starts.begin(), starts.end());
    for (std::size_t i = 1; i < starts.size(); ++i) {
      ASSERT_LE(starts[i - 1] + 64, starts[i]) << "block " << i << " overlaps";
    }
  };
  checkLayout();
  for (std::size_t k = 0; k < kBlocks; ++k) check(k);
  EXPECT_EQ(Pool::at(0), nullptr);

  // Release every other block and allocate them again: the same blocks come back, with their ids.
  // The other pool goes, and its span numbers are given again.
  for (unsigned char* o : others) other->release(o);
  others.clear();
  other.reset();
  std::set<unsigned char*> released;
  for (std::size_t k = 0; k < kBlocks; k += 2) {
    released.insert(blocks[k]);
    pool->release(blocks[k]);
  }
  for (std::size_t k = 0; k < kBlocks; k += 2) {
    auto* b = static_cast<unsigned char*>(pool->allocate());
    ASSERT_NE(b, nullptr);
#if !defined(__SANITIZE_ADDRESS__)  // there every block is a fresh heap allocation
    EXPECT_EQ(released.count(b), 1u) << "a released block is reused before the pool grows";
#endif
    blocks[k] = b;
    fill(b, k);
  }
  other = std::make_unique<Pool>();
  for (std::size_t k = 0; k < kBlocks / 3; ++k) {
    auto* o = static_cast<unsigned char*>(other->allocate());
    ASSERT_NE(o, nullptr);
    others.push_back(o);
  }
  checkLayout();
  for (std::size_t k = 0; k < kBlocks; ++k) check(k);
  for (unsigned char* b : blocks) pool->release(b);
  for (unsigned char* o : others) other->release(o);
}

struct HeapNode {
  std::uint32_t pos = kNotInHeap;
  std::uint32_t& lruPos() noexcept { return pos; }
  // The queue's ids: the node's index in the test's array (`nodes`), plus one.
  static inline const HeapNode* nodes = nullptr;
  static std::uint32_t idOf(const HeapNode* n) noexcept {
    return static_cast<std::uint32_t>(n - nodes) + 1;
  }
  static HeapNode* fromId(std::uint32_t id) noexcept {
    return id == 0 ? nullptr : const_cast<HeapNode*>(nodes) + (id - 1);
  }
};

// The heap's array grows by doubling to kStepItems, then by a step or a sixteenth: its spare room
// stays within that rule at every size, and through every growth (each one a realloc that may
// move the items) the heap keeps its order and each node's position.
TEST(LruHeapTest, GrowsInStepsAndKeepsOrderAndPositions) {
  using Heap = LruHeap<HeapNode>;
  constexpr std::size_t kNodes = 120000;
  std::vector<HeapNode> nodes(kNodes);
  Heap heap;
  std::mt19937_64 rng(7);
  std::size_t growths = 0;
  for (std::size_t k = 0; k < kNodes; ++k) {
    const std::size_t cap0 = heap.capacity();
    ASSERT_TRUE(heap.reserve(1));
    if (heap.capacity() != cap0) {
      ++growths;
      const std::size_t step = cap0 < Heap::kStepItems ? std::max<std::size_t>(64, cap0)
                                                       : std::max(Heap::kStepItems, cap0 / 16);
      EXPECT_EQ(heap.capacity(), cap0 + step) << "at " << k << " items";
    }
    heap.push(&nodes[k], rng() % 1000000);
    ASSERT_LE(heap.capacity() - heap.size(),
              std::max<std::size_t>(64, std::max(Heap::kStepItems, heap.size() / 16)));
  }
  EXPECT_GT(growths, 10u);
  // 100,000 items fit in under 17 bytes each.
  EXPECT_LT(static_cast<double>(heap.capacity()) * sizeof(Heap::Item), 17.0 * kNodes);
  // Re-key some, remove some from the middle (by their positions), then pop in order.
  for (std::size_t k = 0; k < kNodes; k += 3) heap.update(&nodes[k], rng() % 1000000);
  for (std::size_t k = 1; k < kNodes; k += 5) {
    heap.remove(&nodes[k]);
    ASSERT_EQ(nodes[k].pos, kNotInHeap);
  }
  std::uint64_t last = 0;
  std::size_t popped = 0;
  while (heap.size() != 0) {
    const Heap::Item top = heap.top();
    ASSERT_GE(top.key, last);
    ASSERT_EQ(top.region->pos, 0u) << "the top's position is 0";
    last = top.key;
    heap.remove(top.region);
    ++popped;
  }
  EXPECT_EQ(popped, kNodes - (kNodes - 1 + 4) / 5);
}

using Queue = LruQueue<HeapNode>;

// Checks the queue against a reference set of (key, node) pairs: the same size, and top() has the
// smallest key and names a node queued with that key.
void expectSameMinimum(const Queue& q, const std::set<std::pair<std::uint64_t, std::size_t>>& ref,
                       const std::vector<HeapNode>& nodes) {
  ASSERT_EQ(q.size(), ref.size());
  if (ref.empty()) return;
  const Queue::Item top = q.top();
  ASSERT_EQ(top.key, ref.begin()->first);
  const auto id = static_cast<std::size_t>(top.region - nodes.data());
  ASSERT_LT(id, nodes.size());
  ASSERT_EQ(ref.count({top.key, id}), 1u) << "the top names a node queued with its key";
}

// Random pushes (most in key order, as the cache's are, some older than the run's back: those go
// to the heap), re-keys, removals from anywhere and pops of the minimum, against a reference set:
// the minimum is always the smallest key, every removal by position finds its node, and the run's
// holes never outnumber its items by more than a chunk after a reserve().
TEST(LruQueueTest, KeepsTheSmallestKeyFirstThroughRandomPushesRekeysAndRemovals) {
  constexpr std::size_t kNodes = 20000;
  std::vector<HeapNode> nodes(kNodes);
  HeapNode::nodes = nodes.data();
  std::vector<std::uint64_t> key_of(kNodes, 0);
  std::set<std::pair<std::uint64_t, std::size_t>> ref;
  Queue q;
  std::mt19937_64 rng(11);
  std::uint64_t clock = 1000;
  std::size_t to_heap = 0, rekeys = 0, removals = 0, pops = 0;
  for (int op = 0; op < 400000; ++op) {
    const std::size_t id = rng() % kNodes;
    HeapNode* n = &nodes[id];
    const bool queued = ref.count({key_of[id], id}) != 0;
    const unsigned what = static_cast<unsigned>(rng() % 10);
    if (!queued && what < 6) {
      ASSERT_TRUE(q.reserve(1));
      ASSERT_LE(q.runHoles(), std::max(Queue::kChunkItems, q.runSize()) + 1);
      const std::uint64_t key = rng() % 4 != 0 ? ++clock : clock - rng() % 5000;
      const std::size_t heap0 = q.heapSize();
      q.push(n, key);
      to_heap += q.heapSize() - heap0;
      key_of[id] = key;
      ref.insert({key, id});
    } else if (queued && what < 3) {
      ASSERT_TRUE(q.reserve(1));
      const std::uint64_t key = key_of[id] + 1 + rng() % 3000;
      ref.erase({key_of[id], id});
      q.update(n, key);
      key_of[id] = key;
      ref.insert({key, id});
      ++rekeys;
    } else if (queued && what < 7) {
      q.remove(n);
      ASSERT_EQ(n->pos, kNotQueued);
      ref.erase({key_of[id], id});
      ++removals;
      q.remove(n);  // not queued: nothing happens
    } else if (!ref.empty() && what >= 7) {
      const Queue::Item top = q.top();
      ASSERT_EQ(top.key, ref.begin()->first);
      const auto tid = static_cast<std::size_t>(top.region - nodes.data());
      q.remove(top.region);
      ASSERT_EQ(ref.erase({top.key, tid}), 1u);
      ++pops;
    }
    if (op % 97 == 0) expectSameMinimum(q, ref, nodes);
  }
  expectSameMinimum(q, ref, nodes);
  EXPECT_GT(to_heap, 1000u);
  EXPECT_GT(rekeys, 1000u);
  EXPECT_GT(removals, 1000u);
  EXPECT_GT(pops, 1000u);
  std::uint64_t last = 0;
  while (!ref.empty()) {  // drain in order
    const Queue::Item top = q.top();
    ASSERT_GE(top.key, last);
    ASSERT_EQ(top.key, ref.begin()->first);
    last = top.key;
    ref.erase({top.key, static_cast<std::size_t>(top.region - nodes.data())});
    q.remove(top.region);
  }
  EXPECT_EQ(q.size(), 0u);
}

// Pushes in key order go to the run at about 8 bytes each; removing three of every four from the
// middle leaves holes (but at the back) that the next reserve() closes, moving the items and
// their positions (each later removal by position must find its node); the chunks the run no
// longer needs are released.
TEST(LruQueueTest, RunTakesEightBytesAnItemAndClosesItsHoles) {
  constexpr std::size_t kNodes = 100000;
  std::vector<HeapNode> nodes(kNodes);
  HeapNode::nodes = nodes.data();
  Queue q;
  for (std::size_t k = 0; k < kNodes; ++k) {
    ASSERT_TRUE(q.reserve(1));
    q.push(&nodes[k], 10 + k);
  }
  EXPECT_EQ(q.runSize(), kNodes);
  EXPECT_EQ(q.heapSize(), 0u);
  EXPECT_LT(static_cast<double>(q.storageBytes()), 8.2 * kNodes);
  const std::size_t full = q.storageBytes();
  for (std::size_t k = 1; k < kNodes; ++k) {
    if (k % 4 != 0) q.remove(&nodes[k]);
  }
  // Every removed one is a hole but the three after the last kept one (99,996): removals at the
  // back shorten the run.
  EXPECT_EQ(q.runHoles(), kNodes - 1 - (kNodes - 1) / 4 - 3);
  EXPECT_EQ(q.runSize(), 1 + (kNodes - 1) / 4);
  ASSERT_TRUE(q.reserve(1));
  EXPECT_EQ(q.runHoles(), 0u) << "more holes than items: closed";
  EXPECT_LT(q.storageBytes(), full / 3) << "the chunks past the run's new back were released";
  for (std::size_t k = 4; k < kNodes; k += 8) {  // by position, after the move
    q.remove(&nodes[k]);
    ASSERT_EQ(nodes[k].pos, kNotQueued) << k;
  }
  std::uint64_t last = 0;
  std::size_t left = 0;
  while (q.size() != 0) {
    const Queue::Item top = q.top();
    ASSERT_GT(top.key, last);
    ASSERT_EQ(top.key, 10 + static_cast<std::uint64_t>(top.region - nodes.data()));
    last = top.key;
    q.remove(top.region);
    ++left;
  }
  std::size_t kept = 0;  // node 0 and every fourth but those removed by position
  for (std::size_t k = 0; k < kNodes; ++k) kept += k == 0 || (k % 4 == 0 && k % 8 != 4);
  EXPECT_EQ(left, kept);
}

}  // namespace
}  // namespace gmd::rcache::detail

namespace gmd::rcache::test {
namespace {

using gmd::test::FakeBackend;

constexpr std::uintptr_t kPage = 4096;
constexpr std::uintptr_t kBase = 0x300000000ull;  // fake addresses, never dereferenced

// A cached region (its line, its leaf entry and its item in the eviction order) costs at most 96
// bytes of heap with 100,000 regions registered in address order (mallinfo2: glibc's allocator,
// headers included), what UCX's ucs_rcache takes: 4096 / 63 for the line in its span, 16 and a
// leaf's share of its header for the entry, 8 for the item (about 91; docs/rcache.md, "Memory").
// Measured as the benchmark's bytes/region counter is, in a process that already used a cache:
// a cache of a few regions first, so that the process-wide leaf pools hold their first chunks (a
// fresh process pays those too, ~2 bytes a region here). The bound catches any of the three going
// back to its former size (a 16-byte companion record, 24-byte entries, 16-byte items: 96 + 8 or
// more). And every region is a cache line of its own.
TEST(RcacheMemory, ARegionIsALineOfItsOwnAndCostsAtMost96BytesInAll) {
  constexpr std::size_t kRegions = 100000;
  FakeBackend backend(FakeBackend::kNoOracle);
  Config cfg;
  cfg.max_unused_bytes = SIZE_MAX;
  const Resolver resolver = Resolver::fixed(MemoryKind{MemType::kHost, -1}, &backend);
  auto fill = [&](Cache* cache, std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) {
      Region* r = nullptr;
      // One page each, a page apart: no two merge.
      ASSERT_EQ(cache->get(reinterpret_cast<void*>(kBase + 2 * k * kPage), kPage, kAccessLocalRead,
                           resolver, &r),
                Status::kOk);
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(r) % 64, 0u) << "region " << k;
      cache->put(r);
    }
    cache->progress();  // frees the leaves and tops the insertions replaced
  };
  {
    std::unique_ptr<Cache> warm;
    ASSERT_EQ(Cache::create(cfg, &warm), Status::kOk);
    fill(warm.get(), 200);  // leaves of every size class
  }
  const struct mallinfo2 m0 = mallinfo2();
  std::unique_ptr<Cache> cache;
  ASSERT_EQ(Cache::create(cfg, &cache), Status::kOk);
  fill(cache.get(), kRegions);
  ASSERT_EQ(cache->stats().regions, kRegions);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  (void)m0;
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc's: mallinfo2 does not measure it";
#else
  const struct mallinfo2 m1 = mallinfo2();
  const double before = static_cast<double>(m0.uordblks + m0.hblkhd);
  const double after = static_cast<double>(m1.uordblks + m1.hblkhd);
  const double per_region = (after - before) / kRegions;
  EXPECT_LE(per_region, 96.0);
  EXPECT_GT(per_region, 64.0) << "a region is a cache line at least: measured nothing?";
  std::printf("bytes per region: %.1f (arena %.1f, mmapped %.1f)\n", per_region,
              (double(m1.uordblks) - double(m0.uordblks)) / kRegions,
              (double(m1.hblkhd) - double(m0.hblkhd)) / kRegions);
#endif
}

}  // namespace
}  // namespace gmd::rcache::test
