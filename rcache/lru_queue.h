// The registration cache's eviction order (internal to rcache/): the valid indexed regions keyed by
// a release tick, minimum first, maintained by writers only (the hit path and put() never touch
// it). Two parts:
//
// - the run, a queue of items in the order they were pushed whose keys never decrease from front
//   to back: a push whose key is at least the last one pushed goes to its back. Regions enter the
//   cache with the current clock and are most often released in the order they were registered,
//   so most pushes land here, and taking the minimum from its front costs a few loads where a heap
//   sifts an item down log n levels of cold lines, writing each moved item's position into its
//   region (a third of an eviction among 100,000 regions; docs/rcache.md, "LRU");
// - a 4-ary heap (lru_heap.h) for the pushes that would break the run's order (a region re-keyed
//   with a release tick older than the run's back).
//
// The minimum is the smaller of the run's front and the heap's top. The run lives in chunks of
// kChunkItems items, addressed by a 64-bit logical index that only grows; a chunk the front leaves
// is kept for the back. A removal from the middle of the run leaves a hole (the item's id
// cleared); the front skips holes, and reserve() closes them all once they outnumber the run's
// items (each moved item's position rewritten), so the run never takes more than about twice its
// items.
//
// An item of the run is 8 bytes: the region's id and its key less its chunk's base, the key of the
// first item pushed into the chunk since the run was last empty (keys never decrease along the
// run, so the base is at most the key of every item in the chunk). A push whose key lies 2^32 or
// more past its chunk's base goes to the heap instead, with its key. An item that closing holes
// moves into such a chunk keeps the highest key the chunk can hold: lower than its own, at least
// its predecessors' (the run stays in order), so it is re-keyed when it reaches the front, as any
// stale key is.
//
// A key may be stale: put() stores a newer tick in the region without telling the queue. The
// cache's evictOne_locked() takes the minimum, and when the region's tick moved on it re-keys it
// and looks again, so the victim is the unused region with the smallest tick (docs/rcache.md,
// "LRU").
//
// `Node` is the region type; the queue owns what its member `std::uint32_t& lruPos()` names
// (kNotQueued when the region is not in the queue, or any value: a position is trusted only when
// the item there names the region). A position in the heap is its index there (below kRunBit); in
// the run, kRunBit and the low 31 bits of the logical index. `static std::uint32_t
// Node::idOf(const Node*)` gives a region's id (never 0), `static Node*
// Node::fromId(std::uint32_t)` the region of an id.
//
// Thread safety: one writer at a time (the cache's writer lock). remove() never allocates nor frees
// (invalidate() may call it from a memory hook, inside malloc); push() and update() need a
// reserve() of room for them first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "rcache/lru_heap.h"

namespace gmd::rcache::detail {

inline constexpr std::uint32_t kNotQueued = kNotInHeap;

template <typename Node>
class LruQueue {
 public:
  using Item = typename LruHeap<Node>::Item;  // what top() returns
  struct RunItem {
    std::uint32_t id;     // the region's (Node::idOf()); 0: a hole
    std::uint32_t delta;  // key less the chunk's base
  };
  static constexpr std::size_t kChunkItems = 512;  // 4 KiB
  static constexpr std::uint32_t kRunBit = 1u << 31;

  LruQueue() = default;
  ~LruQueue() {
    for (std::uint64_t c = front_ / kChunkItems; c < alloc_end_ / kChunkItems; ++c) {
      std::free(chunk(c).items);
    }
    trimFree(0);
    std::free(map_);
  }
  LruQueue(const LruQueue&) = delete;
  LruQueue& operator=(const LruQueue&) = delete;

