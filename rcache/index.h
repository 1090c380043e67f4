// The registration cache's index (internal to rcache/): the valid and not-yet-purged regions,
// disjoint, sorted by start, in two levels that readers search without a lock.
//
// A Leaf is a sorted array of at most kLeafMax entries; the Top is a sorted array of {key, leaf}:
// leaf i holds the entries whose start lies in [key i, key i+1), key 0 is 0, and no leaf is empty
// unless it is the only one. A key may be lower than its leaf's first start (that entry left the
// leaf); a lookup that finds nothing at or below the address in its leaf takes the last entry of
// the leaf before.
//
// Writers edit a leaf in place under its sequence lock (Leaf: insert and erase move entries within
// the leaf's block) as long as it stays within its block and between kLeafMin and kLeafMax
// entries. Otherwise they build a new leaf aside (a bigger block, a split, a merge) and store it
// into its Top slot, and publish a new Top when leaves are split, merged or dropped. What a writer
// replaces is retired to the RetireList (reclaim.h) and freed once no reader can see it; a leaf
// edited in place is never freed under a reader, so a reader that validated its read may follow
// the region pointer it copied for as long as its epoch lasts (regions are retired the same way).
//
// Removal is two-step: queuePurge() marks an entry for removal (hook-safe: no allocation), purge()
// rewrites each affected leaf once. Entries queued for purge stay visible to readers, who must
// check the region's own validity (the cache's state word) after the lookup.
//
// `Node` is the region type. It provides `std::uintptr_t start() const`, `std::uintptr_t end()
// const` (both immutable while the node is indexed or readers may see it), the purge list's link
// that the index owns (`Node* nextUnindex() const`, `void setNextUnindex(Node*)`) and the member
// `bool in_index_` (an entry of the published index points at it). gtest/rcache/index_test.cc
// instantiates it with a plain struct.
//
// Thread safety: top() and Top::floor() from any thread inside a reader epoch (floor() copies the
// entry out of a validated read of its leaf); every other member by one writer at a time (the
// cache's writer lock). queuePurge() never allocates.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#include "rcache/block_pool.h"
#include "rcache/reclaim.h"

namespace gmd::rcache::detail {

inline constexpr std::uint8_t kRetiredLeaf = 1;  // Retired::kind of leaves and tops (regions are
inline constexpr std::uint8_t kRetiredTop = 2;   // the cache's: kind 0)

inline constexpr std::size_t kLeafMax = 64;
inline constexpr std::size_t kLeafMin = 16;  // a smaller leaf merges with a neighbour when they fit

// An entry: its region's start, which the searches compare, and one word holding the region's
// address and, in the low bits its alignment leaves (Node is aligned to 64 bytes), its length in
// 4 KiB pages when that is 1 to 62 pages (kLongPages: longer, or not a whole number of pages).
// What a lookup needs of the floor entry, whether it reaches an address, then comes without
// reading the region's line for the short ones: the line a hit reads anyway, but a miss's
// neighbour's in a big cache, cold (a miss among 100,000 regions: 200 -> 350 ns when read). 16
// bytes an entry instead of 24 for {start, end, region}.
template <typename Node>
struct IndexEntry {
  static constexpr unsigned kPageShift = 12;
  static constexpr std::uintptr_t kPagesMask = 63;
  static constexpr std::uintptr_t kLongPages = kPagesMask;
  static_assert(alignof(Node) > kPagesMask, "the length lives in the address's low bits");

  std::uintptr_t start;
  std::uintptr_t word;  // the region's address | its length in pages (short) or kLongPages

