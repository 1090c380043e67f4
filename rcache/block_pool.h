// Fixed-size blocks carved from 64 KiB chunks (internal to rcache/): the cache's regions. A miss
// then allocates without malloc's per-block header and without the aligned-allocation path
// (memalign splits and consolidates chunks: about a fifth of a miss), and a region costs exactly
// its size.
//
// Blocks are handed back to the pool, never to malloc; chunks are freed with the pool. Under
// AddressSanitizer every block is its own heap allocation, so a use after free is still reported.
//
// Thread safety: allocate() and release() from any thread (a spin lock held for a few
// instructions, under which nothing else is locked; never taken by invalidate(), which neither
// allocates nor frees). The fork members as their comments say.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstddef>
#include <new>

namespace gmd::rcache::detail {

template <std::size_t kBlock, std::size_t kAlign>
class BlockPool {
  static_assert(kBlock >= sizeof(void*) && kBlock % kAlign == 0);

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
      ::operator delete (static_cast<void*>(chunks_), std::align_val_t{kAlign});
      chunks_ = next;
    }
  }

  // kBlock bytes aligned to kAlign, or null when out of memory.
  void* allocate() noexcept {
#if defined(__SANITIZE_ADDRESS__)
    return ::operator new (kBlock, std::align_val_t{kAlign}, std::nothrow);
#else
    Guard g(lock_);
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
    Guard g(lock_);
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
    Guard g(lock_);
    c.tail_->next = free_;
    free_ = c.head_;
    c.head_ = c.tail_ = nullptr;
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
  // The first block of each chunk links the chunks.
  struct Chunk {
    Chunk* next;
  };
  static constexpr std::size_t kChunkBytes = std::size_t{64} << 10;
  static constexpr std::size_t kPerChunk = kChunkBytes / kBlock;
  static_assert(kPerChunk >= 2);

  struct Guard {
    explicit Guard(std::atomic_flag& f) noexcept : f_(f) {
      while (f_.test_and_set(std::memory_order_acquire)) {
        while (f_.test(std::memory_order_relaxed)) _mm_pause();
      }
    }
    ~Guard() { f_.clear(std::memory_order_release); }
    std::atomic_flag& f_;
  };

  bool grow() noexcept {
    void* p = ::operator new (kChunkBytes, std::align_val_t{kAlign}, std::nothrow);
    if (p == nullptr) return false;
    auto* c = static_cast<Chunk*>(p);
    c->next = chunks_;
    chunks_ = c;
    auto* base = static_cast<unsigned char*>(p);
    for (std::size_t i = kPerChunk - 1; i >= 1; --i) {
      auto* b = reinterpret_cast<Free*>(base + i * kBlock);
      b->next = free_;
      free_ = b;
    }
    return true;
  }

  std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  Free* free_ = nullptr;
  Chunk* chunks_ = nullptr;
};

}  // namespace gmd::rcache::detail
