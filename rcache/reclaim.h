// Reclamation for the registration cache (internal to rcache/): dense thread indices, per-thread
// reader slots with epochs, the asymmetric fence, and the list of retired objects.
//
// Readers (the hit path) never lock. A reader announces the global epoch in its slot before it
// loads the index and clears it after; a writer that replaces a leaf, a top or drops a region
// retires the old object with the current epoch and frees it only once every slot is clear or
// shows a later epoch (docs/rcache.md, "Reclamation"). The reader's announcement is a plain store
// ordered by membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) on the writer's side; without membarrier
// (old kernels) or under ThreadSanitizer, readers use a sequentially consistent store.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "rcache/sync.h"

namespace gmd::rcache::detail {

// Most live threads a cache serves on its lock-free path (each has a dense index and a reader
// slot); further threads take the slow path.
inline constexpr int kMaxThreads = 1 << 16;

// The calling thread's dense index in [0, kMaxThreads), reused after thread exit; -1 past
// kMaxThreads threads, on no memory, or while the thread is exiting. Takes the thread registry
// mutex on the first call per thread.
int threadIndex() noexcept;
// Fork handlers only: the thread registry mutex (lock order: before any cache lock).
void lockThreadRegistry() noexcept;
void unlockThreadRegistry() noexcept;

// True when membarrier() orders the readers' plain stores (decided once, at load).
extern const bool g_asymmetric_fence;

// Reader side of the fence: announce epoch e in slot_epoch before loading the index.
inline void readerEnter(std::atomic<std::uint64_t>& slot_epoch, std::uint64_t e) noexcept {
  if (__builtin_expect(g_asymmetric_fence, 1)) {
    slot_epoch.store(e, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    slot_epoch.store(e, std::memory_order_seq_cst);
  }
}
// Writer side: makes every running thread's earlier stores visible before the slots are scanned.
void writerFence() noexcept;

// One per thread (by threadIndex()) and cache: the reader's epoch and its private counters.
struct alignas(kCacheLine) ReaderSlot {
  std::atomic<std::uint64_t> epoch{0};  // 0: not reading; else the global epoch at entry
  std::atomic<std::uint64_t> hits{0};   // written by the owning thread only
  std::atomic<std::int64_t> unused_delta{
      0};                                 // owner only; flushed to the shared counter past a bound
  std::atomic<std::uint64_t> lru_seq{0};  // owner only: this thread's last release tick
  // Owner only: where this thread's last lookup ended in the cache's index (a ReadPos of
  // rcache/index.h; only ever a guess, checked before use).
  std::atomic<std::uint64_t> read_pos{~std::uint64_t{0}};
  // The hold the owner kept at its last put() of a valid region (a RegionImpl*, null when none),
  // so that its next hit on that region takes it back with one compare-and-swap on this line
  // instead of one on the region's and no read-modify-write at put() (rcache/cache.cc, "Parked
  // holds"). The owner stores a region into it only while it is null; everyone else only takes
  // it out (exchange / compare-and-swap to null), and writers do so at each pass (lock_).
  std::atomic<void*> parked{nullptr};
  // Owner only: the bounds of the region it last stored into `parked`, written before that store,
  // so that a hit tells whether the parked region covers its request without reading the
  // region's line (which another thread may be writing, when the two use that buffer).
  std::uintptr_t parked_start = 0;
  std::uintptr_t parked_end = 0;
};
static_assert(sizeof(ReaderSlot) == kCacheLine, "a reader slot is one cache line");

// The reader slots of one cache and its global epoch. Slots are allocated in chunks on first use
// and never freed before the cache.
// Thread safety: slot() and forEach() from any thread; advance() by writers (the cache's lock).
class ReaderSlots {
 public:
  static constexpr std::size_t kSlotsPerChunk = 64;
  static constexpr std::size_t kMaxChunks = kMaxThreads / kSlotsPerChunk;

  ReaderSlots() = default;
  ~ReaderSlots();
  ReaderSlots(const ReaderSlots&) = delete;
  ReaderSlots& operator=(const ReaderSlots&) = delete;

  // The slot of thread `index` (a threadIndex()), allocated on first use; null on no memory.
  ReaderSlot* slot(int index) noexcept;
  // Calls f(ReaderSlot&) for every slot a thread may use.
  template <typename F>
  void forEach(F f) const noexcept {
    const std::size_t lim = slot_limit_.load(std::memory_order_seq_cst);
    for (std::size_t ci = 0; ci * kSlotsPerChunk < lim; ++ci) {
      SlotChunk* c = chunks_[ci].load(std::memory_order_seq_cst);
      if (c == nullptr) continue;
      const std::size_t n = std::min(kSlotsPerChunk, lim - ci * kSlotsPerChunk);
      for (std::size_t k = 0; k < n; ++k) f(c->slot[k]);
    }
  }
  std::uint64_t epoch() const noexcept { return epoch_.load(std::memory_order_acquire); }
  std::uint64_t epochRelaxed() const noexcept { return epoch_.load(std::memory_order_relaxed); }
  void advance() noexcept { epoch_.fetch_add(1, std::memory_order_seq_cst); }
  // The oldest epoch a reader announces now (UINT64_MAX when none reads). Runs the writer fence.
  std::uint64_t oldestReader() const noexcept;

 private:
  struct SlotChunk {
    ReaderSlot slot[kSlotsPerChunk];
  };
  static SlotChunk* allocateChunk() noexcept;
  static void releaseChunk(SlotChunk* c) noexcept;
  std::atomic<std::uint64_t> epoch_{1};
  std::atomic<std::size_t> slot_limit_{0};  // slots [0, slot_limit_) may have been handed out
  std::atomic<SlotChunk*> chunks_[kMaxChunks] = {};
};

// Base of every object freed through epochs but records (the index's leaves and tops, which it
// tells apart with `kind`; `bytes` is the object's size, which a leaf's capacity derives from).
struct Retired {
  Retired* next_retired = nullptr;
  std::uint64_t retire_epoch = 0;
  std::uint32_t bytes = 0;
  std::uint8_t kind = 0;
};

// A small retired thing without a size or kind of its own: a cache's region retires 16 bytes of its
// own line that nothing reads once it retired (rcache/cache_impl.h). The owner constructs it
// (placement new) when the record retires; it finds its object back from the record's address.
struct RetiredRecord {  // trivial: it takes the storage of what the record was before
  RetiredRecord* next;
  std::uint64_t epoch;
};

// What a collection hands back: objects and records no reader can see any more.
struct Reclaimed {
  Retired* objects = nullptr;        // linked by next_retired
  RetiredRecord* records = nullptr;  // linked by next
};

// Objects and records that left the published index, waiting for readers to leave their epoch.
// Thread safety: writers only (the cache's lock).
class RetireList {
 public:
  // A collection pass costs a membarrier() (~0.4 us): batched (by count, records included),
  // bounded in memory (by the objects' bytes: records are small).
  static constexpr std::size_t kCollectBatch = 128;
  static constexpr std::size_t kCollectBytes = std::size_t{1} << 20;

  void retire(Retired* x, std::uint64_t epoch) noexcept {
    x->retire_epoch = epoch;
    x->next_retired = head_;
    head_ = x;
    ++count_;
    bytes_ += x->bytes;
    retired_since_advance_ = true;
  }
  void retire(RetiredRecord* x, std::uint64_t epoch) noexcept {
    x->epoch = epoch;
    x->next = records_;
    records_ = x;
    ++count_;
    retired_since_advance_ = true;
  }
  // What no reader can see any more, for the caller to free once the lock is released. Batched
  // unless `force`; advances the epoch when something was retired since the last pass.
  Reclaimed collect(ReaderSlots& slots, bool force) noexcept;
  // Everything, whatever the readers (the cache's destructor: nobody reads any more).
  Reclaimed takeAll() noexcept {
    const Reclaimed all{head_, records_};
    head_ = nullptr;
    records_ = nullptr;
    count_ = 0;
    bytes_ = 0;
    return all;
  }

 private:
  Retired* head_ = nullptr;
  RetiredRecord* records_ = nullptr;
  std::size_t count_ = 0;  // objects and records
  std::size_t bytes_ = 0;  // the objects'
  bool retired_since_advance_ = false;
};

// A cache's reader slots and retire list together: what the index and the cache retire goes here,
// stamped with the current epoch. Thread safety: as its two parts.
struct Reclaimer {
  ReaderSlots slots;
  RetireList retired;
  void retire(Retired* x) noexcept { retired.retire(x, slots.epochRelaxed()); }
  void retire(RetiredRecord* x) noexcept { retired.retire(x, slots.epochRelaxed()); }
  Reclaimed collect(bool force) noexcept { return retired.collect(slots, force); }
};

}  // namespace gmd::rcache::detail
