// Fixed-size blocks carved from chunks (internal to rcache/): the cache's regions and the index's
// leaves. A miss then allocates without malloc's per-block header and without the
// aligned-allocation path (memalign splits and consolidates chunks: about a fifth of a miss), and a
// block costs exactly its size.
//
// BlockPool (the leaves): blocks carved from 64 KiB chunks aligned to kAlign, linked through the
// room past their last block (or their first block where there is none).
//
// LinePool (the regions): blocks of one cache line (kBlock: 64 bytes) that each have a
// 32-bit id, so that what refers to a block from outside it (a list link, the eviction order) takes
// 4 bytes instead of a pointer's 8. The blocks lie in 4 KiB spans aligned to 4 KiB: a 64-byte head
// (malloc's header where the span is the first of a slab, the span's number, the slab link), then
// 4032 bytes of blocks (63 lines of 64 bytes). The spans are carved from malloc'd slabs that grow
// from 4 to 64 spans; a slab that malloc maps lies exactly on its spans (its header in the first
// span's head), so the spans cost their size (a 4 KiB-aligned malloc per span would leave a free
// gap beside each one). A block's id is its span's number times 64 plus its index in the span
// (never 0: index 0 is the head), found from its address by arithmetic and one load of the span's
// head (idOf()); the id's block is one load from the process-wide table of span numbers
// (SpanTable) away (at()).
//
// Blocks are handed back to the pool, never to malloc; chunks and slabs are freed with the pool.
// Under AddressSanitizer every block is its own heap allocation (a LinePool block with its number
// right after it, and a span number of its own), so a use after free is still reported.
//
// Thread safety: BlockPool::allocate() and release() from any thread (a spin lock held for a few
// instructions, under which nothing else is locked; never taken by invalidate(), which neither
// allocates nor frees). LinePool::allocate() and release() by one thread at a time: its owner's
// lock guards it (a cache's region pool: the cache's writer lock, under which the miss that
// allocates a region and the pass that frees regions run anyway; a lock of its own was two more
// atomic read-modify-writes a miss), and a LinePool growing takes SpanTable's lock under it.
// LinePool::idOf() and at() from any thread for a block the caller may use (an id it learnt after
// the block was allocated). The fork members as their comments say.
#pragma once

#include <immintrin.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace gmd::rcache::detail {

// A test-and-test-and-set spin lock held for the scope.
struct SpinGuard {
  explicit SpinGuard(std::atomic_flag& f) noexcept : f_(f) {
    while (f_.test_and_set(std::memory_order_acquire)) {
      while (f_.test(std::memory_order_relaxed)) _mm_pause();
    }
  }
  ~SpinGuard() { f_.clear(std::memory_order_release); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;
  std::atomic_flag& f_;
};

// The free blocks of a pool, linked through their first word. Not locked: its owner guards it
// (LinePool's owner: the cache's writer lock; LockedFreeList: its spin lock).
class FreeList {
 public:
  struct Link {
    Link* next;
  };
  // A block; when there is none, grow() (it adds blocks with add()) first. Null when that fails.
  template <typename Grow>
  void* pop(Grow grow) noexcept {
    if (head_ == nullptr && !grow()) return nullptr;
    Link* b = head_;
    head_ = b->next;
    return b;
  }
  void add(void* p) noexcept {
    auto* b = static_cast<Link*>(p);
    b->next = head_;
    head_ = b;
  }
  // Fork child: forget every block.
  void abandon() noexcept { head_ = nullptr; }

 private:
  Link* head_ = nullptr;
};

// A FreeList and the spin lock that guards it (the process-wide leaf pools, BlockPool).
class LockedFreeList {
 public:
  // A block; when there is none, grow() (called under the lock; it adds blocks with add()) first.
  // Null when that fails.
  template <typename Grow>
  void* pop(Grow grow) noexcept {
    SpinGuard g(lock_);
    return list_.pop(grow);
  }
  void push(void* p) noexcept {
    SpinGuard g(lock_);
    list_.add(p);
  }
  // Under the lock (grow()).
  void add(void* p) noexcept { list_.add(p); }