  static IndexEntry of(Node* n) noexcept {
    const std::uintptr_t len = n->end() - n->start();
    const std::uintptr_t pages = len >> kPageShift;
    const bool exact = (len & ((std::uintptr_t{1} << kPageShift) - 1)) == 0;
    return IndexEntry{n->start(), reinterpret_cast<std::uintptr_t>(n) |
                                      (exact && pages < kLongPages ? pages : kLongPages)};
  }
  Node* region() const noexcept { return reinterpret_cast<Node*>(word & ~kPagesMask); }
  // The region's end (the region's own when the entry does not hold it).
  std::uintptr_t end() const noexcept {
    const std::uintptr_t pages = word & kPagesMask;
    return pages != kLongPages ? start + (pages << kPageShift) : region()->end();
  }
  // Whether the region reaches `to` (>= start): end() >= to, with one operation after the load of
  // the word where the entry holds the length (the pages `to` needs come from `start`, loaded
  // with it): a hit's path to its compare-and-swap, which waits for every older instruction.
  bool reaches(std::uintptr_t to) const noexcept {
    const std::uintptr_t pages = word & kPagesMask;
    const std::uintptr_t need = (to - start + (std::uintptr_t{1} << kPageShift) - 1) >> kPageShift;
    return pages != kLongPages ? pages >= need : region()->end() >= to;
  }
};

// Leaves come from four process-wide pools, of 16, 32, 48 and 64 entries (a leaf takes the
// smallest that fits): no malloc on a miss, no header per leaf. Their blocks are reused, never
// returned to malloc. The fork handlers lock them (lockLeafPoolsForFork()).
inline constexpr std::size_t kLeafHeaderBytes = 32;  // sizeof(Leaf<Node>), for every Node
inline constexpr std::size_t kEntryBytes = 16;       // sizeof(IndexEntry<Node>)
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

// How many of the n sorted keys key(0..n-1) are <= addr. Two forms: a binary search that jumps,
// which a lookup repeated on hot lines predicts perfectly, the core then running ahead of its loads
// (the leaves' searches); and one without jumps (each step conditional adds, the same number of
// steps whatever the keys), for the searches of the Top by writers and by readers whose position
// did not answer: in a big cache a miss's address is new, and the jumps of a search over hundreds
// of keys mispredict half the time (measured with 10,000 regions: a miss 470 -> 320 ns; the same
// form in the leaves gained nothing, and made sequential evictions slower).
template <typename KeyAt>
inline std::size_t countAtOrBelow(std::size_t n, std::uintptr_t addr, KeyAt key) noexcept {
  std::size_t lo = 0, hi = n;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (key(mid) <= addr) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}
// keyp(i) points at key i. Each step compares the address with seven keys spread evenly over what
// is left (independent loads, which the core issues together) and keeps the eighth between the last
// key at or below it and the next: log8(n) steps, not log2(n), each a few cycles longer. A search
// of the Top is a chain of dependent steps (a binary step's load, compare and add take 10-12 cycles
// even from L1). Measured on an Intel Xeon, a search of 157 keys alone: 29 -> 16 ns.
template <typename KeyPtr>
inline std::size_t countAtOrBelowNoBranch(std::size_t n, std::uintptr_t addr,
                                          KeyPtr keyp) noexcept {
  constexpr std::size_t kWays = 8;
  std::size_t base = 0;
  while (n >= kWays) {
    // The answer is in [base, base + n); the keys at base + q, ..., base + 7q split it into eight
    // parts, the last one the longest (n - 7q >= q).
    const std::size_t q = n / kWays;
    std::size_t below = 0;
#pragma GCC unroll 8
    for (std::size_t j = 1; j < kWays; ++j)
      below += static_cast<std::size_t>(*keyp(base + j * q) <= addr);
    base += below * q;
    n -= (kWays - 1) * q;
  }
  std::size_t count = base;
  for (std::size_t j = 0; j < n; ++j) count += static_cast<std::size_t>(*keyp(base + j) <= addr);
  return count;
}

// How a leaf's sequence lock orders its entries (see Leaf). ThreadSanitizer does not model fences
// (GCC warns about them under -fsanitize=thread): there the entries are loaded with acquire and
// stored with release instead, which gives the same guarantee (and compiles to the same plain moves
// on x86).
#if defined(__SANITIZE_THREAD__)
inline constexpr std::memory_order kEntryLoad = std::memory_order_acquire;
inline constexpr std::memory_order kEntryStore = std::memory_order_release;
inline void seqReadFence() noexcept {}
inline void seqWriteFence() noexcept {}
#else
inline constexpr std::memory_order kEntryLoad = std::memory_order_relaxed;
inline constexpr std::memory_order kEntryStore = std::memory_order_relaxed;
inline void seqReadFence() noexcept { std::atomic_thread_fence(std::memory_order_acquire); }
inline void seqWriteFence() noexcept { std::atomic_thread_fence(std::memory_order_release); }
#endif

// An entry as a leaf stores it: written in place by writers while readers may read it, so every
// field is atomic (relaxed, ordered by the leaf's sequence; see Leaf).
template <typename Node>
struct LeafEntry {
  std::atomic<std::uintptr_t> start{0};
  std::atomic<std::uintptr_t> word{0};
  IndexEntry<Node> load() const noexcept {
    return IndexEntry<Node>{start.load(kEntryLoad), word.load(kEntryLoad)};
  }
  void store(const IndexEntry<Node>& e) noexcept {
    start.store(e.start, kEntryStore);
    word.store(e.word, kEntryStore);
  }
};

// A sorted array of at most capacity() entries, edited in place under a sequence lock: the writer
// (one at a time: the cache's writer lock) makes `seq` odd, moves and writes entries and `shape`,
// and makes `seq` even again; a reader reads `seq` (acquire), then the shape and the entries it
// needs (relaxed), an acquire fence, and `seq` again, and uses what it read only when both reads
// of `seq` are the same even value. It never follows a pointer it read before that check. A leaf is
// copied only when it outgrows its block, splits or merges; the old one is then retired.
//
// The entries lie anywhere in the block: entry k is slot first + k (`shape` holds first and the
// count), so that an edit moves the entries on the shorter side of it (a removal at the front,
// what evicting the least recently used of sequentially released regions does, moves none).
template <typename Node>
struct Leaf : Retired {
  using Entry = IndexEntry<Node>;
  using Slot = LeafEntry<Node>;
  std::atomic<std::uint32_t> seq{0};    // odd while a writer edits the leaf
  std::atomic<std::uint32_t> shape{0};  // first slot (low 16 bits), entries (high 16 bits)

