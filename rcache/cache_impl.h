// The registration cache (internal to rcache/): CacheImpl ties the index, reclamation, the
// invalidation queue and the eviction order together. Defined in cache.cc (lookups, parked holds,
// counters), miss.cc (misses), invalidation.cc (invalidation), deferred.cc (dead regions, deferred
// deregistration and reclamation), eviction.cc (limits and LRU eviction) and fork.cc (fork()). See
// rcache/README.md for the invariants and docs/rcache.md for the design.
//
// Thread safety: every public member from any thread (the Cache contract). Writers (misses,
// invalidations, evictions, deferred work) hold lock_; the hit path and put() take no lock.
// Lock order: thread-index registry mutex -> cache registry mutex (fork.cc) -> CacheImpl::lock_
// -> the block pools' spin locks (block_pool.h; only the fork handlers hold them with another).
// invalidate() only ever try-locks lock_, so code under lock_ may allocate (a hook raised by that
// allocation queues its range instead of waiting).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "common/range.h"
#include "rcache/block_pool.h"
#include "rcache/index.h"
#include "rcache/invalidation_queue.h"
#include "rcache/lru_queue.h"
#include "rcache/rcache.h"
#include "rcache/reclaim.h"
#include "rcache/sync.h"

namespace gmd::rcache::detail {

// State word of a region: holders in the low 31 bits, the invalid flag above.
inline constexpr std::uint32_t kHolderMask = 0x7fffffffu;
inline constexpr std::uint32_t kInvalid = 1u << 31;  // out of the index; never handed out again

enum class DoomReason : std::uint8_t { kInvalidated, kMerged, kEvicted, kStale };

class RegionImpl;

// Every region is one cache line of its pool, with a 32-bit id (block_pool.h).
using RegionPool = LinePool<kCacheLine>;

// One cache line, and nothing beside it: what the hit path and put() touch (the Region's immutable
// fields, the state word, the release tick), so that one region's hit or put() loads one line and
// different regions' state words never share one; and what writers keep per region in the 22
// bytes the Region leaves: the index's two members, the fork generation, and one word that is the
// position in the eviction order while the region is in it, else its link on a writer's list.
// Lists link regions by id (RegionPool::idOf(), 4 bytes), not by pointer.
class alignas(kCacheLine) RegionImpl final : public Region {
 public:
  RegionImpl(Range range, unsigned access, MemType type, Backend* backend, const Registration& reg,
             std::uint32_t fork_gen) noexcept {
    start_ = range.start;
    end_ = range.end;
    access_ = static_cast<std::uint8_t>(access);
    mem_type_ = type;
    backend_ = backend;
    reg_ = reg;
    fork_gen_ = static_cast<std::uint8_t>(fork_gen);
  }
  ~RegionImpl() = default;

  // Take a reference unless the region is invalid. *prev_holders receives the count before.
  bool tryAcquire(std::uint64_t* prev_holders) noexcept {
    std::uint32_t s = state_.load(std::memory_order_relaxed);
    do {
      if ((s & kInvalid) != 0 || (s & kHolderMask) == kHolderMask) return false;
    } while (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                           std::memory_order_relaxed));
    *prev_holders = s & kHolderMask;
    return true;
  }
  // Whether this region answers a request for `access` resolved by `resolver` (rcache.h).
  bool serves(unsigned access, const Resolver& resolver) const noexcept {
    return (access_ & access) == access &&
           (!resolver.isFixed() ||
            (mem_type_ == resolver.fixedType() && backend_ == resolver.fixedBackend()));
  }

  // Ids (never 0) and back; null for 0.
  static std::uint32_t idOf(const RegionImpl* r) noexcept {
    return r != nullptr ? RegionPool::idOf(r) : 0;
  }
  static RegionImpl* fromId(std::uint32_t id) noexcept {
    return static_cast<RegionImpl*>(RegionPool::at(id));
  }