  // fork(): the parent's prepare handler takes the lock (after the caches' writer locks; nothing
  // takes them in the other order) so that no block list is mid-update in the child; parent and
  // child release it.
  void lockForFork() noexcept {
    while (lock_.test_and_set(std::memory_order_acquire)) _mm_pause();
  }
  void unlockAfterFork() noexcept { lock_.clear(std::memory_order_release); }
  // Fork child: forget every block; the lock may have been held by a thread that is gone.
  void abandon() noexcept {
    list_.abandon();
    lock_.clear(std::memory_order_relaxed);
  }

 private:
  std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  FreeList list_;
};

template <std::size_t kBlock, std::size_t kAlign>
class BlockPool {
  static_assert(kBlock >= sizeof(void*) && kBlock % kAlign == 0);

 public:
  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() {
    while (chunks_ != nullptr) {
      Chunk* next = chunks_->next;
      ::operator delete (static_cast<void*>(reinterpret_cast<unsigned char*>(chunks_) - kLinkAt),
                         std::align_val_t{kAlign});
      chunks_ = next;
    }
  }

  // kBlock bytes aligned to kAlign, or null when out of memory.
  void* allocate() noexcept {
#if defined(__SANITIZE_ADDRESS__)
    return ::operator new (kBlock, std::align_val_t{kAlign}, std::nothrow);
#else
    return free_.pop([this] { return grow(); });
#endif
  }
  void release(void* p) noexcept {
#if defined(__SANITIZE_ADDRESS__)
    ::operator delete (p, std::align_val_t{kAlign});
#else
    free_.push(p);
#endif
  }

  // fork(): see LockedFreeList.
  void lockForFork() noexcept { free_.lockForFork(); }
  void unlockAfterFork() noexcept { free_.unlockAfterFork(); }

 private:
  struct Chunk {
    Chunk* next;
  };
  static constexpr std::size_t kChunkBytes = std::size_t{64} << 10;
  static constexpr std::size_t kPerChunk = kChunkBytes / kBlock;
  static_assert(kPerChunk >= 2 && kBlock >= sizeof(Chunk));
  // The chunk's link lies past its last block where the blocks leave room for it (every leaf
  // class does), else in its first block.
  static constexpr std::size_t kTailAt =
      (kPerChunk * kBlock + alignof(Chunk) - 1) / alignof(Chunk) * alignof(Chunk);
  static constexpr bool kLinkInTail = kTailAt + sizeof(Chunk) <= kChunkBytes;
  static constexpr std::size_t kLinkAt = kLinkInTail ? kTailAt : 0;

  // Out of line: allocate() stays small enough to inline into a miss.
  __attribute__((noinline)) bool grow() noexcept {
    void* p = ::operator new (kChunkBytes, std::align_val_t{kAlign}, std::nothrow);
    if (p == nullptr) return false;
    auto* base = static_cast<unsigned char*>(p);
    auto* c = reinterpret_cast<Chunk*>(base + kLinkAt);
    c->next = chunks_;
    chunks_ = c;
    for (std::size_t i = kPerChunk; i-- > (kLinkInTail ? 0 : 1);) free_.add(base + i * kBlock);
    return true;
  }

  LockedFreeList free_;
  Chunk* chunks_ = nullptr;
};

// The process's span numbers: number n (1 and up; 0 is never given) names the address of a
// LinePool span (or, under AddressSanitizer, of one block less 64 bytes). Numbers of spans that
// were freed are given again; the parent's spans that a fork child abandons keep theirs. The table
// grows by doubling; an old table is never freed (at most as much as the last one), so that a
// reader that loaded it may go on reading it (only entries that name its own live spans).
// Static storage, never destroyed (pools may be destroyed after main()).
//
// Thread safety: add() and remove() from any thread (its spin lock, taken under a cache's writer
// lock and last by the fork handlers); at() from any thread for a number it learnt after add()
// returned it.
class SpanTable {
 public:
  static constexpr std::uint32_t kMaxNumbers = std::uint32_t{1} << 26;  // ids: number * 64 + index

