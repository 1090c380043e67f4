// The registration cache's index (internal to rcache/): the valid and not-yet-purged regions,
// disjoint, sorted by start, in two levels that readers search without a lock.
//
// A Leaf is an immutable sorted array of at most kLeafMax entries; the Top is a sorted array of
// {key, leaf}: leaf i holds the entries whose start lies in [key i, key i+1), key 0 is 0, and no
// leaf is empty unless it is the only one. A key may be lower than its leaf's first start (that
// entry left the leaf); a lookup that finds nothing at or below the address in its leaf takes the
// last entry of the leaf before.
//
// Writers replace a changed leaf in place (an atomic store into its Top slot) and publish a new Top
// only when leaves are split, merged or dropped, so a miss or an invalidation copies one leaf of at
// most kLeafMax entries, plus, once every ~kLeafMax/2 insertions into a leaf, the Top (one 16-byte
// slot per leaf). What a writer replaces is retired to the RetireList (reclaim.h) and freed once no
// reader can see it.
//
// Removal is two-step: queuePurge() marks an entry for removal (hook-safe: no allocation), purge()
// rewrites each affected leaf once. Entries queued for purge stay visible to readers, who must
// check the region's own validity (the cache's state word) after the lookup.
//
// `Node` is the region type. It provides `std::uintptr_t start() const`, `std::uintptr_t end()
// const` and two members the index owns: `Node* next_unindex_` (the purge list) and `bool
// in_index_` (an entry of the published index points at it). gtest/rcache/index_test.cc
// instantiates it with a plain struct.
//
// Thread safety: top() and the lookups on a Top from any thread inside a reader epoch; every other
// member by one writer at a time (the cache's writer lock). queuePurge() never allocates.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "rcache/block_pool.h"
#include "rcache/reclaim.h"

namespace gmd::rcache::detail {

inline constexpr std::uint8_t kRetiredLeaf = 1;  // Retired::kind of leaves and tops (regions are
inline constexpr std::uint8_t kRetiredTop = 2;   // the cache's: kind 0)

inline constexpr std::size_t kLeafMax = 64;
inline constexpr std::size_t kLeafMin = 16;  // a smaller leaf merges with a neighbour when they fit

template <typename Node>
struct IndexEntry {
  std::uintptr_t start;
  std::uintptr_t end;
  Node* region;
};

// Leaves come from four process-wide pools, of 16, 32, 48 and 64 entries (a leaf takes the
// smallest that fits): no malloc on a miss, no header per leaf. Their blocks are reused, never
// returned to malloc. The fork handlers lock them (lockLeafPoolsForFork()).
inline constexpr std::size_t kLeafHeaderBytes = 32;  // sizeof(Leaf<Node>), for every Node
inline constexpr std::size_t kEntryBytes = 24;       // sizeof(IndexEntry<Node>)
inline constexpr std::size_t kLeafClassEntries = 16;
inline constexpr std::size_t kLeafClasses = kLeafMax / kLeafClassEntries;
static_assert(kLeafMax % kLeafClassEntries == 0);

constexpr std::size_t leafBlockBytes(std::size_t leaf_class) noexcept {
  return kLeafHeaderBytes + (leaf_class + 1) * kLeafClassEntries * kEntryBytes;
}
// The pool of class c (in static storage, never destroyed: leaves may be freed after main()).
template <std::size_t kClass>
BlockPool<leafBlockBytes(kClass), alignof(std::max_align_t)>& leafPool() noexcept {
  using Pool = BlockPool<leafBlockBytes(kClass), alignof(std::max_align_t)>;
  alignas(Pool) static unsigned char storage[sizeof(Pool)];
  static Pool* pool = new (storage) Pool;
  return *pool;
}
static_assert(kLeafClasses == 4, "leafPoolCall() names each class");
// Calls f(pool) on the pool of class c.
template <typename F>
decltype(auto) leafPoolCall(std::size_t c, F f) noexcept {
  switch (c) {
    case 0:
      return f(leafPool<0>());
    case 1:
      return f(leafPool<1>());
    case 2:
      return f(leafPool<2>());
    default:
      return f(leafPool<3>());
  }
}
inline void lockLeafPoolsForFork() noexcept {
  for (std::size_t c = 0; c < kLeafClasses; ++c) {
    leafPoolCall(c, [](auto& p) { p.lockForFork(); });
  }
}
inline void unlockLeafPoolsAfterFork() noexcept {
  for (std::size_t c = 0; c < kLeafClasses; ++c) {
    leafPoolCall(c, [](auto& p) { p.unlockAfterFork(); });
  }
}

template <typename Node>
struct Leaf : Retired {
  using Entry = IndexEntry<Node>;
  std::size_t size = 0;
  Entry* entries() noexcept { return reinterpret_cast<Entry*>(this + 1); }
  const Entry* entries() const noexcept { return reinterpret_cast<const Entry*>(this + 1); }

