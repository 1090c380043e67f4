// The registration cache's eviction order (internal to rcache/): a 4-ary min-heap of the valid
// indexed regions keyed by a release tick, maintained by writers only (the hit path and put() never
// touch it). Four children per node: half the levels of a binary heap, and each level's children
// share a cache line; every item moved writes its region's heap position, in a big cache a cold
// line (the cache keeps it in the region's 16-byte companion record, four to a line).
//
// A key may be stale: put() stores a newer tick in the region without telling the heap. The cache's
// evictOne_locked() pops the minimum, and when the region's tick moved on it re-keys it and looks
// again, so the victim is the unused region with the smallest tick (docs/rcache.md, "LRU").
//
// `Node` is the region type; the heap owns what its member `std::uint32_t& heapPos()` names
// (kNotInHeap when the region is not in the heap, or any value: an item's position is trusted
// only when the item there names the region).
//
// The array grows by doubling up to kStepItems items (64 KiB), then by kStepItems or a sixteenth,
// whichever is more: at most about 1/16 spare (16-byte items: ~17 bytes per region), through
// realloc(), which past malloc's mmap threshold remaps the pages instead of copying them.
//
// Thread safety: one writer at a time (the cache's writer lock). remove() and update() never
// allocate (invalidate() may call them); push() needs a reserveOne() first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace gmd::rcache::detail {

inline constexpr std::uint32_t kNotInHeap = UINT32_MAX;

template <typename Node>
class LruHeap {
 public:
  struct Item {
    std::uint64_t key;
    Node* region;
  };
  static_assert(std::is_trivially_copyable_v<Item>);
  static constexpr std::size_t kStepItems = 4096;

  LruHeap() = default;
  ~LruHeap() { std::free(items_); }
  LruHeap(const LruHeap&) = delete;
  LruHeap& operator=(const LruHeap&) = delete;

  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return cap_; }
  const Item& top() const noexcept { return items_[0]; }
  // Room for one more push(). False on no memory or past 2^32 - 1 regions.
  bool reserveOne() noexcept {
    if (size_ < cap_) return true;
    if (cap_ >= kNotInHeap - 1) return false;
    const std::size_t grown = cap_ < kStepItems ? std::max<std::size_t>(64, cap_ * 2)
                                                : cap_ + std::max(kStepItems, cap_ / 16);
    const std::size_t cap = std::min<std::size_t>(grown, kNotInHeap - 1);
    void* items = std::realloc(items_, cap * sizeof(Item));
    if (items == nullptr) return false;  // the old array stays
    items_ = static_cast<Item*>(items);
    cap_ = cap;
    return true;
  }
  void push(Node* r, std::uint64_t key) noexcept {  // after reserveOne()
    items_[size_] = Item{key, r};
    r->heapPos() = static_cast<std::uint32_t>(size_);
    ++size_;
    up(size_ - 1);
  }
  void remove(Node* r) noexcept {
    const std::size_t i = r->heapPos();
    if (i >= size_ || items_[i].region != r) return;
    r->heapPos() = kNotInHeap;
    --size_;
    if (i == size_) return;
    place(i, items_[size_]);
    if (!up(i)) down(i);
  }
  void update(Node* r, std::uint64_t key) noexcept {
    const std::size_t i = r->heapPos();
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
    it.region->heapPos() = static_cast<std::uint32_t>(i);
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
