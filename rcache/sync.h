// Synchronisation building blocks of the registration cache (internal to rcache/).
//
// Everything here is usable from inside a memory hook except where a comment says otherwise: no
// allocation, no blocking wait, no exceptions.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace gmd::rcache::detail {

inline constexpr std::size_t kCacheLine = 64;

// A non-recursive writer lock whose try_lock() may be called by the thread that already holds it
// (it simply fails), which std::mutex does not allow. lock() spins briefly, then sleeps on a futex
// (std::atomic::wait). Thread safety: all members from any thread; try_lock() is hook-safe.
class WriterLock {
 public:
  bool try_lock() noexcept {
    std::uint32_t expected = kFree;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }
  void lock() noexcept {
    if (try_lock()) return;
    lockSlow();
  }
  void unlock() noexcept {
    if (state_.exchange(kFree, std::memory_order_release) == kContended) state_.notify_one();
  }

 private:
  static constexpr std::uint32_t kFree = 0, kLocked = 1, kContended = 2;
  void lockSlow() noexcept {
    for (int i = 0; i < 64; ++i) {
      if (state_.load(std::memory_order_relaxed) == kFree && try_lock()) return;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    while (state_.exchange(kContended, std::memory_order_acquire) != kFree) {
      state_.wait(kContended, std::memory_order_relaxed);
    }
  }
  std::atomic<std::uint32_t> state_{kFree};
};

// Scoped holder of a WriterLock.
class WriterGuard {
 public:
  explicit WriterGuard(WriterLock& l) noexcept : l_(l) { l_.lock(); }
  ~WriterGuard() { l_.unlock(); }
  WriterGuard(const WriterGuard&) = delete;
  WriterGuard& operator=(const WriterGuard&) = delete;

 private:
  WriterLock& l_;
};

// A half-open address range [start, end).
struct Range {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  bool overlaps(std::uintptr_t s, std::uintptr_t e) const noexcept { return start < e && s < end; }
};

// Bounded multi-producer single-consumer queue of ranges, preallocated. push() is lock-free and
// hook-safe (any thread, any time); pop() must be called by one thread at a time (the cache calls
// it under its writer lock). Each cell carries a sequence number: a producer claims a position with
// a CAS on tail_, fills the cell and publishes it by storing position + 1; the consumer takes a
// cell only once published and frees it for the next lap by storing position + capacity.
template <std::size_t kCapacity>
class RangeRing {
  static_assert((kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");

 public:
  RangeRing() noexcept {
    for (std::size_t i = 0; i < kCapacity; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  // False when full (the caller then falls back to a conservative action).
  bool push(Range r) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & (kCapacity - 1)];
      const std::uint64_t seq = c.seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::int64_t>(seq - pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.start.store(r.start, std::memory_order_relaxed);
          c.end.store(r.end, std::memory_order_relaxed);
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }
  // Single consumer: true when a producer has claimed a cell that pop() has not taken yet (it may
  // still be filling it in).
  bool claimed() const noexcept { return tail_.load(std::memory_order_acquire) != head_; }
  // Single consumer. False when empty or when the next cell is claimed but not yet published.
  bool pop(Range* out) noexcept {
    Cell& c = cells_[head_ & (kCapacity - 1)];
    if (c.seq.load(std::memory_order_acquire) != head_ + 1) return false;
    out->start = c.start.load(std::memory_order_relaxed);
    out->end = c.end.load(std::memory_order_relaxed);
    c.seq.store(head_ + kCapacity, std::memory_order_release);
    ++head_;
    return true;
  }

 private:
  struct Cell {
    std::atomic<std::uint64_t> seq{0};
    std::atomic<std::uintptr_t> start{0};
    std::atomic<std::uintptr_t> end{0};
  };
  Cell cells_[kCapacity];
  alignas(kCacheLine) std::atomic<std::uint64_t> tail_{0};
  alignas(kCacheLine) std::uint64_t head_ = 0;  // consumer only
};

// Most live threads a cache serves on its lock-free path (each has a dense index and a reader
// slot); further threads take the slow path.
inline constexpr int kMaxThreads = 1 << 16;

}  // namespace gmd::rcache::detail