  static constexpr std::uint32_t makeShape(std::size_t first, std::size_t n) noexcept {
    return static_cast<std::uint32_t>(first | (n << 16));
  }
  static std::size_t shapeFirst(std::uint32_t v) noexcept { return v & 0xffff; }
  static std::size_t shapeCount(std::uint32_t v) noexcept { return v >> 16; }

  // Writers (and readers' unvalidated guesses: the cache's tests of structure).
  std::size_t count() const noexcept { return shapeCount(shape.load(std::memory_order_relaxed)); }
  std::size_t first() const noexcept { return shapeFirst(shape.load(std::memory_order_relaxed)); }
  // Entries the block holds (the shared empty leaf has none and is never edited).
  std::size_t capacity() const noexcept {
    return bytes < kLeafHeaderBytes ? 0 : (bytes - kLeafHeaderBytes) / kEntryBytes;
  }
  Entry entry(std::size_t k) const noexcept { return slots()[first() + k].load(); }
  std::uintptr_t startAt(std::size_t k) const noexcept {
    return slots()[first() + k].start.load(kEntryLoad);
  }

  // A leaf of n <= kLeafMax entries (to be set by the caller), in the smallest block that fits.
  static Leaf* allocate(std::size_t n) noexcept {
    static_assert(sizeof(Leaf) == kLeafHeaderBytes && sizeof(Slot) == kEntryBytes);
    const std::size_t c = n == 0 ? 0 : (n - 1) / kLeafClassEntries;
    void* p = leafPoolCall(c, [](auto& pool) { return pool.allocate(); });
    if (p == nullptr) return nullptr;
    auto* l = new (p) Leaf;
    l->kind = kRetiredLeaf;
    l->bytes = static_cast<std::uint32_t>(leafBlockBytes(c));
    Slot* s = l->slots();
    for (std::size_t k = 0; k < l->capacity(); ++k) new (&s[k]) Slot;
    l->shape.store(makeShape(0, n), std::memory_order_relaxed);
    return l;
  }
  static void release(Leaf* l) noexcept {
    const std::size_t c = (l->bytes - kLeafHeaderBytes) / (kLeafClassEntries * kEntryBytes) - 1;
    l->~Leaf();
    leafPoolCall(c, [l](auto& pool) { pool.release(l); });
  }
  // Number of entries among the first n whose start <= addr (the last of them is the floor entry).
  std::size_t upper(std::uintptr_t addr, std::size_t n) const noexcept {
    const Slot* b = slots() + first();
    return countAtOrBelow(n, addr, [b](std::size_t k) { return b[k].start.load(kEntryLoad); });
  }
  std::size_t upper(std::uintptr_t addr) const noexcept { return upper(addr, count()); }
  // Number of entries whose start < addr.
  std::size_t lower(std::uintptr_t addr) const noexcept {
    return addr == 0 ? 0 : upper(addr - 1, count());
  }