  std::size_t size() const noexcept { return run_live_ + heap_.size(); }
  // Items in the run and holes in it (tests).
  std::size_t runSize() const noexcept { return run_live_; }
  std::size_t runHoles() const noexcept { return holes_; }
  std::size_t heapSize() const noexcept { return heap_.size(); }
  // Bytes of storage held (chunks, spare ones included, the chunk map, the heap's array).
  std::size_t storageBytes() const noexcept {
    const std::size_t chunks = (alloc_end_ - front_ / kChunkItems * kChunkItems) / kChunkItems;
    return (chunks + free_count_) * kChunkItems * sizeof(RunItem) + map_cap_ * sizeof(ChunkRef) +
           heap_.capacity() * sizeof(Item);
  }
  // The item with the smallest key (size() != 0).
  Item top() const noexcept {
    if (run_live_ == 0) return heap_.top();
    const std::uint64_t key = keyAt(front_);
    if (heap_.size() == 0 || key <= heap_.top().key) return Item{key, Node::fromId(at(front_).id)};
    return heap_.top();
  }
  // Room for n more push() or update() calls (and closes the run's holes once they outnumber its
  // items). False on no memory or past 2^31 - 1 items (the room it did make stays, for later).
  bool reserve(std::size_t n) noexcept {
    const bool ready = alloc_end_ >= back_ + n && heap_.capacity() - heap_.size() >= n &&
                       holes_ <= kChunkItems && free_count_ <= kSpareChunks;
    if (__builtin_expect(ready, 1)) return true;
    if (holes_ > kChunkItems && holes_ > run_live_) compact();
    trimFree(kSpareChunks);
    while (alloc_end_ < back_ + n) {
      if (!addChunk()) return false;
    }
    return heap_.reserve(n);
  }
  void push(Node* r, std::uint64_t key) noexcept {  // after reserve()
    if (run_live_ != 0 && key < back_key_) {
      heap_.push(r, key);
      return;
    }
    ChunkRef& c = chunk(back_ / kChunkItems);
    if (run_live_ == 0 || back_ % kChunkItems == 0) c.base = key;
    if (key - c.base > UINT32_MAX) {
      heap_.push(r, key);
      return;
    }
    at(back_) = RunItem{Node::idOf(r), static_cast<std::uint32_t>(key - c.base)};
    r->lruPos() = runPos(back_);
    ++back_;
    ++run_live_;
    back_key_ = key;
  }
  void remove(Node* r) noexcept {
    const std::uint32_t p = r->lruPos();
    if ((p & kRunBit) == 0) {
      heap_.remove(r);
      return;
    }
    std::uint64_t l;
    if (p == kNotQueued || !inRun(p, &l) || at(l).id != Node::idOf(r)) return;
    at(l).id = 0;
    r->lruPos() = kNotQueued;
    --run_live_;
    if (l + 1 == back_) {  // the last one pushed (a region invalidated soon after its miss)
      --back_;
      while (back_ > front_ && at(back_ - 1).id == 0) {
        --back_;
        --holes_;
      }
      if (front_ == back_) back_key_ = 0;
      return;
    }
    ++holes_;
    if (l == front_) skipHoles();
  }
  // A new key for a queued region: where it now belongs (after reserve()).
  void update(Node* r, std::uint64_t key) noexcept {
    if ((r->lruPos() & kRunBit) == 0) {
      heap_.update(r, key);
      return;
    }
    remove(r);
    push(r, key);
  }
  // Forgets every item and its storage without touching either (fork child: the regions are
  // orphans and the parent's arrays may lie on pages the child does not have). Leaks them.
  void abandon() noexcept {
    heap_.abandon();
    map_ = nullptr;
    map_cap_ = 0;
    free_ = nullptr;
    free_count_ = 0;
    front_ = back_ = alloc_end_ = 0;
    run_live_ = holes_ = 0;
    back_key_ = 0;
  }

 private:
  static constexpr std::size_t kSpareChunks = 2;
  static constexpr std::uint32_t kIndexMask = kRunBit - 1;

