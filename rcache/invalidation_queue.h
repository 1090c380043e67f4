// The registration cache's invalidation queue (internal to rcache/).
//
// invalidate() may run inside a memory hook, on any thread, while the same thread is inside the
// cache: it can neither allocate nor wait for the writer lock. So it pushes the range into a
// preallocated ring, and whoever holds the writer lock next drains the ring before its lookup
// (docs/rcache.md, "Invalidation"). A push that finds the ring full widens instead the smallest
// range covering every push that did not fit (two atomic bounds, lock-free) and is counted; the
// drain applies that range, so only regions inside it leave the index, never the whole index.
//
// The queue also remembers the last kHistory ranges it applied, so that a miss that registered
// outside the lock can tell whether its range was invalidated meanwhile (rule 5).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

#include "common/range.h"
#include "rcache/sync.h"

namespace gmd::rcache::detail {

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

// Thread safety: push() from any thread at any time (lock-free, hook-safe); everything else by
// one thread at a time, the holder of the cache's writer lock.
class InvalidationQueue {
 public:
  static constexpr std::size_t kCapacity = 1024;  // queued ranges before the covering fallback
  static constexpr std::size_t kHistory = 64;     // applied ranges remembered for in-flight misses

  void push(Range r) noexcept {
    if (ring_.push(r)) return;
    // Did not fit: widen the covering range (start first, then end), then count the push. A drain
    // that takes the count took both bounds too (they were widened before it).
    lowerTo(spill_start_, r.start);
    raiseTo(spill_end_, r.end);
    overflow_.fetch_add(1, std::memory_order_seq_cst);
  }

  // Applies every queued range in order: apply(Range) for each, then, if pushes overflowed the
  // ring, once for the smallest range covering those that did not fit. Each applied range enters
  // the history. With `wait`, also waits for producers that claimed a cell but have not filled it
  // yet (the ring is FIFO, so a completed push may sit behind one still being written, and a lookup
  // must not start before it is applied); invalidate() itself never waits (it may have interrupted
  // such a producer). Returns the number of pushes consumed (overflowed ones included); *overflows
  // gets those.
  template <typename F>
  std::uint64_t drain(bool wait, F apply, std::uint64_t* overflows) noexcept {
    std::uint64_t n = 0;
    Range r;
    for (;;) {
      if (ring_.pop(&r)) {
        record(r);
        apply(r);
        ++n;
      } else if (wait && ring_.claimed()) {
        std::this_thread::yield();
      } else {
        break;
      }
    }
    // Looked at first, taken only when non-zero: the usual drain does no read-modify-write. A push
    // counted after the look is applied by the next drain (its invalidate() keeps attention_ up).
    std::uint64_t over = overflow_.load(std::memory_order_seq_cst);
    if (over != 0) over = overflow_.exchange(0, std::memory_order_seq_cst);
    *overflows = over;
    if (over != 0) {
      // The bounds as they are now. A push that had widened only its start when an earlier drain
      // took the bounds left its end here alone (or the reverse): the open side then reaches the
      // end of the address space, which still covers it. Both bounds empty: an earlier drain
      // already applied everything counted here.
      const std::uintptr_t lo = spill_start_.exchange(UINTPTR_MAX, std::memory_order_seq_cst);
      const std::uintptr_t hi = spill_end_.exchange(0, std::memory_order_seq_cst);
      if (lo != UINTPTR_MAX || hi != 0) {
        r = Range{lo == UINTPTR_MAX ? 0 : lo, hi == 0 ? UINTPTR_MAX : hi};
        record(r);
        apply(r);
      }
      n += over;
    }
    return n;
  }

  // Applies r without queuing it (the writer lock's holder, right after a drain: invalidations
  // commute), entering it into the history as a drained range.
  template <typename F>
  void applyNow(Range r, F apply) noexcept {
    record(r);
    apply(r);
  }

  // Fork child: forget what is queued (the parent's regions are dropped wholesale).
  void discard() noexcept {
    Range r;
    while (ring_.pop(&r)) {
    }
    overflow_.store(0, std::memory_order_relaxed);
    spill_start_.store(UINTPTR_MAX, std::memory_order_relaxed);
    spill_end_.store(0, std::memory_order_relaxed);
  }

  // Ranges applied so far (a sequence number for invalidatedSince()). The lock's holder writes it;
  // anyone may read it (acquire: the history up to it is written).
  std::uint64_t applied() const noexcept { return seq_.load(std::memory_order_acquire); }
  // Whether a range applied after sequence number seq0 overlaps r (true when too many were applied
  // to tell: the worst is assumed).
  bool invalidatedSince(std::uint64_t seq0, Range r) const noexcept {
    const std::uint64_t now = seq_.load(std::memory_order_relaxed);
    if (now - seq0 > kHistory) return true;
    for (std::uint64_t s = seq0; s < now; ++s) {
      if (history_[s % kHistory].overlaps(r)) return true;
    }
    return false;
  }

 private:
  static void lowerTo(std::atomic<std::uintptr_t>& a, std::uintptr_t v) noexcept {
    std::uintptr_t cur = a.load(std::memory_order_relaxed);
    while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_seq_cst)) {
    }
  }
  static void raiseTo(std::atomic<std::uintptr_t>& a, std::uintptr_t v) noexcept {
    std::uintptr_t cur = a.load(std::memory_order_relaxed);
    while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_seq_cst)) {
    }
  }
  void record(Range r) noexcept {
    const std::uint64_t s = seq_.load(std::memory_order_relaxed);
    history_[s % kHistory] = r;
    seq_.store(s + 1, std::memory_order_release);
  }

  RangeRing<kCapacity> ring_;
  std::atomic<std::uint64_t> overflow_{0};  // pushes that found ring_ full, not yet applied
  std::atomic<std::uintptr_t> spill_start_{UINTPTR_MAX};  // the range covering them (empty: start
  std::atomic<std::uintptr_t> spill_end_{0};              // above end)
  std::atomic<std::uint64_t> seq_{0};                     // ranges applied so far
  Range history_[kHistory];                               // the last kHistory of them
};

}  // namespace gmd::rcache::detail