  // Writers (lock_): the eviction order's member (lru_queue.h) while the region is in it (valid and
  // indexed); otherwise the link of the dead_ / zombies_ list or evictOne_locked()'s skip list,
  // which only hold regions out of the order (each takes the word after the region left the order;
  // the order sets it again when it takes the region back).
  std::uint32_t& lruPos() noexcept { return order_or_link_; }
  RegionImpl* nextDead() const noexcept { return fromId(order_or_link_); }
  void setNextDead(RegionImpl* r) noexcept { order_or_link_ = idOf(r); }
  // The index's purge list (index.h).
  RegionImpl* nextUnindex() const noexcept { return fromId(next_unindex_); }
  void setNextUnindex(RegionImpl* r) noexcept { next_unindex_ = idOf(r); }
  // Whether the region was registered in fork generation `gen` (the cache's), told modulo 256: a
  // region held through 256 nested fork()s would be taken for the child's own.
  bool ofForkGen(std::uint32_t gen) const noexcept {
    return fork_gen_ == static_cast<std::uint8_t>(gen);
  }
  // Once retired, the region's registration bytes (nothing reads them any more: it was
  // deregistered, and nobody can take a hold on it) are the record the retire list links
  // (reclaim.h); a reader still inside its epoch reads only the range, access, memory type,
  // backend and state word. The region is found back from the record by its line.
  RetiredRecord* retireRecord() noexcept {
    static_assert(sizeof(Registration) == sizeof(RetiredRecord) &&
                  alignof(Registration) == alignof(RetiredRecord));
    return new (static_cast<void*>(&reg_)) RetiredRecord{};
  }
  static RegionImpl* ofRecord(RetiredRecord* rec) noexcept {
    return reinterpret_cast<RegionImpl*>(reinterpret_cast<std::uintptr_t>(rec) &
                                         ~(std::uintptr_t{kCacheLine} - 1));
  }

  // The index's member (index.h), guarded by lock_: an entry of the published index points here.
  bool in_index_ = false;
  std::uint8_t fork_gen_ = 0;            // ofForkGen()
  std::atomic<std::uint32_t> state_{1};  // created held by its requester
  std::uint32_t next_unindex_ = 0;  // index.h's purge list (invalid, entry still in a leaf), by id
  std::uint32_t order_or_link_ = kNotQueued;  // lruPos() or nextDead()
  std::atomic<std::uint64_t> last_used_{0};   // release tick (see CacheImpl::releaseTick)
};

static_assert(sizeof(RegionImpl) == kCacheLine && alignof(RegionImpl) == kCacheLine,
              "a region is one cache line (its state word shares it with no other region)");
// 63 regions to a 4 KiB span, nothing spare but the span's 64-byte head: 65.0 bytes each.
static_assert(RegionPool::kPerSpan * sizeof(RegionImpl) + RegionPool::kHeadBytes ==
              RegionPool::kSpanBytes);