  static std::uintptr_t at(std::uint32_t n) noexcept {
    return table_.load(std::memory_order_acquire)[n];
  }
  // A number for `span` (4 KiB-aligned, or a block's address less 64), 0 when none is left or on
  // no memory.
  static std::uint32_t add(std::uintptr_t span) noexcept {
    SpinGuard g(lock_);
    std::uintptr_t* t = table_.load(std::memory_order_relaxed);
    if (free_ != 0) {
      const std::uint32_t n = free_;
      free_ = static_cast<std::uint32_t>(t[n] >> 1);
      t[n] = span;
      return n;
    }
    if (size_ >= cap_) {
      if (cap_ >= kMaxNumbers) return 0;
      const std::uint32_t cap = cap_ == 0 ? 256 : cap_ * 2;
      auto* grown = static_cast<std::uintptr_t*>(std::malloc(cap * sizeof(std::uintptr_t)));
      if (grown == nullptr) return 0;
      if (t != nullptr) std::copy(t + 1, t + size_, grown + 1);
      grown[0] = reinterpret_cast<std::uintptr_t>(t);  // entry 0 keeps the old table (leaked)
      table_.store(grown, std::memory_order_release);
      t = grown;
      cap_ = cap;
    }
    t[size_] = span;
    return size_++;
  }
  static void remove(std::uint32_t n) noexcept {
    SpinGuard g(lock_);
    // A free entry holds the next free number, shifted past the low bit (odd: never an address).
    table_.load(std::memory_order_relaxed)[n] = (std::uintptr_t{free_} << 1) | 1;
    free_ = n;
  }
  static void lockForFork() noexcept {
    while (lock_.test_and_set(std::memory_order_acquire)) _mm_pause();
  }
  static void unlockAfterFork() noexcept { lock_.clear(std::memory_order_release); }

 private:
  static constinit inline std::atomic<std::uintptr_t*> table_{nullptr};
  static constinit inline std::uint32_t size_ = 1;  // numbers [1, size_) were given
  static constinit inline std::uint32_t cap_ = 0;
  static constinit inline std::uint32_t free_ = 0;  // a free number, 0 when none
  static constinit inline std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
};

template <std::size_t kBlock>
class LinePool {
 public:
  static constexpr std::size_t kSpanBytes = 4096;
  static constexpr std::size_t kHeadBytes = 64;  // malloc's header (16), the span's head
  static constexpr std::size_t kPerSpan = (kSpanBytes - kHeadBytes) / kBlock;
  static constexpr std::size_t kIndexBits = 6;  // ids: number << kIndexBits | index in the span
  static constexpr std::size_t kMaxSlabSpans = 64;
  static_assert(kBlock == kHeadBytes, "the span's head is one block's room");

  LinePool() = default;
  LinePool(const LinePool&) = delete;
  LinePool& operator=(const LinePool&) = delete;
  ~LinePool() {
    while (slabs_ != nullptr) {
      Head* h = slabs_;
      slabs_ = h->next_slab;
      for (std::uint32_t j = 0; j < h->slab_spans; ++j) {
        SpanTable::remove(
            reinterpret_cast<Head*>(reinterpret_cast<std::uintptr_t>(h) + j * kSpanBytes)->number);
      }
      std::free(h->mem);
    }
  }