  // Readers: copies the entry with the greatest start <= addr into *out (region null when every
  // entry starts above addr) and sets *pos to the number of entries starting at or below addr.
  // *pos comes in as a guess (the reader's last position): taken when the entries on either side
  // of it show it is the answer, else the leaf is searched. False when the read overlapped a
  // writer's edit: nothing read counts.
  // Inlined into the hit (see Top::readFloor()).
  __attribute__((always_inline)) bool readFloor(std::uintptr_t addr, Entry* out,
                                                std::size_t* pos) const noexcept {
    const std::uint32_t s0 = seq.load(std::memory_order_acquire);
    // One load of the shape: a torn one is still a shape the writer stored, and it never stores
    // one reaching past capacity(), so every slot below is in the block whatever was read.
    const std::uint32_t sh = shape.load(kEntryLoad);
    const Slot* b = slots() + shapeFirst(sh);
    const std::size_t n = shapeCount(sh);
    auto startOf = [b](std::size_t k) { return b[k].start.load(kEntryLoad); };
    std::size_t k = *pos;
    // The position answers when the entries on either side of it start at or below and above
    // addr (written out here: through a shared helper the hit measured 1-2 ns slower).
    if (!(k <= n && (k == 0 || startOf(k - 1) <= addr) && (k == n || startOf(k) > addr))) {
      k = countAtOrBelow(n, addr, startOf);
    }
    const Entry e = k != 0 ? b[k - 1].load() : Entry{0, 0};
    seqReadFence();
    if (__builtin_expect((s0 & 1) != 0 || seq.load(std::memory_order_relaxed) != s0, 0)) {
      return false;
    }
    *out = e;
    *pos = k;
    return true;
  }