// Adds `d` to a counter that only writers (under lock_) or a single owner modify; readers may load.
template <typename T>
inline void bump(std::atomic<T>& a, T d) noexcept {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

// The calling thread's reader slot in the cache it used last (caches have unique ids): what
// CacheImpl::mySlot() reads first. Defined in cache.cc.
struct TlsSlot {
  std::uint64_t cache_id;
  ReaderSlot* slot;
  // Hits on other regions since this thread parked its hold (when the slot holds one); see put().
  std::uint32_t park_misses;
};
extern __attribute__((tls_model("initial-exec"))) constinit thread_local TlsSlot tls_slot;

class CacheImpl final : public Cache {
 public:
  explicit CacheImpl(const Config& config) noexcept;
  ~CacheImpl() override;

  using Cache::get;
  Result get(const void* address, std::size_t length, unsigned access, const Resolver& resolver,
             Region** region) noexcept override;
  void put(Region* region) noexcept override;
  bool find(const void* address, std::size_t length, unsigned access,
            Region** region) noexcept override;
  void invalidate(const void* address, std::size_t length) noexcept override;
  void progress() noexcept override;
  Stats stats() const noexcept override;
  const Config& config() const noexcept override { return config_; }

  // A cache lives on pages of its own (mmap), so that no application buffer registered with
  // MADV_DONTFORK (ibv_fork_init()) can share a page with what the fork child handler writes.
  static void* operator new(std::size_t size, const std::nothrow_t&) noexcept;
  static void operator delete(void* p, std::size_t size) noexcept;

  // Fork handlers (fork.cc; the cache registry is locked). dropUnusedBeforeFork() runs first,
  // before any lock is taken: it deregisters every unused region, so that only memory the
  // application still holds registered is do-not-fork in the child.
  void dropUnusedBeforeFork() noexcept;
  // lock_ guards region_pool_ too.
  void forkPrepare() noexcept { lock_.lock(); }
  // The leaf pools are the process's (index.h); fork.cc locks them after every cache.
  void forkParent() noexcept { lock_.unlock(); }
  void forkChild() noexcept;

  // Tests only: the writer lock, to stand for a writer pre-empted while holding it.
  WriterLock& writerLockForTests() noexcept { return lock_; }

  CacheImpl* reg_next_ = nullptr;  // cache registry links, guarded by the registry mutex
  CacheImpl* reg_prev_ = nullptr;

 private:
  using IndexT = Index<RegionImpl>;
  using Entry = IndexT::Entry;

  Result checkRequest(const void* address, std::size_t length, unsigned access,
                      const Resolver& resolver, Region* const* region, Range* rq) const noexcept;
  bool plainRequest(const void* address, std::size_t length, unsigned access,
                    const Resolver& resolver, Region* const* region, Range* rq) const noexcept;
  RegionImpl* parkedHit(ReaderSlot* slot, std::uintptr_t start, std::uintptr_t end, unsigned access,
                        const Resolver* resolver) noexcept;
  template <bool kTryParked>
  RegionImpl* fastHit(std::uintptr_t start, std::uintptr_t end, unsigned access,
                      const Resolver* resolver) noexcept;
  template <bool kTryParked>
  Result getIndexed(const void* address, std::size_t length, unsigned access,
                    const Resolver& resolver, Region** region) noexcept;
  void putSlow(Region* region) noexcept;
  RegionImpl* floorRegion(ReaderSlot* slot, std::uintptr_t start, std::uintptr_t end) noexcept;
  void park(ReaderSlot* slot, RegionImpl* r) noexcept;
  void releaseHold(ReaderSlot* slot, RegionImpl* r) noexcept;
  bool bareMiss(const Range& rq, std::uint64_t* seq0, std::uint64_t* insertions0) noexcept;
  Result getSlow(const void* address, std::size_t length, const Range& rq, unsigned access,
                 const Resolver& resolver, Region** out) noexcept;
  // The calling thread's slot in this cache (null past kMaxThreads threads or on no memory).
  __attribute__((always_inline)) ReaderSlot* mySlot() noexcept {
    if (__builtin_expect(tls_slot.cache_id == id_, 1)) return tls_slot.slot;
    return mySlotSlow();
  }
  ReaderSlot* mySlotSlow() noexcept;
  // mySlot() when this thread's slot in this cache is known already, else null (no call).
  __attribute__((always_inline)) ReaderSlot* knownSlot() const noexcept {
    return __builtin_expect(tls_slot.cache_id == id_, 1) ? tls_slot.slot : nullptr;
  }
  // Adds `delta` to the unused bytes in `slot`'s share when it stays within its bound; false when
  // it would not (nothing changed then: the caller flushes).
  bool addUnusedInSlot(ReaderSlot* slot, std::int64_t delta) noexcept {
    if (slot == nullptr) return false;
    const std::int64_t v = slot->unused_delta.load(std::memory_order_relaxed) + delta;
    if (__builtin_expect(v > unused_flush_bound_ || v < -unused_flush_bound_, 0)) return false;
    slot->unused_delta.store(v, std::memory_order_relaxed);
    return true;
  }
  void addUnused(ReaderSlot* slot, std::int64_t delta) noexcept {
    if (!addUnusedInSlot(slot, delta)) flushUnused(slot, delta);
  }
  void flushUnused(ReaderSlot* slot, std::int64_t delta) noexcept;
  // Writers: `bytes` of unused regions left the cache (doomed, or taken by a hit under the lock),
  // taken off this thread's own share like unparkAll_locked()'s releases: a store, not an atomic
  // read-modify-write of the shared counter, while the share stays within its bound.
  void dropUnused_locked(std::int64_t bytes) noexcept {
    ReaderSlot* mine = mySlot();
    if (!addUnusedInSlot(mine, -bytes)) (void)moveUnused(mine, -bytes);
  }
  // The slot's share and `delta` moved to the shared counter; true when that went over the unused
  // limit (then someone must evict: setWork_locked(true)).
  bool moveUnused(ReaderSlot* slot, std::int64_t delta) noexcept;
  // LRU order without a shared write on the hit path: a Lamport clock. Each thread ticks its own
  // counter, never behind lru_clock_; writers move lru_clock_ past every thread's counter at each
  // miss. Exact within a thread, and across threads between two misses.
  std::uint64_t releaseTick(ReaderSlot* slot) noexcept {
    const std::uint64_t g = lru_clock_.load(std::memory_order_relaxed);
    if (slot == nullptr) return g;
    const std::uint64_t t = std::max(slot->lru_seq.load(std::memory_order_relaxed) + 1, g);
    slot->lru_seq.store(t, std::memory_order_relaxed);
    return t;
  }
  void advanceLruClock_locked() noexcept;
  std::int64_t unusedExact() const noexcept;

  // All *_locked members require lock_.
  // Applies the queued invalidations, then `also` (an invalidation that was not queued).
  void applyQueued_locked(bool wait = true, const Range* also = nullptr) noexcept;
  bool markInvalid_locked(RegionImpl* r, DoomReason why) noexcept;
  void leaveIndex_locked(RegionImpl* r) noexcept;
  void doomUnused_locked(RegionImpl* r, DoomReason why) noexcept;
  // eviction.cc
  bool evictOne_locked() noexcept;
  bool makeRoom_locked(std::size_t bytes) noexcept;
  void enforceUnused_locked() noexcept;
  std::size_t evictAllUnused_locked() noexcept;
  // miss.cc
  bool insert_locked(RegionImpl* r) noexcept;
  // deferred.cc
  void pushDead_locked(RegionImpl* r) noexcept;
  RegionImpl* takeDead_locked() noexcept;
  void setWork_locked(bool on) noexcept;
  void retireRegions_locked(RegionImpl* list) noexcept;

  // Parked holds (cache.cc): every reader slot's parked hold released, so that writers see the
  // holds the callers have (eviction, invalidation counts, the unused bytes).
  void unparkAll_locked() noexcept;

  // deferred.cc
  void finishWork(bool force_collect = false) noexcept;
  void releaseInvalid(RegionImpl* r) noexcept;
  void deregister(RegionImpl* r) noexcept;
  // region_pool_ is lock_'s (or the destructor's, alone): a region is allocated and freed under
  // the lock that the miss and the collection take anyway. collect_locked(): what readers no
  // longer see (reclaim_.collect()); its regions go back to region_pool_ here, its leaves and tops
  // are left for freeList(), outside lock_ (the process's leaf pools).
  Reclaimed collect_locked(bool force) noexcept {
    Reclaimed r = reclaim_.collect(force);
    freeRegions_locked(r.records);
    r.records = nullptr;
    return r;
  }
  void freeRegions_locked(RetiredRecord* records) noexcept;
  void freeList(Reclaimed list) noexcept;  // the destructor's: its records too
  RegionImpl* newRegion_locked(Range range, unsigned access, MemType type, Backend* backend,
                               const Registration& reg) noexcept {
    void* p = region_pool_.allocate();
    return p != nullptr ? new (p) RegionImpl(range, access, type, backend, reg,
                                             fork_gen_.load(std::memory_order_relaxed))
                        : nullptr;
  }
  void freeRegion_locked(RegionImpl* r) noexcept {
    r->~RegionImpl();
    region_pool_.release(r);
  }

  const Config config_;
  const std::uint64_t id_;
  const std::int64_t unused_flush_bound_;

  // Read on every get(), one cache line: attention_ (queued invalidations in the low 32 bits,
  // + kWorkBit while deregistrations wait), the index's top, the epoch.
  alignas(kCacheLine) std::atomic<std::uint64_t> attention_{0};
  IndexT index_{&reclaim_};
  std::atomic<std::uint64_t> lru_clock_{1};
  Reclaimer reclaim_;
  static constexpr std::uint64_t kWorkBit = 1ull << 32;

  alignas(kCacheLine) WriterLock lock_;
  InvalidationQueue queue_;

  RegionPool region_pool_;  // every RegionImpl; guarded by lock_

  // Guarded by lock_.
  RegionImpl* dead_ = nullptr;     // unused invalid regions waiting for deregistration
  RegionImpl* zombies_ = nullptr;  // deregistered, still in the index (a leaf rewrite failed)
  LruQueue<RegionImpl> lru_;       // valid indexed regions by release tick
  bool work_flag_ = false;         // mirrors kWorkBit in attention_
  // While a miss makes room: what it dooms goes to dead_ without the work bit, and the miss takes
  // it before it lets go of lock_ (getSlow()).
  bool own_dead_ = false;
  // While applyQueued_locked() drains, doomUnused_locked() adds here instead of to the counters,
  // which the drain then updates once.
  struct DoomBatch {
    bool on = false;
    std::int64_t regions = 0;
    std::int64_t bytes = 0;
  };
  DoomBatch doom_batch_;
  std::atomic<std::uint32_t> fork_gen_{0};  // bumped in a fork child (single-threaded there)

  // Counters; writers update them, stats() reads them from any thread.
  std::atomic<std::uint64_t> slow_hits_{0}, misses_{0}, merges_{0}, evictions_{0};
  std::atomic<std::uint64_t> inval_in_use_{0}, inval_unused_{0}, deferred_{0}, overflows_{0};
  // Indexed or held (or being registered); modified under lock_ only (bump()).
  std::atomic<std::int64_t> regions_{0}, pinned_{0};
  std::atomic<std::int64_t> unused_shared_{0};  // plus the readers' unused_delta
};

}  // namespace gmd::rcache::detail