  // A leaf of n <= kLeafMax entries.
  static Leaf* allocate(std::size_t n) noexcept {
    static_assert(sizeof(Leaf) == kLeafHeaderBytes && sizeof(Entry) == kEntryBytes);
    const std::size_t c = n == 0 ? 0 : (n - 1) / kLeafClassEntries;
    void* p = leafPoolCall(c, [](auto& pool) { return pool.allocate(); });
    if (p == nullptr) return nullptr;
    auto* l = new (p) Leaf;
    l->kind = kRetiredLeaf;
    l->bytes = static_cast<std::uint32_t>(leafBlockBytes(c));
    l->size = n;
    return l;
  }
  static void release(Leaf* l) noexcept {
    const std::size_t c = (l->bytes - kLeafHeaderBytes) / (kLeafClassEntries * kEntryBytes) - 1;
    l->~Leaf();
    leafPoolCall(c, [l](auto& pool) { pool.release(l); });
  }
  // Number of entries whose start <= addr (the last of them is the floor entry).
  std::size_t upper(std::uintptr_t addr) const noexcept {
    std::size_t lo = 0, hi = size;
    const Entry* e = entries();
    while (lo < hi) {
      const std::size_t mid = (lo + hi) / 2;
      if (e[mid].start <= addr) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
};

template <typename Node>
struct TopSlot {
  std::uintptr_t key;
  std::atomic<Leaf<Node>*> leaf;  // replaced by writers (release); readers load it with acquire
};

template <typename Node>
struct Top : Retired {
  using Entry = IndexEntry<Node>;
  using Slot = TopSlot<Node>;
  std::size_t size = 0;  // leaves, at least 1
  Slot* slots() noexcept { return reinterpret_cast<Slot*>(this + 1); }
  const Slot* slots() const noexcept { return reinterpret_cast<const Slot*>(this + 1); }

  static Top* allocate(std::size_t n) noexcept {
    void* p = ::operator new(sizeof(Top) + n * sizeof(Slot), std::nothrow);
    if (p == nullptr) return nullptr;
    auto* t = new (p) Top;
    t->kind = kRetiredTop;
    const std::size_t bytes = sizeof(Top) + n * sizeof(Slot);
    t->bytes = bytes > UINT32_MAX ? UINT32_MAX : static_cast<std::uint32_t>(bytes);
    t->size = n;
    for (std::size_t i = 0; i < n; ++i) new (&t->slots()[i]) Slot{0, {nullptr}};
    return t;
  }
  static void release(Top* t) noexcept {
    t->~Top();
    ::operator delete(t);
  }
  Leaf<Node>* leaf(std::size_t i) const noexcept {
    return slots()[i].leaf.load(std::memory_order_acquire);
  }
  // The leaf whose key range holds addr.
  std::size_t leafFor(std::uintptr_t addr) const noexcept {
    std::size_t lo = 1, hi = size;  // key 0 is 0 <= addr
    const Slot* s = slots();
    while (lo < hi) {
      const std::size_t mid = (lo + hi) / 2;
      if (s[mid].key <= addr) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo - 1;
  }
  // The entry with the greatest start <= addr, or null. Safe for readers inside an epoch.
  const Entry* floor(std::uintptr_t addr) const noexcept {
    const std::size_t i = leafFor(addr);
    const Leaf<Node>* l = leaf(i);
    const std::size_t k = l->upper(addr);
    if (__builtin_expect(k != 0, 1)) return &l->entries()[k - 1];
    if (i == 0) return nullptr;
    const Leaf<Node>* prev = leaf(i - 1);  // never empty when there is more than one leaf
    return prev->size != 0 ? &prev->entries()[prev->size - 1] : nullptr;
  }
};

template <typename Node>
class Index {
 public:
  using Entry = IndexEntry<Node>;
  using LeafT = Leaf<Node>;
  using TopT = Top<Node>;

  // What writers replace is retired to `reclaimer`.
  explicit Index(Reclaimer* reclaimer) noexcept : reclaimer_(reclaimer) {}
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  // Readers: the published top (inside an epoch).
  const TopT* top() const noexcept { return top_.load(std::memory_order_seq_cst); }
  // Writers: the current top.
  TopT* current() const noexcept { return top_.load(std::memory_order_relaxed); }
  static bool isEmptyLeaf(const LeafT* l) noexcept { return l == &empty_leaf_; }
  static bool isEmptyTop(const TopT* t) noexcept { return t == &empty_.top; }

  // Calls f(const Entry&) for every entry (valid or queued for purge) overlapping [start, end), in
  // order. f must not change the index.
  template <typename F>
  void forEachOverlap(std::uintptr_t start, std::uintptr_t end, F f) const noexcept;

  // `r` (whose entry is in a leaf, or not: then nothing happens) leaves the index at the next
  // purge(). Never allocates.
  void queuePurge(Node* r) noexcept {
    if (!r->in_index_) return;
    r->next_unindex_ = unindex_;
    unindex_ = r;
    dirty_ = true;
  }
  bool dirty() const noexcept { return dirty_; }
  // How many insert() calls there were: entries enter the index only through insert(), so while it
  // stands still no new entry can overlap a range where a walk found none.
  std::uint64_t insertions() const noexcept { return insertions_; }
  // Takes the entries queued by queuePurge() out of their leaves, one rewrite per leaf. False if a
  // leaf could not be rewritten (no memory): its regions stay queued for a later pass.
  bool purge() noexcept;
  // Indexes `r` once the entries it overlaps were queued for purge. False when it cannot (no
  // memory, or an overlapped entry could not be purged): then `r` is not indexed.
  bool insert(Node* r) noexcept;

  // Replaces the index by the empty one and hands the old top to the caller, who owns it and its
  // leaves (release them with releaseDetached()). Forgets the purge queue. For the cache's
  // destructor and a fork child, where no reader can be inside.
  TopT* detach() noexcept {
    TopT* t = current();
    top_.store(&empty_.top, std::memory_order_relaxed);
    unindex_ = nullptr;
    dirty_ = false;
    return t;
  }
  static void releaseLeaf(LeafT* l) noexcept {
    if (!isEmptyLeaf(l)) LeafT::release(l);
  }
  static void releaseTop(TopT* t) noexcept {
    if (!isEmptyTop(t)) TopT::release(t);
  }
  // Frees a retired leaf or top; false for other kinds (the caller's).
  static bool freeRetired(Retired* x) noexcept {
    if (x->kind == kRetiredLeaf) {
      LeafT::release(static_cast<LeafT*>(x));
    } else if (x->kind == kRetiredTop) {
      TopT::release(static_cast<TopT*>(x));
    } else {
      return false;
    }
    return true;
  }
  void retire(Retired* x) noexcept { reclaimer_->retire(x); }

 private:
  bool replaceLeaves(std::size_t first, std::size_t count, LeafT* const* leaves,
                     const std::uintptr_t* keys, std::size_t n) noexcept;
  bool rewriteLeaf(std::size_t i, Node* add, Node* drop) noexcept;
  static Node* reverse(Node* list) noexcept;
  static Node* sortByStart(Node* list) noexcept;

  // The empty index: one empty leaf. Shared by every index of this Node type, never written to
  // nor freed: a writer that finds it current publishes a new Top instead of replacing its leaf.
  struct EmptyIndex {
    TopT top;
    TopSlot<Node> slot;
    constexpr explicit EmptyIndex(LeafT* l) : slot{0, {l}} {
      top.kind = kRetiredTop;
      top.size = 1;
    }
  };
  static constinit inline LeafT empty_leaf_{};
  static constinit inline EmptyIndex empty_{&empty_leaf_};
  static_assert(sizeof(LeafT) % alignof(Entry) == 0);
  static_assert(sizeof(TopT) % alignof(TopSlot<Node>) == 0);
  static_assert(sizeof(EmptyIndex) == sizeof(TopT) + sizeof(TopSlot<Node>), "slot follows top");

  // 40 bytes: the cache keeps them on the cache line its hit path reads.
  std::atomic<TopT*> top_{&empty_.top};
  Node* unindex_ = nullptr;  // queued for purge: invalid, entry still in a leaf
  bool dirty_ = false;       // unindex_ is not empty
  Reclaimer* reclaimer_;
  std::uint64_t insertions_ = 0;
};

}  // namespace gmd::rcache::detail

#include "rcache/index_inl.h"