  // Writers: an edit in place is bracketed by beginEdit() and endEdit(). Within one, entry() and
  // startAt() index from the first slot as it is when they are called (setShape() moves it).
  void beginEdit() noexcept {
    seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    seqWriteFence();
  }
  void endEdit() noexcept {
    seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  void setSlot(std::size_t slot, const Entry& e) noexcept { slots()[slot].store(e); }
  Entry slotEntry(std::size_t slot) const noexcept { return slots()[slot].load(); }
  // first + n <= capacity().
  void setShape(std::size_t first, std::size_t n) noexcept {
    shape.store(makeShape(first, n), kEntryStore);
  }

 private:
  Slot* slots() noexcept { return reinterpret_cast<Slot*>(this + 1); }
  const Slot* slots() const noexcept { return reinterpret_cast<const Slot*>(this + 1); }
};

// A position in the index: leaf `leaf` of the top, `pos` of its entries starting at or below the
// address looked for. Readers keep their last one (Top::floor()); writers check a suggested one
// before using it (Index::suggest()). Only ever a guess: any value is safe.
struct ReadPos {
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::uint32_t leaf;
  std::uint32_t pos;
  static ReadPos unpack(std::uint64_t v) noexcept {
    return ReadPos{static_cast<std::uint32_t>(v >> 32), static_cast<std::uint32_t>(v)};
  }
  std::uint64_t pack() const noexcept { return (std::uint64_t{leaf} << 32) | pos; }
};

template <typename Node>
struct TopSlot {
  std::uintptr_t key;
  // Replaced by writers (release); readers load it with acquire. A plain pointer accessed through
  // std::atomic_ref, so that a writer may copy a Top's slots with memcpy (only the writer ever
  // stores into them; readers only load).
  Leaf<Node>* leaf_;
  Leaf<Node>* loadLeaf() const noexcept {
    return std::atomic_ref<Leaf<Node>*>(const_cast<Leaf<Node>*&>(leaf_))
        .load(std::memory_order_acquire);
  }
  void storeLeaf(Leaf<Node>* l) noexcept {
    std::atomic_ref<Leaf<Node>*>(leaf_).store(l, std::memory_order_release);
  }
};
static_assert(std::is_trivially_copyable_v<TopSlot<int>>);

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
    // The slots are the caller's to fill, every one of them.
    return t;
  }
  static void release(Top* t) noexcept {
    t->~Top();
    ::operator delete(t);
  }
  Leaf<Node>* leaf(std::size_t i) const noexcept { return slots()[i].loadLeaf(); }
  // Whether leaf i's key range holds addr (any i: a remembered position).
  bool holds(std::size_t i, std::uintptr_t addr) const noexcept {
    const Slot* s = slots();
    return i < size && s[i].key <= addr && (i + 1 == size || s[i + 1].key > addr);
  }
  // The leaf whose key range holds addr (key 0 is 0): branch-free, prefetching (writers).
  std::size_t leafForW(std::uintptr_t addr) const noexcept {
    const Slot* s = slots();
    return countAtOrBelowNoBranch(size, addr, [s](std::size_t i) { return &s[i].key; }) - 1;
  }
  // The same for a reader whose position did not answer: most often a new address (a miss),
  // out of line.
  __attribute__((noinline)) std::size_t leafForCold(std::uintptr_t addr) const noexcept {
    const std::size_t i = leafForW(addr);
    // The search of the leaf will jump over its lines, each a miss in a big cache: fetch them
    // all at once (a miss among 100,000 regions 207 -> 196 ns). A prefetch never faults.
    const Leaf<Node>* l = leaf(i);
    const auto* p = reinterpret_cast<const char*>(l);
    for (std::size_t b = 64; b < l->bytes; b += 64) __builtin_prefetch(p + b);
    return i;
  }
  // Readers (inside an epoch): copies the entry with the greatest start <= addr into *out (word 0
  // when there is none). False when writers kept editing the leaf through kReadTries reads: the
  // caller asks again under the writer lock. The region the copy names is live for the reader's
  // epoch.
  //
  // *pos is the reader's position: where its last lookup ended (a ReadPos; any value is safe).
  // A lookup first checks whether it answers this one (the leaf's key range holds addr, the
  // entries on either side of the position start at or below and above addr), and searches only
  // when it does not; it leaves the position it found in *pos, also when it returns false (then
  // only the leaf is known). A thread that hits the same buffers again and again (the common
  // case: MPI's and NCCL's buffers are reused) then skips both binary searches; writers check
  // the position the same way before they use it (Index::suggest()).
  __attribute__((always_inline)) bool floor(std::uintptr_t addr, Entry* out,
                                            std::uint64_t* pos) const noexcept {
    ReadPos p = ReadPos::unpack(*pos);
    std::size_t i = p.leaf;
    if (__builtin_expect(!holds(i, addr), 0)) i = leafForCold(addr);
    std::size_t k = p.leaf == i ? p.pos : kLeafMax + 1;
    const bool ok = readFloor(leaf(i), addr, out, &k);
    *pos = ReadPos{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(ok ? k : 0)}.pack();
    if (!ok) return false;
    if (__builtin_expect(out->word != 0, 1) || i == 0) return true;
    const Last last = lastOf(i - 1);  // by value: the caller's entry stays in registers
    *out = last.entry;
    return last.ok;
  }
  bool floor(std::uintptr_t addr, Entry* out) const noexcept {
    std::uint64_t pos = ReadPos::kNone;
    return floor(addr, out, &pos);
  }

