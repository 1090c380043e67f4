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

}  // namespace gmd::rcache::detail
