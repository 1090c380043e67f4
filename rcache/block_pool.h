// Fixed-size blocks carved from chunks (internal to rcache/): the cache's regions and the index's
// leaves. A miss then allocates without malloc's per-block header and without the
// aligned-allocation path (memalign splits and consolidates chunks: about a fifth of a miss), and a
// block costs exactly its size.
//
// A pool may give each block a companion record of kPair bytes, found from the block's address by
// arithmetic and back (companion(), blockOf()): what its owner touches rarely, kept off the block's
// cache line without a pointer to it. Such a pool lays blocks out in 4 KiB spans aligned to 4 KiB:
// kLeadBytes left to malloc's header, kPerSpan kPair-byte records, then their kPerSpan blocks
// (in the same order) up to the span's end (for 64-byte blocks and 16-byte records: 51 of each,
// nothing else spare). The spans are carved from malloc'd slabs that grow from 4 to 64 spans; a
// slab that malloc maps lies exactly on its spans (its header in the first span's lead), so the
// spans cost their size (a 4 KiB-aligned malloc per span would leave a free gap beside each one).
// The first block of each slab links the slabs. Without companions, blocks are carved from 64 KiB
// chunks aligned to kAlign, linked through the room past their last block (or their first block
// where there is none: every leaf class has room).
//
// Blocks are handed back to the pool, never to malloc; chunks and slabs are freed with the pool.
// Under AddressSanitizer every block (and its companion, right after it) is its own heap
// allocation, so a use after free is still reported.
//
// Thread safety: allocate() and release() from any thread (a spin lock held for a few
// instructions, under which nothing else is locked; never taken by invalidate(), which neither
// allocates nor frees); companion() and blockOf() from any thread for a block the caller may use.
// The fork members as their comments say.
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

template <std::size_t kBlock, std::size_t kAlign, std::size_t kPair = 0>
class BlockPool {
  static_assert(kBlock >= sizeof(void*) && kBlock % kAlign == 0);
  static_assert(kPair == 0 || ((kBlock & (kBlock - 1)) == 0 && kBlock == kAlign &&
                               kPair % alignof(void*) == 0),
                "companions need power-of-two blocks aligned to their size");

 private:
  struct Free {
    Free* next;
  };

 public:
  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() {
    while (chunks_ != nullptr) {
      Chunk* next = chunks_->next;
      if constexpr (kPair == 0) {
        ::operator delete (chunks_->mem, std::align_val_t{kAlign});
      } else {
        std::free(chunks_->mem);
      }
      chunks_ = next;
    }
  }

  // kBlock bytes aligned to kAlign (and its companion of kPair bytes), or null when out of memory.
  void* allocate() noexcept {
#if defined(__SANITIZE_ADDRESS__)
    return ::operator new (kBlock + kPair, std::align_val_t{kAlign}, std::nothrow);
#else
    SpinGuard g(lock_);
    if (free_ == nullptr && !grow()) return nullptr;
    Free* b = free_;
    free_ = b->next;
    return b;
#endif
  }
  void release(void* p) noexcept {
#if defined(__SANITIZE_ADDRESS__)
    ::operator delete (p, std::align_val_t{kAlign});
#else
    SpinGuard g(lock_);
    auto* b = static_cast<Free*>(p);
    b->next = free_;
    free_ = b;
#endif
  }
  // Blocks gathered to be released under one lock acquisition.
  class Chain {
   public:
    void add(void* p) noexcept {
#if defined(__SANITIZE_ADDRESS__)
      ::operator delete (p, std::align_val_t{kAlign});
#else
      auto* b = static_cast<Free*>(p);
      b->next = head_;
      head_ = b;
      if (tail_ == nullptr) tail_ = b;
#endif
    }

   private:
    friend class BlockPool;
    Free* head_ = nullptr;
    Free* tail_ = nullptr;
  };
  void release(Chain& c) noexcept {
    if (c.head_ == nullptr) return;
    SpinGuard g(lock_);
    c.tail_->next = free_;
    free_ = c.head_;
    c.head_ = c.tail_ = nullptr;
  }
  // Pools with companions: the span layout.
  static constexpr std::size_t kSpanBytes = 4096;
  static constexpr std::size_t kLeadBytes = 2 * sizeof(void*);  // malloc's chunk header
  static constexpr std::size_t kPerSpan =
      kPair == 0 ? 0 : (kSpanBytes - kLeadBytes) / (kBlock + kPair);
  static constexpr std::size_t kBlocksAt = kSpanBytes - kPerSpan * kBlock;  // a multiple of kBlock
  static constexpr std::size_t kPairsAt = kBlocksAt - kPerSpan * kPair;     // >= kLeadBytes
  static constexpr std::size_t kMaxSlabSpans = 64;
  // The companion record of block b (pools with companions), and the block of companion c.
  static void* companion(void* b) noexcept {
    static_assert(kPair != 0);
#if defined(__SANITIZE_ADDRESS__)
    return static_cast<unsigned char*>(b) + kBlock;
#else
    const auto a = reinterpret_cast<std::uintptr_t>(b);
    const std::uintptr_t span = a & ~(kSpanBytes - 1);
    return reinterpret_cast<void*>(span + kPairsAt + (a - span - kBlocksAt) / kBlock * kPair);
#endif
  }
  static void* blockOf(void* c) noexcept {
    static_assert(kPair != 0);
#if defined(__SANITIZE_ADDRESS__)
    return static_cast<unsigned char*>(c) - kBlock;
#else
    const auto a = reinterpret_cast<std::uintptr_t>(c);
    const std::uintptr_t span = a & ~(kSpanBytes - 1);
    return reinterpret_cast<void*>(span + kBlocksAt + (a - span - kPairsAt) / kPair * kBlock);
#endif
  }