 private:
  static constexpr int kReadTries = 64;
  // Every entry of leaf i + 1 starts above the address: the last entry of leaf i (never empty when
  // there is more than one leaf). Out of line: the hit's entry stays in registers.
  struct Last {
    Entry entry;
    bool ok;
  };
  __attribute__((noinline)) Last lastOf(std::size_t i) const noexcept {
    Last last{{0, 0}, false};
    std::size_t k = kLeafMax + 1;
    last.ok = readFloor(leaf(i), UINTPTR_MAX, &last.entry, &k);
    return last;
  }
  // Inlined into the hit, as Leaf::readFloor(): left to the compiler (two callers, the hit and a
  // bare miss's look), one of them was kept out of line, a call and return on every hit.
  __attribute__((always_inline)) static bool readFloor(const Leaf<Node>* l, std::uintptr_t addr,
                                                       Entry* out, std::size_t* pos) noexcept {
    for (int t = 0; t < kReadTries; ++t) {
      if (__builtin_expect(l->readFloor(addr, out, pos), 1)) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    return false;
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
    r->setNextUnindex(unindex_);
    unindex_ = r;
  }
  bool dirty() const noexcept { return unindex_ != nullptr; }
  // Writers: makes `pos` (a ReadPos a reader found, perhaps in an older top) the first position
  // the next search checks; it is used only if it answers that search exactly.
  void suggest(std::uint64_t pos) const noexcept {
    const ReadPos p = ReadPos::unpack(pos);
    if (p.leaf <= 0xffffff && p.pos <= kLeafMax) remember(p.leaf, p.pos);
  }
  // How many insert() calls there were, twice: entries enter the index only through insert(), so
  // while it stands still no new entry can overlap a range where a walk found none. Odd while an
  // insertion is under way. Readers may load it without the lock (acquire): an even count they
  // read was stored after its insertion's entry was in its leaf, so a lookup after the load sees
  // that entry (CacheImpl::getSlow()'s look without the lock).
  std::uint64_t insertions() const noexcept { return insertions_.load(std::memory_order_acquire); }
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
    hint_ = 0;
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
  bool rewriteLeaf(std::size_t i, Node* add, Node* drop, std::size_t* removed = nullptr) noexcept;

  // Writers' searches start from where the last ones ended: a miss looks for one address up to
  // five times (the walk under the lock, the insertion, the invalidation's walk, and the next
  // miss's purge of it). hint_ remembers two positions, each a leaf index (24 bits) and the
  // number of that leaf's entries whose start is at or below the address looked for (8 bits).
  // A position is used only after checking that it answers the search exactly (the leaf's key
  // range holds the address; the entries on either side of it start at or below and above it),
  // so a stale one (the top or the leaf changed since) only costs the check.
  static constexpr unsigned kHintPosBits = 8;
  static_assert(kLeafMax < (1u << kHintPosBits));
  static std::uint32_t hintLeaf(std::uint32_t h) noexcept { return h >> kHintPosBits; }
  static std::uint32_t hintPos(std::uint32_t h) noexcept { return h & ((1u << kHintPosBits) - 1); }
  std::uint32_t hint(int n) const noexcept { return static_cast<std::uint32_t>(hint_ >> (32 * n)); }
  // The leaf whose key range holds addr.
  std::size_t leafAt(std::uintptr_t addr) const noexcept {
    const TopT* top = current();
    for (int n = 0; n < 2; ++n) {
      const std::size_t i = hintLeaf(hint(n));
      if (top->holds(i, addr)) return i;
    }
    return top->leafForW(addr);
  }
  // Leaf i's (l) Leaf::upper(addr, n).
  std::size_t upperIn(std::size_t i, const LeafT* l, std::uintptr_t addr,
                      std::size_t n) const noexcept {
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t v = hint(h);
      const std::size_t k = hintPos(v);
      if (hintLeaf(v) == (i & 0xffffff) && k <= n && (k == 0 || l->startAt(k - 1) <= addr) &&
          (k == n || l->startAt(k) > addr)) {
        return k;
      }
    }
    return l->upper(addr, n);
  }
  // Makes (i, k) the most recent position.
  void remember(std::size_t i, std::size_t k) const noexcept {
    const auto v = static_cast<std::uint32_t>((i << kHintPosBits) | k);
    if (v != hint(0)) hint_ = (hint_ << 32) | v;
  }
  static Node* reverse(Node* list) noexcept;
  static Node* sortDescending(Node* list) noexcept;

  // The empty index: one empty leaf. Shared by every index of this Node type, never written to
  // nor freed: a writer that finds it current publishes a new Top instead of replacing its leaf.
  struct EmptyIndex {
    TopT top;
    TopSlot<Node> slot;
    constexpr explicit EmptyIndex(LeafT* l) : slot{0, l} {
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
  Node* unindex_ = nullptr;         // queued for purge: invalid, entry still in a leaf
  mutable std::uint64_t hint_ = 0;  // writers' last two positions, the latest in the low half
  Reclaimer* reclaimer_;
  std::atomic<std::uint64_t> insertions_{0};  // writers store, readers may load (insertions())
};

}  // namespace gmd::rcache::detail

#include "rcache/index_inl.h"