  struct ChunkRef {
    RunItem* items;
    std::uint64_t base;  // the key its deltas add to
  };
  ChunkRef& chunk(std::uint64_t c) const noexcept { return map_[c & (map_cap_ - 1)]; }
  RunItem& at(std::uint64_t l) const noexcept {
    return chunk(l / kChunkItems).items[l % kChunkItems];
  }
  std::uint64_t keyAt(std::uint64_t l) const noexcept {
    return chunk(l / kChunkItems).base + at(l).delta;
  }
  static std::uint32_t runPos(std::uint64_t l) noexcept {
    return kRunBit | (static_cast<std::uint32_t>(l) & kIndexMask);
  }
  // The logical index whose low 31 bits p holds, if it lies in the run.
  bool inRun(std::uint32_t p, std::uint64_t* l) const noexcept {
    *l = front_ + ((p - static_cast<std::uint32_t>(front_)) & kIndexMask);
    return *l < back_;
  }
  // Past the holes at the front; the chunks it leaves wait on the free list (no free() here).
  void skipHoles() noexcept {
    while (front_ < back_ && at(front_).id == 0) {
      --holes_;
      ++front_;
      if (front_ % kChunkItems == 0) releaseChunk(front_ / kChunkItems - 1);
    }
    if (front_ == back_) back_key_ = 0;
  }
  void releaseChunk(std::uint64_t c) noexcept {
    RunItem*& slot = chunk(c).items;
    *reinterpret_cast<RunItem**>(slot) = free_;
    free_ = slot;
    slot = nullptr;
    ++free_count_;
  }
  void trimFree(std::size_t keep) noexcept {
    while (free_count_ > keep) {
      RunItem* c = free_;
      free_ = *reinterpret_cast<RunItem**>(c);
      std::free(c);
      --free_count_;
    }
  }
  // One more chunk at alloc_end_ (the map grows when it has no slot for it).
  bool addChunk() noexcept {
    const std::uint64_t first = front_ / kChunkItems;
    const std::uint64_t chunks = alloc_end_ / kChunkItems - first;  // in the map now
    if (back_ - front_ + kChunkItems > kIndexMask) return false;
    if (chunks + 1 > map_cap_) {
      const std::size_t cap = std::max<std::size_t>(8, map_cap_ * 2);
      auto* map = static_cast<ChunkRef*>(std::calloc(cap, sizeof(ChunkRef)));
      if (map == nullptr) return false;
      for (std::uint64_t c = first; c < first + chunks; ++c) map[c & (cap - 1)] = chunk(c);
      std::free(map_);
      map_ = map;
      map_cap_ = cap;
    }
    RunItem* items = free_;
    if (items != nullptr) {
      free_ = *reinterpret_cast<RunItem**>(items);
      --free_count_;
    } else {
      items = static_cast<RunItem*>(std::malloc(kChunkItems * sizeof(RunItem)));
      if (items == nullptr) return false;
    }
    chunk(alloc_end_ / kChunkItems) = ChunkRef{items, 0};
    alloc_end_ += kChunkItems;
    return true;
  }
  // Closes every hole of the run, keeping its order: each item moved gets its new position (and
  // its key again, from its new chunk's base, saturated: see the top). The chunks past the new back
  // go to the free list.
  void compact() noexcept {
    std::uint64_t w = front_;
    for (std::uint64_t l = front_; l < back_; ++l) {
      const RunItem it = at(l);
      if (it.id == 0) continue;
      if (w != l) {
        const std::uint64_t d = keyAt(l) - chunk(w / kChunkItems).base;
        at(w) = RunItem{it.id, static_cast<std::uint32_t>(std::min<std::uint64_t>(d, UINT32_MAX))};
        Node::fromId(it.id)->lruPos() = runPos(w);
      }
      ++w;
    }
    back_ = w;
    holes_ = 0;
    // Chunks are kept up to the one back_ lies in.
    const std::uint64_t keep_end = (back_ + kChunkItems - 1) / kChunkItems * kChunkItems;
    for (; alloc_end_ > keep_end; alloc_end_ -= kChunkItems) {
      releaseChunk(alloc_end_ / kChunkItems - 1);
    }
  }

  LruHeap<Node> heap_;
  ChunkRef* map_ = nullptr;  // chunk c at map_[c % map_cap_], for chunks front_ / kChunkItems on
  std::size_t map_cap_ = 0;  // a power of two
  RunItem* free_ = nullptr;  // chunks to reuse, linked through their first bytes
  std::size_t free_count_ = 0;
  std::uint64_t front_ = 0;  // the run is [front_, back_); at(front_) is an item, not a hole
  std::uint64_t back_ = 0;
  std::uint64_t alloc_end_ = 0;  // chunks exist for [front_ rounded down, alloc_end_)
  std::size_t run_live_ = 0;
  std::size_t holes_ = 0;
  std::uint64_t back_key_ = 0;  // the last key pushed onto the run
};

}  // namespace gmd::rcache::detail
