// A 4-ary min-heap of regions by key (internal to rcache/): the part of the eviction order
// (lru_queue.h) that holds the items pushed out of order. Four children per node: half the levels
// of a binary heap, and each level's children share a cache line; every item moved writes its
// region's position (`std::uint32_t& lruPos()`: kNotInHeap when not in the heap, or any value: a
// position is trusted only when the item there names the region).
//
// The array grows by doubling up to kStepItems items (64 KiB), then by kStepItems or a sixteenth,
// whichever is more: at most about 1/16 spare, through realloc(), which past malloc's mmap
// threshold remaps the pages instead of copying them. At most kMaxItems items (positions stay
// below 2^31: the queue marks its run's positions with the top bit).
//
// Thread safety: one writer at a time (the cache's writer lock). remove() and update() never
// allocate; push() needs a reserve() first.
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
  static constexpr std::size_t kMaxItems = 0x7fffffff;

  LruHeap() = default;
  ~LruHeap() { std::free(items_); }
  LruHeap(const LruHeap&) = delete;
  LruHeap& operator=(const LruHeap&) = delete;

  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return cap_; }
  const Item& top() const noexcept { return items_[0]; }
  // Room for n more push() calls. False on no memory or past kMaxItems items (the old array stays).
  bool reserve(std::size_t n) noexcept {
    while (cap_ - size_ < n) {
      if (cap_ >= kMaxItems) return false;
      const std::size_t grown = cap_ < kStepItems ? std::max<std::size_t>(64, cap_ * 2)
                                                  : cap_ + std::max(kStepItems, cap_ / 16);
      const std::size_t cap = std::min<std::size_t>(grown, kMaxItems);
      void* items = std::realloc(items_, cap * sizeof(Item));
      if (items == nullptr) return false;
      items_ = static_cast<Item*>(items);
      cap_ = cap;
    }
    return true;
  }
  void push(Node* r, std::uint64_t key) noexcept {  // after reserve()
    items_[size_] = Item{key, r};
    r->lruPos() = static_cast<std::uint32_t>(size_);
    ++size_;
    up(size_ - 1);
  }
  void remove(Node* r) noexcept {
    const std::size_t i = r->lruPos();
    if (i >= size_ || items_[i].region != r) return;
    r->lruPos() = kNotInHeap;
    --size_;
    if (i == size_) return;
    place(i, items_[size_]);
    if (!up(i)) down(i);
  }
  void update(Node* r, std::uint64_t key) noexcept {
    const std::size_t i = r->lruPos();
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
    it.region->lruPos() = static_cast<std::uint32_t>(i);
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
