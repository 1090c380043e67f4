// The registration cache's eviction order (internal to rcache/): a 4-ary min-heap of the valid
// indexed regions keyed by a release tick, maintained by writers only (the hit path and put() never
// touch it). Four children per node: half the levels of a binary heap, and each level's children
// share a cache line; every item moved writes its region's heap_pos_, in a big cache a cold line.
//
// A key may be stale: put() stores a newer tick in the region without telling the heap. The cache's
// evictOne_locked() pops the minimum, and when the region's tick moved on it re-keys it and looks
// again, so the victim is the unused region with the smallest tick (docs/rcache.md, "LRU").
//
// `Node` is the region type; the heap owns its member `std::uint32_t heap_pos_` (kNotInHeap when
// the region is not in the heap).
//
// Thread safety: one writer at a time (the cache's writer lock). remove() and update() never
// allocate (invalidate() may call them); push() needs a reserveOne() first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>

namespace gmd::rcache::detail {

inline constexpr std::uint32_t kNotInHeap = UINT32_MAX;

template <typename Node>
class LruHeap {
 public:
  struct Item {
    std::uint64_t key;
    Node* region;
  };
  LruHeap() = default;
  ~LruHeap() { delete[] items_; }
  LruHeap(const LruHeap&) = delete;
  LruHeap& operator=(const LruHeap&) = delete;

  std::size_t size() const noexcept { return size_; }
  const Item& top() const noexcept { return items_[0]; }
  // Room for one more push(). False on no memory or past 2^32 - 1 regions.
  bool reserveOne() noexcept {
    if (size_ < cap_) return true;
    if (cap_ >= kNotInHeap - 1) return false;
    const std::size_t cap =
        std::min<std::size_t>(std::max<std::size_t>(64, cap_ * 2), kNotInHeap - 1);
    auto* items = new (std::nothrow) Item[cap];
    if (items == nullptr) return false;
    std::copy(items_, items_ + size_, items);
    delete[] items_;
    items_ = items;
    cap_ = cap;
    return true;
  }
  void push(Node* r, std::uint64_t key) noexcept {  // after reserveOne()
    items_[size_] = Item{key, r};
    r->heap_pos_ = static_cast<std::uint32_t>(size_);
    ++size_;
    up(size_ - 1);
  }
  void remove(Node* r) noexcept {
    const std::size_t i = r->heap_pos_;
    if (i >= size_ || items_[i].region != r) return;
    r->heap_pos_ = kNotInHeap;
    --size_;
    if (i == size_) return;
    place(i, items_[size_]);
    if (!up(i)) down(i);
  }
  void update(Node* r, std::uint64_t key) noexcept {
    const std::size_t i = r->heap_pos_;
    if (i >= size_ || items_[i].region != r) return;
    items_[i].key = key;
    if (!up(i)) down(i);
  }
  // Forgets every item and its storage without touching either (fork child: the regions are
  // orphans and the parent's array may lie on a page the child does not have). Leaks the array.
  void abandon() noexcept {
    items_ = nullptr;
    cap_ = 0;
    size_ = 0;
  }

 private:
  void place(std::size_t i, const Item& it) noexcept {
    items_[i] = it;
    it.region->heap_pos_ = static_cast<std::uint32_t>(i);
  }
  bool up(std::size_t i) noexcept {
    const Item it = items_[i];
    const std::size_t start = i;
    while (i > 0) {
      const std::size_t parent = (i - 1) / kArity;
      if (items_[parent].key <= it.key) break;
      place(i, items_[parent]);
      i = parent;
    }
    place(i, it);
    return i != start;
  }
  void down(std::size_t i) noexcept {
    const Item it = items_[i];
    for (;;) {
      const std::size_t first = kArity * i + 1;
      if (first >= size_) break;
      const std::size_t last = std::min(first + kArity, size_);
      std::size_t c = first;
      for (std::size_t k = first + 1; k < last; ++k) {
        if (items_[k].key < items_[c].key) c = k;
      }
      if (it.key <= items_[c].key) break;
      place(i, items_[c]);
      i = c;
    }
    place(i, it);
  }

  static constexpr std::size_t kArity = 4;
  Item* items_ = nullptr;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

}  // namespace gmd::rcache::detail