  // kBlock bytes aligned to kBlock, or null when out of memory (or of ids).
  void* allocate() noexcept {
#if defined(__SANITIZE_ADDRESS__)
    void* p =
        ::operator new (kBlock + sizeof(std::uint32_t), std::align_val_t{kBlock}, std::nothrow);
    if (p == nullptr) return nullptr;
    const std::uint32_t n = SpanTable::add(reinterpret_cast<std::uintptr_t>(p) - kHeadBytes);
    if (n == 0) {
      ::operator delete (p, std::align_val_t{kBlock});
      return nullptr;
    }
    *reinterpret_cast<std::uint32_t*>(static_cast<unsigned char*>(p) + kBlock) = n;
    return p;
#else
    return free_.pop([this] { return grow(); });
#endif
  }
  void release(void* p) noexcept {
#if defined(__SANITIZE_ADDRESS__)
    SpanTable::remove(idOf(p) >> kIndexBits);
    ::operator delete (p, std::align_val_t{kBlock});
#else
    free_.add(p);
#endif
  }
  // The id of block b (never 0), and the block of id `id` (null for 0).
  static std::uint32_t idOf(const void* b) noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(b);
#if defined(__SANITIZE_ADDRESS__)
    const std::uint32_t n = *reinterpret_cast<const std::uint32_t*>(a + kBlock);
    return (n << kIndexBits) | (kHeadBytes / kBlock);
#else
    const std::uintptr_t span = a & ~(kSpanBytes - 1);
    return (reinterpret_cast<const Head*>(span)->number << kIndexBits) |
           static_cast<std::uint32_t>((a - span) / kBlock);
#endif
  }
  static void* at(std::uint32_t id) noexcept {
    if (id == 0) return nullptr;
    return reinterpret_cast<void*>(SpanTable::at(id >> kIndexBits) +
                                   (id & ((1u << kIndexBits) - 1)) * kBlock);
  }

  // Fork child: forget every slab (they hold the parent's regions, which the child never frees)
  // without reading or freeing them (their span numbers stay taken).
  void abandon() noexcept {
    slabs_ = nullptr;
    free_.abandon();
  }

 private:
  // The first kHeadBytes of a span; malloc's header lies in the first 16 bytes of a slab's first
  // span. The slab fields are set in the first span of each slab only.
  struct Head {
    unsigned char malloc_header[2 * sizeof(void*)];
    std::uint32_t number;      // the span's number (SpanTable)
    std::uint32_t slab_spans;  // spans in this slab
    Head* next_slab;
    void* mem;  // what malloc returned
  };
  static_assert(sizeof(Head) <= kHeadBytes);
  static constexpr std::size_t kMinSlabSpans = 4;

  // A slab of slab_spans_ spans, each numbered: its blocks go to the free list, lowest address
  // first. Out of line: allocate() stays small enough to inline into a miss.
  __attribute__((noinline)) bool grow() noexcept {
    // Asked so that a slab malloc maps (past its mmap threshold) takes exactly slab_spans_ pages.
    const std::size_t bytes = slab_spans_ * kSpanBytes - 3 * sizeof(void*);
    void* p = std::malloc(bytes);
    if (p == nullptr) return false;
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t end = start + malloc_usable_size(p);
    // The first span whose head's own fields (past malloc's header) start at or after p.
    const std::uintptr_t first = (start - 2 * sizeof(void*) + kSpanBytes - 1) & ~(kSpanBytes - 1);
    const std::size_t spans = end >= first + kSpanBytes ? (end - first) / kSpanBytes : 0;
    if (spans == 0) {
      std::free(p);
      return false;
    }
    std::size_t numbered = 0;
    for (; numbered < spans; ++numbered) {
      auto* h = reinterpret_cast<Head*>(first + numbered * kSpanBytes);
      h->number = SpanTable::add(reinterpret_cast<std::uintptr_t>(h));
      if (h->number == 0) break;
    }
    if (numbered < spans) {
      for (std::size_t j = 0; j < numbered; ++j) {
        SpanTable::remove(reinterpret_cast<Head*>(first + j * kSpanBytes)->number);
      }
      std::free(p);
      return false;
    }
    auto* h = reinterpret_cast<Head*>(first);
    h->slab_spans = static_cast<std::uint32_t>(spans);
    h->next_slab = slabs_;
    h->mem = p;
    slabs_ = h;
    for (std::size_t j = spans; j-- > 0;) {
      const std::uintptr_t span = first + j * kSpanBytes;
      for (std::size_t i = kPerSpan; i-- > 0;) {
        free_.add(reinterpret_cast<void*>(span + kHeadBytes + i * kBlock));
      }
    }
    slab_spans_ = std::min(slab_spans_ * 2, kMaxSlabSpans);
    return true;
  }

  FreeList free_;
  Head* slabs_ = nullptr;
  std::size_t slab_spans_ = kMinSlabSpans;
};

}  // namespace gmd::rcache::detail
