// Synchronisation building blocks of the registration cache (internal to rcache/).
//
// Everything here is usable from inside a memory hook except where a comment says otherwise: no
// allocation, no blocking wait, no exceptions.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace gmd::rcache::detail {

inline constexpr std::size_t kCacheLine = 64;

// A non-recursive writer lock whose try_lock() may be called by the thread that already holds it
// (it simply fails), which std::mutex does not allow. lock() spins briefly, then sleeps on a futex.
//
// unlock() is a plain store and a load (what a release is on x86), not a read-modify-write: a miss
// unlocks two or three times and an eviction twice, and with the atomic exchange that told the
// unlocker whether anyone slept a round trip took 12.3 ns instead of 8.6 on an Intel Xeon
// (bench/lock_bench.cc, docs/rcache.md). A sleeper counts itself in waiters_ before it sleeps, and
// unlock() wakes one when the count it loads is not 0. The load may pass the store (x86 lets a load
// pass an older store to another address), so an unlocker can miss a waiter that counted itself
// just then while that waiter still sees the lock held: that sleep ends by its timeout
// (kSleepCapNs) instead of a wake-up, and the waiter looks again. A delay in a rare race, never a
// hang.
//
// Thread safety: all members from any thread; try_lock() is hook-safe.
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
    state_.store(kFree, std::memory_order_release);
    if (__builtin_expect(waiters_.load(std::memory_order_relaxed) != 0, 0)) wakeOne();
  }
  // unlock() in a fork child, the only thread there: the parent's threads that waited for the
  // lock are not in the child, and a count left of them would make every unlock() a system call.
  void unlockInForkChild() noexcept {
    waiters_.store(0, std::memory_order_relaxed);
    state_.store(kFree, std::memory_order_release);
  }
  // Tests only: threads counted as sleeping on the lock.
  std::uint32_t waitersForTests() const noexcept {
    return waiters_.load(std::memory_order_relaxed);
  }

 private:
  static constexpr std::uint32_t kFree = 0, kLocked = 1;
  static constexpr long kSleepCapNs = 1000000;  // 1 ms
  __attribute__((noinline)) void lockSlow() noexcept {
    for (int i = 0; i < 64; ++i) {  // a writer's usual stretch
      if (state_.load(std::memory_order_relaxed) == kFree && try_lock()) return;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    waiters_.fetch_add(1, std::memory_order_seq_cst);  // before the look at state_ below
    while (!try_lock()) {
      const timespec cap{0, kSleepCapNs};
      // Sleeps only while state_ still reads kLocked (the kernel checks it); any wake-up, the
      // timeout or a signal sends us round again.
      syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&state_), FUTEX_WAIT_PRIVATE, kLocked,
              &cap, nullptr, 0);
    }
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  __attribute__((noinline)) void wakeOne() noexcept {
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
  }
  std::atomic<std::uint32_t> state_{kFree};
  std::atomic<std::uint32_t> waiters_{0};  // threads in lockSlow()'s sleeping loop
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t),
                "the futex word is the atomic's");
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