  // fork(): the parent's forkPrepare() takes the lock (after the cache's writer lock; nothing takes
  // them in the other order) so that no block list is mid-update in the child; parent and child
  // release it.
  void lockForFork() noexcept {
    while (lock_.test_and_set(std::memory_order_acquire)) _mm_pause();
  }
  void unlockAfterFork() noexcept { lock_.clear(std::memory_order_release); }
  // Fork child: forget every chunk (they hold the parent's regions, which the child never frees)
  // without reading or freeing them; the lock may have been held by a thread that is gone.
  void abandon() noexcept {
    chunks_ = nullptr;
    free_ = nullptr;
    lock_.clear(std::memory_order_relaxed);
  }

 private:
  struct Chunk {
    Chunk* next;
    void* mem;  // what malloc returned (slabs)
  };
  static constexpr std::size_t kChunkBytes = std::size_t{64} << 10;
  static constexpr std::size_t kPerChunk = kChunkBytes / kBlock;
  static_assert(kPerChunk >= 2 && kBlock >= sizeof(Chunk));
  // Where a chunk's link lies: past its last block when the blocks leave room for it.
  static constexpr std::size_t kTailAt =
      (kPerChunk * kBlock + alignof(Chunk) - 1) / alignof(Chunk) * alignof(Chunk);
  static constexpr bool kLinkInTail = kTailAt + sizeof(Chunk) <= kChunkBytes;
  static constexpr std::size_t kLinkAt = kLinkInTail ? kTailAt : 0;
  static_assert(kPair == 0 || (kPerSpan >= 2 && kPairsAt >= kLeadBytes && kBlocksAt % kBlock == 0 &&
                               kPair % alignof(void*) == 0));
  static constexpr std::size_t kMinSlabSpans = 4;

  // Out of line: allocate() stays small enough to inline into a miss.
  __attribute__((noinline)) bool grow() noexcept {
    if constexpr (kPair != 0) {
      return growSlab();
    } else {
      void* p = ::operator new (kChunkBytes, std::align_val_t{kAlign}, std::nothrow);
      if (p == nullptr) return false;
      auto* base = static_cast<unsigned char*>(p);
      auto* c = reinterpret_cast<Chunk*>(base + kLinkAt);
      c->next = chunks_;
      c->mem = p;
      chunks_ = c;
      for (std::size_t i = kPerChunk; i-- > (kLinkInTail ? 0 : 1);) push(base + i * kBlock);
      return true;
    }
  }
  // A slab of slab_spans_ spans: its blocks go to the free list, lowest address first.
  bool growSlab() noexcept {
    // Asked so that a slab malloc maps (past its mmap threshold) takes exactly slab_spans_ pages.
    const std::size_t bytes = slab_spans_ * kSpanBytes - 3 * sizeof(void*);
    void* p = std::malloc(bytes);
    if (p == nullptr) return false;
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t end = start + malloc_usable_size(p);
    // The first span whose records start at or after p.
    const std::uintptr_t first = (start - kPairsAt + kSpanBytes - 1) & ~(kSpanBytes - 1);
    const std::size_t spans = end >= first + kSpanBytes ? (end - first) / kSpanBytes : 0;
    if (spans == 0) {
      std::free(p);
      return false;
    }
    auto* c = reinterpret_cast<Chunk*>(first + kBlocksAt);  // the first block
    c->next = chunks_;
    c->mem = p;
    chunks_ = c;
    for (std::size_t j = spans; j-- > 0;) {
      const std::uintptr_t span = first + j * kSpanBytes;
      for (std::size_t i = kPerSpan; i-- > (j == 0 ? 1 : 0);) {
        push(reinterpret_cast<void*>(span + kBlocksAt + i * kBlock));
      }
    }
    slab_spans_ = std::min(slab_spans_ * 2, kMaxSlabSpans);
    return true;
  }
  void push(void* p) noexcept {
    auto* b = static_cast<Free*>(p);
    b->next = free_;
    free_ = b;
  }

  std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  Free* free_ = nullptr;
  Chunk* chunks_ = nullptr;
  std::size_t slab_spans_ = kMinSlabSpans;
};

}  // namespace gmd::rcache::detail
