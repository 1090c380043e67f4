// gmd registration cache. See rcache/README.md for the design and the rule-by-rule map.
//
// Shape of the implementation:
//  - The index is a two-level sorted array of disjoint regions (Top -> Leaf) published through an
//    atomic pointer. Readers (the hit path) look it up inside an epoch and take a reference with
//    one CAS on the region's state word, which fails once the region is invalid. Writers (misses,
//    invalidations, evictions) are serialised by lock_; they replace one leaf (or the top, when
//    leaves split, merge or disappear) and retire what they replaced; old leaves, tops and dead
//    regions are freed once no reader can still see them (epoch-based reclamation, one reader
//    slot per thread). Eviction pops a writers-only heap of regions by release tick.
//  - invalidate() never blocks and never allocates: it queues the range in a preallocated ring,
//    bumps attention_, and applies the queue at once when it can try-lock the writer lock. Every
//    get() reads attention_ before its lookup and drains the queue first when it is non-zero.
//  - Deregistration happens outside lock_, in get()/put()/progress(), never inside invalidate().
//
// Lock order: thread-index registry mutex -> cache registry mutex -> CacheImpl::lock_. invalidate()
// only ever try-locks lock_, so code under lock_ may allocate (a hook raised by that allocation
// queues its range instead of waiting).
#include "rcache/rcache.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <new>
#include <vector>

#include "rcache/sync.h"

namespace gmd::rcache {

using detail::kCacheLine;
using detail::Range;
using detail::WriterGuard;
using detail::WriterLock;

const char* statusString(Status s) noexcept {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kInvalidParam:
      return "invalid parameter";
    case Status::kNoMemory:
      return "out of memory";
    case Status::kNoResource:
      return "out of registration resources";
    case Status::kExceedsLimit:
      return "exceeds a configured limit";
    case Status::kUnsupported:
      return "unsupported";
    case Status::kIoError:
      return "registration failed";
  }
  return "unknown";
}

namespace {

// ---------------------------------------------------------------------------------------------------
// Logging

std::atomic<LogHandler> g_log_handler{nullptr};

void defaultLog(LogLevel level, const char* message) noexcept {
  if (level > LogLevel::kWarn) return;
  std::fprintf(stderr, "gmd rcache %s: %s\n", level == LogLevel::kError ? "error" : "warning",
               message);
}

__attribute__((format(printf, 2, 3))) void logf(LogLevel level, const char* fmt, ...) noexcept {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  LogHandler h = g_log_handler.load(std::memory_order_acquire);
  (h != nullptr ? h : defaultLog)(level, buf);
}

// ---------------------------------------------------------------------------------------------------
// Thread indices (dense, reused after thread exit)

struct ThreadIndexRegistry {
  std::mutex mutex;
  std::vector<int> free_list;
  int next = 0;
};

ThreadIndexRegistry& threadRegistry() {
  static auto* r = new ThreadIndexRegistry;  // never destroyed: threads may exit after main()
  return *r;
}

__attribute__((tls_model("initial-exec"))) thread_local int tls_thread_index = -1;
__attribute__((tls_model("initial-exec"))) thread_local bool tls_thread_exiting = false;

struct ThreadIndexReleaser {
  ~ThreadIndexReleaser() {
    // A cache call from a later thread-local destructor takes the slow path (no slot).
    tls_thread_exiting = true;
    if (tls_thread_index < 0) return;
    ThreadIndexRegistry& r = threadRegistry();
    std::lock_guard<std::mutex> g(r.mutex);
    try {
      r.free_list.push_back(tls_thread_index);
    } catch (...) {
      // The index leaks; harmless.
    }
    tls_thread_index = -1;
  }
};

int threadIndexSlow() noexcept {
  if (tls_thread_exiting) return -1;
  static thread_local ThreadIndexReleaser releaser;
  (void)&releaser;
  ThreadIndexRegistry& r = threadRegistry();
  std::lock_guard<std::mutex> g(r.mutex);
  int idx;
  if (!r.free_list.empty()) {
    idx = r.free_list.back();
    r.free_list.pop_back();
  } else if (r.next < detail::kMaxThreads) {
    idx = r.next++;
  } else {
    return -1;
  }
  tls_thread_index = idx;
  return idx;
}

inline int threadIndex() noexcept {
  const int i = tls_thread_index;
  return __builtin_expect(i >= 0, 1) ? i : threadIndexSlow();
}

// ---------------------------------------------------------------------------------------------------
// Asymmetric fence for the reader epochs
//
// A reader must publish its epoch before it loads the index (a store-load order, which needs a full
// fence on x86). With membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) the reader only needs a compiler
// barrier: the writer runs membarrier() before it scans the reader slots, which makes every running
// thread of the process execute a full fence, so either the writer sees the reader's epoch or the
// reader sees the new index. Without membarrier (old kernels) and under ThreadSanitizer (which does
// not model it) readers use a sequentially consistent store instead.

bool registerMembarrier() noexcept {
#if defined(__SANITIZE_THREAD__)
  return false;
#else
  const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
  if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0;
#endif
}

const bool g_asymmetric_fence = registerMembarrier();

inline void readerEnter(std::atomic<std::uint64_t>& slot_epoch, std::uint64_t e) noexcept {
  if (__builtin_expect(g_asymmetric_fence, 1)) {
    slot_epoch.store(e, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    slot_epoch.store(e, std::memory_order_seq_cst);
  }
}

// Without membarrier, the readers' sequentially consistent stores and the writer's sequentially
// consistent loads of the slots already order things; nothing more to do.
void writerFence() noexcept {
  if (g_asymmetric_fence) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0);
}

// ---------------------------------------------------------------------------------------------------
// Objects reclaimed through epochs

enum class RetiredKind : std::uint8_t { kRegion, kLeaf, kTop };

struct Retired {
  Retired* next_retired = nullptr;
  std::uint64_t retire_epoch = 0;
  RetiredKind kind = RetiredKind::kRegion;
};

class RegionImpl;

struct Entry {
  std::uintptr_t start;
  std::uintptr_t end;
  RegionImpl* region;
};

// The index has two levels. A Leaf is an immutable sorted array of at most kLeafMax entries; the
// Top is a sorted array of {key, leaf}: leaf i holds the entries whose start lies in
// [key i, key i+1), key 0 is 0, and no leaf is empty unless it is the only one. A key may be lower
// than its leaf's first start (that entry left the leaf); a lookup that finds nothing at or below
// the address in its leaf takes the last entry of the leaf before.
//
// Writers replace a changed leaf in place (an atomic store into its Top slot) and publish a new Top
// only when leaves are split, merged or dropped, so a miss or an invalidation copies one leaf of
// at most kLeafMax entries, plus, once every ~kLeafMax/2 insertions into a leaf, the Top (one
// 16-byte slot per leaf).
constexpr std::size_t kLeafMax = 64;
constexpr std::size_t kLeafMin = 16;  // a smaller leaf merges with a neighbour when they fit in one

struct Leaf : Retired {
  std::size_t size = 0;
  Entry* entries() noexcept { return reinterpret_cast<Entry*>(this + 1); }
  const Entry* entries() const noexcept { return reinterpret_cast<const Entry*>(this + 1); }

  static Leaf* allocate(std::size_t n) noexcept {
    void* p = ::operator new(sizeof(Leaf) + n * sizeof(Entry), std::nothrow);
    if (p == nullptr) return nullptr;
    auto* l = new (p) Leaf;
    l->kind = RetiredKind::kLeaf;
    l->size = n;
    return l;
  }
  static void release(Leaf* l) noexcept {
    l->~Leaf();
    ::operator delete(l);
  }
  // Number of entries whose start <= addr (the last of them is the floor entry).
  std::size_t upper(std::uintptr_t addr) const noexcept {
    std::size_t lo = 0, hi = size;
    const Entry* e = entries();
    while (lo < hi) {
      const std::size_t mid = (lo + hi) / 2;
      if (e[mid].start <= addr) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
};

struct TopSlot {
  std::uintptr_t key;
  std::atomic<Leaf*> leaf;  // replaced by writers (release); readers load it with acquire
};

struct Top : Retired {
  std::size_t size = 0;  // leaves, at least 1
  TopSlot* slots() noexcept { return reinterpret_cast<TopSlot*>(this + 1); }
  const TopSlot* slots() const noexcept { return reinterpret_cast<const TopSlot*>(this + 1); }

  static Top* allocate(std::size_t n) noexcept {
    void* p = ::operator new(sizeof(Top) + n * sizeof(TopSlot), std::nothrow);
    if (p == nullptr) return nullptr;
    auto* t = new (p) Top;
    t->kind = RetiredKind::kTop;
    t->size = n;
    for (std::size_t i = 0; i < n; ++i) new (&t->slots()[i]) TopSlot{0, {nullptr}};
    return t;
  }
  static void release(Top* t) noexcept {
    t->~Top();
    ::operator delete(t);
  }
  Leaf* leaf(std::size_t i) const noexcept {
    return slots()[i].leaf.load(std::memory_order_acquire);
  }
  // The leaf whose key range holds addr.
  std::size_t leafFor(std::uintptr_t addr) const noexcept {
    std::size_t lo = 1, hi = size;  // key 0 is 0 <= addr
    const TopSlot* s = slots();
    while (lo < hi) {
      const std::size_t mid = (lo + hi) / 2;
      if (s[mid].key <= addr) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo - 1;
  }
  // The entry with the greatest start <= addr, or null. Safe for readers inside an epoch.
  const Entry* floor(std::uintptr_t addr) const noexcept {
    const std::size_t i = leafFor(addr);
    const Leaf* l = leaf(i);
    const std::size_t k = l->upper(addr);
    if (__builtin_expect(k != 0, 1)) return &l->entries()[k - 1];
    if (i == 0) return nullptr;
    const Leaf* prev = leaf(i - 1);  // never empty when there is more than one leaf
    return prev->size != 0 ? &prev->entries()[prev->size - 1] : nullptr;
  }
};

static_assert(sizeof(Leaf) % alignof(Entry) == 0);
static_assert(sizeof(Top) % alignof(TopSlot) == 0);

// The empty index: one empty leaf. Shared by every cache, never written to nor freed: a writer that
// finds it current publishes a new Top instead of replacing its leaf.
constinit Leaf g_empty_leaf;
struct EmptyIndex {
  Top top;
  TopSlot slot;
  constexpr EmptyIndex() : slot{0, {&g_empty_leaf}} {
    top.kind = RetiredKind::kTop;
    top.size = 1;
  }
};
constinit EmptyIndex g_empty_index;
static_assert(sizeof(EmptyIndex) == sizeof(Top) + sizeof(TopSlot), "slot must follow top");
Top* const g_empty_top = &g_empty_index.top;

// State word of a region: holders in the low 32 bits, flags above.
constexpr std::uint64_t kHolderMask = 0xffffffffull;
constexpr std::uint64_t kInvalid = 1ull << 32;  // out of the index; never handed out again

enum class DoomReason : std::uint8_t { kInvalidated, kMerged, kEvicted, kStale };

class alignas(kCacheLine) RegionImpl final : public Region, public Retired {
 public:
  RegionImpl(std::uintptr_t start, std::uintptr_t end, unsigned access, MemType type,
             Backend* backend, const Registration& reg) noexcept {
    start_ = start;
    end_ = end;
    access_ = access;
    mem_type_ = type;
    backend_ = backend;
    reg_ = reg;
    kind = RetiredKind::kRegion;
  }
  ~RegionImpl() = default;

  // Take a reference unless the region is invalid. *prev_holders receives the count before.
  bool tryAcquire(std::uint64_t* prev_holders) noexcept {
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    do {
      if ((s & kInvalid) != 0 || (s & kHolderMask) == kHolderMask) return false;
    } while (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                           std::memory_order_relaxed));
    *prev_holders = s & kHolderMask;
    return true;
  }
  bool matches(unsigned access, MemType type, const Backend* backend) const noexcept {
    return (access_ & access) == access && mem_type_ == type && backend_ == backend;
  }

  std::atomic<std::uint64_t> state_{1};      // created held by its requester
  std::atomic<std::uint64_t> last_used_{0};  // release tick (see CacheImpl::releaseTick)
  std::uint32_t fork_gen_ = 0;               // the cache's fork generation when registered
  // Guarded by lock_:
  std::uint32_t heap_pos_ = kNotInHeap;  // position in CacheImpl::lru_ (valid indexed regions)
  RegionImpl* next_dead_ = nullptr;      // dead_ / zombies_ list, or evictOne_locked()'s skip list
  RegionImpl* next_unindex_ = nullptr;   // unindex_ list: invalid, entry still in a leaf
  bool in_index_ = false;                // an entry of the published index points here

  static constexpr std::uint32_t kNotInHeap = UINT32_MAX;
};

static_assert(sizeof(RegionImpl) == 2 * kCacheLine);

inline std::size_t retiredBytes(const Retired* x) noexcept {
  switch (x->kind) {
    case RetiredKind::kRegion:
      return sizeof(RegionImpl);
    case RetiredKind::kLeaf:
      return sizeof(Leaf) + static_cast<const Leaf*>(x)->size * sizeof(Entry);
    case RetiredKind::kTop:
      return sizeof(Top) + static_cast<const Top*>(x)->size * sizeof(TopSlot);
  }
  return 0;
}

// Unused-region order for eviction: a binary min-heap of the valid indexed regions keyed by a
// release tick, maintained by writers only (the hit path and put() never touch it). A key may be
// stale: put() stores a newer tick in the region without telling the heap. evictOne_locked() pops
// the minimum, and when the region's tick moved on it re-keys it and looks again, so the victim is
// the unused region with the smallest tick. Positions live in RegionImpl::heap_pos_.
// Thread safety: lock_ only. remove() and update() never allocate (invalidate() may call them).
class LruHeap {
 public:
  struct Item {
    std::uint64_t key;
    RegionImpl* region;
  };
  LruHeap() = default;
  ~LruHeap() { delete[] items_; }
  LruHeap(const LruHeap&) = delete;
  LruHeap& operator=(const LruHeap&) = delete;

  std::size_t size() const noexcept { return size_; }
  const Item& top() const noexcept { return items_[0]; }
  // Room for one more push(). False on no memory or past 2^32 - 1 regions.
  bool reserveOne() noexcept {
    if (size_ < cap_) return true;
    if (cap_ >= RegionImpl::kNotInHeap - 1) return false;
    const std::size_t cap =
        std::min<std::size_t>(std::max<std::size_t>(64, cap_ * 2), RegionImpl::kNotInHeap - 1);
    auto* items = new (std::nothrow) Item[cap];
    if (items == nullptr) return false;
    std::copy(items_, items_ + size_, items);
    delete[] items_;
    items_ = items;
    cap_ = cap;
    return true;
  }
  void push(RegionImpl* r, std::uint64_t key) noexcept {  // after reserveOne()
    items_[size_] = Item{key, r};
    r->heap_pos_ = static_cast<std::uint32_t>(size_);
    ++size_;
    up(size_ - 1);
  }
  void remove(RegionImpl* r) noexcept {
    const std::size_t i = r->heap_pos_;
    if (i >= size_ || items_[i].region != r) return;
    r->heap_pos_ = RegionImpl::kNotInHeap;
    --size_;
    if (i == size_) return;
    place(i, items_[size_]);
    if (!up(i)) down(i);
  }
  void update(RegionImpl* r, std::uint64_t key) noexcept {
    const std::size_t i = r->heap_pos_;
    if (i >= size_ || items_[i].region != r) return;
    items_[i].key = key;
    if (!up(i)) down(i);
  }
  // Forgets every item without touching the regions (fork child: they are orphans).
  void clear() noexcept { size_ = 0; }

 private:
  void place(std::size_t i, const Item& it) noexcept {
    items_[i] = it;
    it.region->heap_pos_ = static_cast<std::uint32_t>(i);
  }
  bool up(std::size_t i) noexcept {
    const Item it = items_[i];
    const std::size_t start = i;
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (items_[parent].key <= it.key) break;
      place(i, items_[parent]);
      i = parent;
    }
    place(i, it);
    return i != start;
  }
  void down(std::size_t i) noexcept {
    const Item it = items_[i];
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= size_) break;
      if (c + 1 < size_ && items_[c + 1].key < items_[c].key) ++c;
      if (it.key <= items_[c].key) break;
      place(i, items_[c]);
      i = c;
    }
    place(i, it);
  }

  Item* items_ = nullptr;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

// One per thread (by threadIndex()) and cache: the reader's epoch and its private counters.
struct alignas(kCacheLine) ReaderSlot {
  std::atomic<std::uint64_t> epoch{0};        // 0: not reading; else the global epoch at entry
  std::atomic<std::uint64_t> hits{0};         // written by the owning thread only
  std::atomic<std::int64_t> unused_delta{0};  // owner only; flushed to unused_shared_ past a bound
  std::atomic<std::uint64_t> lru_seq{0};      // owner only: this thread's last release tick
};

constexpr std::size_t kSlotsPerChunk = 64;
constexpr std::size_t kMaxChunks = detail::kMaxThreads / kSlotsPerChunk;

struct SlotChunk {
  ReaderSlot slot[kSlotsPerChunk];
};

constexpr std::size_t kRingCapacity =
    1024;                             // queued invalidations before the conservative fallback
constexpr std::size_t kHistory = 64;  // applied invalidations remembered for in-flight misses

// Adds `d` to a counter that only writers (under lock_) or a single owner modify; readers may load.
template <typename T>
inline void bump(std::atomic<T>& a, T d) noexcept {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

class CacheImpl;

// Live caches, for the fork handlers.
struct CacheRegistry {
  std::mutex mutex;
  CacheImpl* head = nullptr;
};
CacheRegistry& cacheRegistry() {
  static auto* r = new CacheRegistry;
  return *r;
}

std::atomic<std::uint64_t> g_next_cache_id{1};

// The calling thread's reader slot in the cache it used last (caches have unique ids).
struct TlsSlot {
  std::uint64_t cache_id;
  ReaderSlot* slot;
};
__attribute__((tls_model("initial-exec"))) thread_local TlsSlot tls_slot{0, nullptr};

class CacheImpl final : public Cache {
 public:
  explicit CacheImpl(const Config& config) noexcept;
  ~CacheImpl() override;

  Status get(const void* address, std::size_t length, unsigned access, MemType type,
             Backend* backend, Region** region) noexcept override;
  void put(Region* region) noexcept override;
  bool find(const void* address, std::size_t length, unsigned access,
            Region** region) noexcept override;
  void invalidate(const void* address, std::size_t length) noexcept override;
  void progress() noexcept override;
  Stats stats() const noexcept override;
  const Config& config() const noexcept override { return config_; }

  // Fork handlers (cache registry locked; see atfork* below).
  void forkPrepare() noexcept { lock_.lock(); }
  void forkParent() noexcept { lock_.unlock(); }
  void forkChild() noexcept;

  CacheImpl* reg_next_ = nullptr;  // cache registry links, guarded by CacheRegistry::mutex
  CacheImpl* reg_prev_ = nullptr;

 private:
  struct Request {
    std::uintptr_t start;
    std::uintptr_t end;
  };

  Status checkRequest(const void* address, std::size_t length, unsigned access,
                      const Backend* backend, Region* const* region, Request* rq) const noexcept;
  bool fastHit(const Request& rq, unsigned access, MemType type, const Backend* backend,
               bool any_kind, Region** region) noexcept;
  Status getSlow(const Request& rq, unsigned access, MemType type, Backend* backend,
                 Region** out) noexcept;
  ReaderSlot* readerSlot(int index) noexcept;
  // Calls f(ReaderSlot&) for every slot a thread may use.
  template <typename F>
  void forEachSlot(F f) const noexcept {
    const std::size_t lim = slot_limit_.load(std::memory_order_seq_cst);
    for (std::size_t ci = 0; ci * kSlotsPerChunk < lim; ++ci) {
      SlotChunk* c = chunks_[ci].load(std::memory_order_seq_cst);
      if (c == nullptr) continue;
      const std::size_t n = std::min(kSlotsPerChunk, lim - ci * kSlotsPerChunk);
      for (std::size_t k = 0; k < n; ++k) f(c->slot[k]);
    }
  }
  // The calling thread's slot in this cache (null past kMaxThreads threads or on no memory).
  ReaderSlot* mySlot() noexcept {
    if (__builtin_expect(tls_slot.cache_id == id_, 1)) return tls_slot.slot;
    return mySlotSlow();
  }
  ReaderSlot* mySlotSlow() noexcept;
  void addUnused(ReaderSlot* slot, std::int64_t delta) noexcept {
    if (slot != nullptr) {
      const std::int64_t v = slot->unused_delta.load(std::memory_order_relaxed) + delta;
      if (__builtin_expect(v <= unused_flush_bound_ && v >= -unused_flush_bound_, 1)) {
        slot->unused_delta.store(v, std::memory_order_relaxed);
        return;
      }
    }
    flushUnused(slot, delta);
  }
  void flushUnused(ReaderSlot* slot, std::int64_t delta) noexcept;
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
  Top* current_locked() const noexcept { return index_.load(std::memory_order_relaxed); }
  // Calls f(const Entry&) for every entry (valid or not) overlapping [start, end), in order. f
  // must not change the index.
  template <typename F>
  void forEachOverlap_locked(std::uintptr_t start, std::uintptr_t end, F f) const noexcept;
  void applyQueued_locked(bool wait = true) noexcept;
  void applyInvalidation_locked(Range r) noexcept;
  bool invalidatedSince_locked(std::uint64_t seq0, Range r) const noexcept;
  bool markInvalid_locked(RegionImpl* r, DoomReason why) noexcept;
  void leaveIndex_locked(RegionImpl* r) noexcept;
  void doomUnused_locked(RegionImpl* r, DoomReason why) noexcept;
  bool evictOne_locked() noexcept;
  bool makeRoom_locked(std::size_t bytes) noexcept;
  void enforceUnused_locked() noexcept;
  std::size_t evictAllUnused_locked() noexcept;
  void pushDead_locked(RegionImpl* r) noexcept;
  RegionImpl* takeDead_locked() noexcept;
  void setWork_locked(bool on) noexcept;
  bool rewriteLeaf_locked(std::size_t i, RegionImpl* add, RegionImpl* drop) noexcept;
  bool replaceLeaves_locked(std::size_t first, std::size_t count, Leaf* const* leaves,
                            const std::uintptr_t* keys, std::size_t n) noexcept;
  bool insert_locked(RegionImpl* r) noexcept;
  bool purge_locked() noexcept;
  void retire_locked(Retired* x) noexcept;
  void retireRegions_locked(RegionImpl* list) noexcept;
  Retired* collect_locked(bool force = false) noexcept;

  void finishWork(bool force_collect = false) noexcept;
  void releaseInvalid(RegionImpl* r) noexcept;
  void deregister(RegionImpl* r) noexcept;
  static void freeList(Retired* list) noexcept;

  const Config config_;
  const std::uint64_t id_ = g_next_cache_id.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t unused_flush_bound_;

  // Read on every get(): queued invalidations (low 32 bits) + kWorkBit while deregistrations wait.
  alignas(kCacheLine) std::atomic<std::uint64_t> attention_{0};
  std::atomic<Top*> index_{nullptr};
  std::atomic<std::uint64_t> epoch_{1};
  std::atomic<std::uint64_t> lru_clock_{1};
  std::atomic<std::size_t> slot_limit_{0};  // slots [0, slot_limit_) may have been handed out
  std::atomic<SlotChunk*> chunks_[kMaxChunks] = {};
  static constexpr std::uint64_t kWorkBit = 1ull << 32;

  alignas(kCacheLine) WriterLock lock_;
  detail::RangeRing<kRingCapacity> ring_;
  std::atomic<std::uint64_t> ring_overflow_{0};  // pushes that found ring_ full, not yet applied

  // Guarded by lock_.
  RegionImpl* dead_ = nullptr;     // unused invalid regions waiting for deregistration
  RegionImpl* zombies_ = nullptr;  // deregistered, still in the index (a leaf rewrite failed)
  RegionImpl* unindex_ = nullptr;  // invalid regions whose entries are still in a leaf
  LruHeap lru_;                    // valid indexed regions by release tick
  Retired* garbage_ = nullptr;     // waiting for readers to leave their epoch
  std::size_t garbage_count_ = 0;
  std::size_t garbage_bytes_ = 0;
  // A collection pass costs a membarrier() (~0.4 us): batch it, bounded in memory.
  static constexpr std::size_t kCollectBatch = 128;
  static constexpr std::size_t kCollectBytes = std::size_t{1} << 20;
  bool retired_since_advance_ = false;
  bool dirty_ = false;                      // unindex_ is not empty
  bool work_flag_ = false;                  // mirrors kWorkBit in attention_
  std::atomic<std::uint32_t> fork_gen_{0};  // bumped in a fork child (single-threaded there)
  std::uint64_t inval_seq_ = 0;             // invalidations applied so far
  Range history_[kHistory];                 // the last kHistory of them

  // Counters; writers update them, stats() reads them from any thread.
  std::atomic<std::uint64_t> slow_hits_{0}, misses_{0}, merges_{0}, evictions_{0};
  std::atomic<std::uint64_t> inval_in_use_{0}, inval_unused_{0}, deferred_{0}, overflows_{0};
  std::atomic<std::int64_t> regions_{0}, pinned_{0};  // indexed or held (or being registered)
  std::atomic<std::int64_t> unused_shared_{0};        // plus the readers' unused_delta
};

CacheImpl::CacheImpl(const Config& config) noexcept
    : config_(config),
      unused_flush_bound_(static_cast<std::int64_t>(
          std::min<std::size_t>(config.max_unused_bytes / 8, std::size_t{64} << 20))) {
  index_.store(g_empty_top, std::memory_order_relaxed);
  CacheRegistry& reg = cacheRegistry();
  std::lock_guard<std::mutex> g(reg.mutex);
  reg_next_ = reg.head;
  if (reg.head != nullptr) reg.head->reg_prev_ = this;
  reg.head = this;
}

CacheImpl::~CacheImpl() {
  {
    CacheRegistry& reg = cacheRegistry();
    std::lock_guard<std::mutex> g(reg.mutex);
    if (reg_prev_ != nullptr) {
      reg_prev_->reg_next_ = reg_next_;
    } else {
      reg.head = reg_next_;
    }
    if (reg_next_ != nullptr) reg_next_->reg_prev_ = reg_prev_;
  }
  finishWork();
  // The contract says nothing is held and nobody calls in any more. Deregister what is left.
  Top* top;
  {
    WriterGuard g(lock_);
    top = current_locked();
    index_.store(g_empty_top, std::memory_order_relaxed);
  }
  std::size_t held = 0;
  for (std::size_t i = 0; i < top->size; ++i) {
    Leaf* leaf = top->leaf(i);
    for (std::size_t k = 0; k < leaf->size; ++k) {
      RegionImpl* r = leaf->entries()[k].region;
      const std::uint64_t s = r->state_.load(std::memory_order_acquire);
      if ((s & kInvalid) != 0) continue;  // owned by a holder (a contract breach) or a zombie
      if ((s & kHolderMask) != 0) ++held;
      deregister(r);
      delete r;
    }
    if (leaf != &g_empty_leaf) Leaf::release(leaf);
  }
  for (RegionImpl* z = zombies_; z != nullptr;) {
    RegionImpl* next = z->next_dead_;
    delete z;
    z = next;
  }
  if (held != 0) logf(LogLevel::kWarn, "cache destroyed with %zu regions still held", held);
  if (top != g_empty_top) Top::release(top);
  freeList(garbage_);
  garbage_ = nullptr;
  for (auto& c : chunks_) delete c.load(std::memory_order_relaxed);
}

__attribute__((noinline, cold)) Status CacheImpl::checkRequest(const void* address,
                                                               std::size_t length, unsigned access,
                                                               const Backend* backend,
                                                               Region* const* region,
                                                               Request* rq) const noexcept {
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  if (region == nullptr || backend == nullptr) {
    logf(LogLevel::kError, "get(%p, %zu): null %s", address, length,
         region == nullptr ? "region output" : "backend");
    return Status::kInvalidParam;
  }
  if (length == 0 || length > kMaxRequestLength) {
    logf(LogLevel::kError, "get(%p, %zu): %s length", address, length,
         length == 0 ? "zero" : "absurd");
    return Status::kInvalidParam;
  }
  if ((access & ~static_cast<unsigned>(kAccessAll)) != 0) {
    logf(LogLevel::kError, "get(%p, %zu): unknown access bits 0x%x", address, length, access);
    return Status::kInvalidParam;
  }
  const std::uintptr_t mask = config_.alignment - 1;
  std::uintptr_t last;
  if (__builtin_add_overflow(addr, length - 1, &last) || last > UINTPTR_MAX - mask) {
    logf(LogLevel::kError, "get(%p, %zu): range wraps around the address space", address, length);
    return Status::kInvalidParam;
  }
  rq->start = addr & ~mask;
  rq->end = (last | mask) + 1;  // may be 0 only if the range reaches the very top; excluded above
  if (rq->end == 0) return Status::kInvalidParam;
  if (rq->end - rq->start > config_.max_pinned_bytes) {
    logf(LogLevel::kError, "get(%p, %zu): %zu aligned bytes exceed max_pinned_bytes %zu", address,
         length, static_cast<std::size_t>(rq->end - rq->start), config_.max_pinned_bytes);
    return Status::kExceedsLimit;
  }
  return Status::kOk;
}

ReaderSlot* CacheImpl::readerSlot(int index) noexcept {
  const auto ci = static_cast<std::size_t>(index) / kSlotsPerChunk;
  SlotChunk* c = chunks_[ci].load(std::memory_order_acquire);
  if (__builtin_expect(c == nullptr, 0)) {
    auto* fresh = new (std::nothrow) SlotChunk;
    if (fresh == nullptr) return nullptr;
    if (chunks_[ci].compare_exchange_strong(c, fresh, std::memory_order_seq_cst)) {
      c = fresh;
    } else {
      delete fresh;
    }
  }
  // Published before the thread first uses the slot, so that writers scan it.
  const auto want = static_cast<std::size_t>(index) + 1;
  std::size_t lim = slot_limit_.load(std::memory_order_relaxed);
  while (lim < want && !slot_limit_.compare_exchange_weak(lim, want, std::memory_order_seq_cst)) {
  }
  return &c->slot[static_cast<std::size_t>(index) % kSlotsPerChunk];
}

__attribute__((noinline)) ReaderSlot* CacheImpl::mySlotSlow() noexcept {
  const int ti = threadIndex();
  ReaderSlot* s = ti >= 0 ? readerSlot(ti) : nullptr;
  if (s != nullptr) tls_slot = TlsSlot{id_, s};
  return s;
}

// The slot's delta passed its bound (or there is no slot): move it to the shared counter.
__attribute__((noinline)) void CacheImpl::flushUnused(ReaderSlot* slot,
                                                      std::int64_t delta) noexcept {
  std::int64_t v = delta;
  if (slot != nullptr) {
    v += slot->unused_delta.load(std::memory_order_relaxed);
    slot->unused_delta.store(0, std::memory_order_relaxed);
  }
  const std::int64_t total = unused_shared_.fetch_add(v, std::memory_order_relaxed) + v;
  if (delta > 0 && total > static_cast<std::int64_t>(config_.max_unused_bytes)) {
    // Over the unused limit: have the next caller (or this put) evict.
    WriterGuard g(lock_);
    setWork_locked(true);
  }
}

void CacheImpl::advanceLruClock_locked() noexcept {
  std::uint64_t m = lru_clock_.load(std::memory_order_relaxed);
  forEachSlot(
      [&](const ReaderSlot& s) { m = std::max(m, s.lru_seq.load(std::memory_order_relaxed)); });
  lru_clock_.store(m + 1, std::memory_order_relaxed);
}

std::int64_t CacheImpl::unusedExact() const noexcept {
  std::int64_t sum = unused_shared_.load(std::memory_order_relaxed);
  forEachSlot([&](const ReaderSlot& s) { sum += s.unused_delta.load(std::memory_order_relaxed); });
  return sum;
}

// ---------------------------------------------------------------------------------------------------
// Hit path

Status CacheImpl::get(const void* address, std::size_t length, unsigned access, MemType type,
                      Backend* backend, Region** region) noexcept {
  Request rq;
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t mask = config_.alignment - 1;
  std::uintptr_t last;
  // One test for the common case; checkRequest() tells what is wrong otherwise.
  if (__builtin_expect(
          length - 1 >= kMaxRequestLength || (access & ~static_cast<unsigned>(kAccessAll)) != 0 ||
              backend == nullptr || region == nullptr ||
              __builtin_add_overflow(addr, length - 1, &last) || last >= UINTPTR_MAX - mask ||
              (last | mask) - (addr & ~mask) >= config_.max_pinned_bytes,
          0)) {
    const Status st = checkRequest(address, length, access, backend, region, &rq);
    if (st != Status::kOk) return st;
  } else {
    rq.start = addr & ~mask;
    rq.end = (last | mask) + 1;
  }
  if (fastHit(rq, access, type, backend, false, region)) return Status::kOk;
  return getSlow(rq, access, type, backend, region);
}

// The lock-free hit: a valid region covering rq with `access` (and, unless any_kind, registered as
// `type` through `backend`), acquired. False when there is none or pending work must run first.
inline bool CacheImpl::fastHit(const Request& rq, unsigned access, MemType type,
                               const Backend* backend, bool any_kind, Region** region) noexcept {
  ReaderSlot* slot = mySlot();
  if (__builtin_expect(slot == nullptr || attention_.load(std::memory_order_acquire) != 0, 0)) {
    return false;
  }
  readerEnter(slot->epoch, epoch_.load(std::memory_order_acquire));
  const Entry* e = index_.load(std::memory_order_seq_cst)->floor(rq.start);
  bool hit = false;
  std::uint64_t prev = 0;
  RegionImpl* r = nullptr;
  if (e != nullptr && e->end >= rq.end) {
    r = e->region;
    hit = (any_kind ? (r->access() & access) == access : r->matches(access, type, backend)) &&
          r->tryAcquire(&prev);
  }
  slot->epoch.store(0, std::memory_order_release);
  if (!hit) return false;
  bump(slot->hits, std::uint64_t{1});
  if (prev == 0) addUnused(slot, -static_cast<std::int64_t>(r->length()));
  *region = r;
  return true;
}

bool CacheImpl::find(const void* address, std::size_t length, unsigned access,
                     Region** region) noexcept {
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t mask = config_.alignment - 1;
  std::uintptr_t last;
  if (length - 1 >= kMaxRequestLength || (access & ~static_cast<unsigned>(kAccessAll)) != 0 ||
      region == nullptr || __builtin_add_overflow(addr, length - 1, &last) ||
      last >= UINTPTR_MAX - mask) {
    return false;
  }
  const Request rq{addr & ~mask, (last | mask) + 1};
  return fastHit(rq, access, MemType::kHost, nullptr, true, region);
}

void CacheImpl::put(Region* region) noexcept {
  if (region == nullptr) {
    logf(LogLevel::kError, "put(nullptr)");
    return;
  }
  auto* r = static_cast<RegionImpl*>(region);
  const auto len = static_cast<std::int64_t>(r->length());
  ReaderSlot* slot = mySlot();
  r->last_used_.store(releaseTick(slot), std::memory_order_relaxed);
  const std::uint64_t prev = r->state_.fetch_sub(1, std::memory_order_acq_rel);
  if (__builtin_expect((prev & kHolderMask) == 1, 1)) {
    // The last holder. A valid region stays cached (unused); an invalid one is ours to deregister.
    if ((prev & kInvalid) == 0) {
      addUnused(slot, len);
    } else {
      releaseInvalid(r);
    }
  } else if ((prev & kHolderMask) == 0) {
    r->state_.fetch_add(1, std::memory_order_relaxed);
    logf(LogLevel::kError, "put(%p): region is not held", static_cast<void*>(r));
    return;
  }
  if (attention_.load(std::memory_order_acquire) != 0) finishWork();
}

// ---------------------------------------------------------------------------------------------------
// Miss path

__attribute__((noinline)) Status CacheImpl::getSlow(const Request& rq, unsigned access,
                                                    MemType type, Backend* backend,
                                                    Region** out) noexcept {
  RegionImpl* hit = nullptr;
  Range want{rq.start, rq.end};
  unsigned want_access = access;
  std::uint64_t seq0 = 0;
  Status st = Status::kOk;
  {
    WriterGuard g(lock_);
    applyQueued_locked();
    std::uint64_t prev = 0;
    const Entry* e = current_locked()->floor(rq.start);
    if (e != nullptr && e->end >= rq.end) {
      RegionImpl* r = e->region;
      if (r->matches(access, type, backend) && r->tryAcquire(&prev)) hit = r;
    }
    if (hit != nullptr) {
      bump(slow_hits_, std::uint64_t{1});
      if (prev == 0) {
        unused_shared_.fetch_sub(static_cast<std::int64_t>(hit->length()),
                                 std::memory_order_relaxed);
      }
    } else {
      // Rule 3: the new registration covers the union of the overlapping valid regions.
      forEachOverlap_locked(rq.start, rq.end, [&](const Entry& o) {
        RegionImpl* r = o.region;
        if ((r->state_.load(std::memory_order_relaxed) & kInvalid) != 0) return;
        if (r->memType() != type || r->backend() != backend) return;
        want.start = std::min(want.start, o.start);
        want.end = std::max(want.end, o.end);
        want_access |= r->access();
      });
      if (want.end - want.start > config_.max_pinned_bytes) want = {rq.start, rq.end};
      advanceLruClock_locked();
      if (!makeRoom_locked(want.end - want.start)) {
        st = Status::kNoResource;
      } else {
        regions_.fetch_add(1, std::memory_order_relaxed);
        pinned_.fetch_add(static_cast<std::int64_t>(want.end - want.start),
                          std::memory_order_relaxed);
        seq0 = inval_seq_;
      }
    }
  }
  if (attention_.load(std::memory_order_acquire) != 0) finishWork();
  if (hit != nullptr) {
    *out = hit;
    return Status::kOk;
  }
  if (st != Status::kOk) {
    logf(LogLevel::kError,
         "register [0x%zx, 0x%zx): region limits reached (max_regions %zu, max_pinned_bytes %zu) "
         "and every region is in use",
         static_cast<std::size_t>(rq.start), static_cast<std::size_t>(rq.end), config_.max_regions,
         config_.max_pinned_bytes);
    return st;
  }

  const std::size_t len = want.end - want.start;
  auto unreserve = [&] {
    regions_.fetch_sub(1, std::memory_order_relaxed);
    pinned_.fetch_sub(static_cast<std::int64_t>(len), std::memory_order_relaxed);
  };
  Registration reg{};
  st = backend->reg(want.start, len, want_access, type, &reg);
  if (st == Status::kNoResource) {
    // Rule 6: evict every unused region, then retry once.
    std::size_t evicted;
    {
      WriterGuard g(lock_);
      evicted = evictAllUnused_locked();
    }
    finishWork();
    logf(LogLevel::kDebug, "backend out of resources: evicted %zu unused regions, retrying",
         evicted);
    st = backend->reg(want.start, len, want_access, type, &reg);
  }
  if (st != Status::kOk) {
    unreserve();
    logf(LogLevel::kError, "%s: registering [0x%zx, 0x%zx) failed: %s", backend->name(),
         static_cast<std::size_t>(want.start), static_cast<std::size_t>(want.end),
         statusString(st));
    return st;
  }
  auto* nr = new (std::nothrow) RegionImpl(want.start, want.end, want_access, type, backend, reg);
  if (nr == nullptr) {
    backend->dereg(reg);
    unreserve();
    logf(LogLevel::kError, "no memory for a region");
    return Status::kNoMemory;
  }
  nr->fork_gen_ = fork_gen_.load(std::memory_order_relaxed);
  misses_.fetch_add(1, std::memory_order_relaxed);
  Retired* freeable = nullptr;
  {
    WriterGuard g(lock_);
    applyQueued_locked();
    if (invalidatedSince_locked(seq0, want)) {
      // The memory changed while we registered it. The caller asked before the invalidation
      // completed, so it may use this registration, but nobody else will: it never enters the
      // index.
      nr->state_.store(1 | kInvalid, std::memory_order_relaxed);
      bump(inval_in_use_, std::uint64_t{1});
      bump(deferred_, std::uint64_t{1});
    } else {
      bool merged = false;
      forEachOverlap_locked(want.start, want.end, [&](const Entry& o) {
        RegionImpl* r = o.region;
        const bool same = r->memType() == type && r->backend() == backend;
        if (markInvalid_locked(r, same ? DoomReason::kMerged : DoomReason::kStale)) {
          merged = merged || same;
        }
      });
      if (merged) bump(merges_, std::uint64_t{1});
      if (!insert_locked(nr)) {
        nr->state_.store(1 | kInvalid, std::memory_order_relaxed);  // usable, never indexed
        bump(deferred_, std::uint64_t{1});
      }
      enforceUnused_locked();
    }
    freeable = collect_locked();
  }
  freeList(freeable);
  if (attention_.load(std::memory_order_acquire) != 0) finishWork();
  *out = nr;
  return Status::kOk;
}

// ---------------------------------------------------------------------------------------------------
// Invalidation

void CacheImpl::invalidate(const void* address, std::size_t length) noexcept {
  if (length == 0) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t mask = config_.alignment - 1;
  Range r{addr & ~mask, UINTPTR_MAX};
  std::uintptr_t last;
  if (!__builtin_add_overflow(addr, length - 1, &last) && last <= UINTPTR_MAX - mask) {
    r.end = (last | mask) + 1;
  }
  attention_.fetch_add(1, std::memory_order_seq_cst);
  if (!ring_.push(r)) ring_overflow_.fetch_add(1, std::memory_order_seq_cst);
  if (lock_.try_lock()) {
    applyQueued_locked(/*wait=*/false);
    lock_.unlock();
  }
}

// With `wait`, also waits for producers that claimed a cell but have not filled it in yet: the
// queue is FIFO, so a completed invalidate() may sit behind one still in progress, and a lookup
// must not start before it is applied. invalidate() itself never waits (it may interrupt such a
// producer).
void CacheImpl::applyQueued_locked(bool wait) noexcept {
  std::uint64_t n = 0;
  Range r;
  for (;;) {
    if (ring_.pop(&r)) {
      applyInvalidation_locked(r);
      ++n;
    } else if (wait && ring_.claimed()) {
      std::this_thread::yield();
    } else {
      break;
    }
  }
  const std::uint64_t over = ring_overflow_.exchange(0, std::memory_order_acq_rel);
  if (over != 0) {
    applyInvalidation_locked(Range{0, UINTPTR_MAX});
    bump(overflows_, over);
    n += over;
  }
  if (n != 0) attention_.fetch_sub(n, std::memory_order_acq_rel);
}

void CacheImpl::applyInvalidation_locked(Range r) noexcept {
  history_[inval_seq_ % kHistory] = r;
  ++inval_seq_;
  forEachOverlap_locked(r.start, r.end, [&](const Entry& e) {
    markInvalid_locked(e.region, DoomReason::kInvalidated);
  });
}

bool CacheImpl::invalidatedSince_locked(std::uint64_t seq0, Range r) const noexcept {
  if (inval_seq_ - seq0 > kHistory) return true;  // too many to tell: assume the worst
  for (std::uint64_t s = seq0; s < inval_seq_; ++s) {
    if (history_[s % kHistory].overlaps(r.start, r.end)) return true;
  }
  return false;
}

// Takes `r` out of the index (logically: its leaf is rewritten later, by purge_locked()). Returns
// false if it already was. An unused region goes to the dead list; a held one is deregistered by
// its last put(). Never allocates (invalidate() calls it).
bool CacheImpl::markInvalid_locked(RegionImpl* r, DoomReason why) noexcept {
  const std::uint64_t prev = r->state_.fetch_or(kInvalid, std::memory_order_acq_rel);
  if ((prev & kInvalid) != 0) return false;
  leaveIndex_locked(r);
  if ((prev & kHolderMask) == 0) {
    doomUnused_locked(r, why);
  } else {
    bump(deferred_, std::uint64_t{1});
    if (why == DoomReason::kInvalidated || why == DoomReason::kStale) {
      bump(inval_in_use_, std::uint64_t{1});
    }
  }
  return true;
}

// Bookkeeping for a region that just became invalid with no holder: it leaves the counters and
// waits on the dead list for deregistration outside lock_.
// `r` just became invalid: it leaves the eviction heap, and its entry is queued for purge_locked().
void CacheImpl::leaveIndex_locked(RegionImpl* r) noexcept {
  lru_.remove(r);
  if (r->in_index_) {
    r->next_unindex_ = unindex_;
    unindex_ = r;
    dirty_ = true;
  }
}

void CacheImpl::doomUnused_locked(RegionImpl* r, DoomReason why) noexcept {
  const auto len = static_cast<std::int64_t>(r->length());
  unused_shared_.fetch_sub(len, std::memory_order_relaxed);
  regions_.fetch_sub(1, std::memory_order_relaxed);
  pinned_.fetch_sub(len, std::memory_order_relaxed);
  switch (why) {
    case DoomReason::kEvicted:
      bump(evictions_, std::uint64_t{1});
      break;
    case DoomReason::kInvalidated:
    case DoomReason::kStale:
      bump(inval_unused_, std::uint64_t{1});
      break;
    case DoomReason::kMerged:
      break;
  }
  pushDead_locked(r);
}

// ---------------------------------------------------------------------------------------------------
// Eviction (rule 6): least recently released unused region first.

// Pops the heap until its minimum is an unused region whose key is its current release tick (the
// oldest, as every key is at most its region's tick but for the case in docs/rcache.md, "LRU").
// Held regions are set aside and come back keyed by the current clock: they are released later.
// Costs O(log n), plus O(log n) per held region met on the way.
bool CacheImpl::evictOne_locked() noexcept {
  RegionImpl* skipped = nullptr;  // linked by next_dead_ (valid regions are on no dead list)
  bool evicted = false;
  while (lru_.size() != 0) {
    const LruHeap::Item top = lru_.top();
    RegionImpl* r = top.region;
    const std::uint64_t state = r->state_.load(std::memory_order_acquire);
    if ((state & kInvalid) != 0) {  // cannot happen: invalid regions leave the heap at once
      lru_.remove(r);
      continue;
    }
    if ((state & kHolderMask) != 0) {
      lru_.remove(r);
      r->next_dead_ = skipped;
      skipped = r;
      continue;
    }
    const std::uint64_t tick = r->last_used_.load(std::memory_order_relaxed);
    if (tick > top.key) {  // released again since it was keyed
      lru_.update(r, tick);
      continue;
    }
    std::uint64_t unused_valid = 0;
    if (r->state_.compare_exchange_strong(unused_valid, kInvalid, std::memory_order_acq_rel)) {
      leaveIndex_locked(r);
      doomUnused_locked(r, DoomReason::kEvicted);
      evicted = true;
      break;
    }
    // A reader took it meanwhile: it is held now, look again.
  }
  const std::uint64_t now = lru_clock_.load(std::memory_order_relaxed);
  while (skipped != nullptr) {
    RegionImpl* r = skipped;
    skipped = r->next_dead_;
    r->next_dead_ = nullptr;
    // Room is there: these items just left the heap. A region released meanwhile keeps its tick.
    const bool unused = (r->state_.load(std::memory_order_acquire) & kHolderMask) == 0;
    lru_.push(r, unused ? r->last_used_.load(std::memory_order_relaxed) : now);
  }
  return evicted;
}

bool CacheImpl::makeRoom_locked(std::size_t bytes) noexcept {
  auto over = [&] {
    const auto regions = static_cast<std::size_t>(std::max<std::int64_t>(0, regions_.load()));
    const auto pinned = static_cast<std::size_t>(std::max<std::int64_t>(0, pinned_.load()));
    return regions + 1 > config_.max_regions ||
           (config_.max_pinned_bytes != SIZE_MAX && pinned + bytes > config_.max_pinned_bytes);
  };
  while (over()) {
    if (!evictOne_locked()) return false;
  }
  return true;
}

void CacheImpl::enforceUnused_locked() noexcept {
  if (config_.max_unused_bytes == SIZE_MAX) return;
  while (unusedExact() > static_cast<std::int64_t>(config_.max_unused_bytes)) {
    if (!evictOne_locked()) break;
  }
}

std::size_t CacheImpl::evictAllUnused_locked() noexcept {
  std::size_t n = 0;
  while (evictOne_locked()) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------------------
// Dead regions, reclamation

void CacheImpl::pushDead_locked(RegionImpl* r) noexcept {
  r->next_dead_ = dead_;
  dead_ = r;
  setWork_locked(true);
}

RegionImpl* CacheImpl::takeDead_locked() noexcept {
  RegionImpl* d = dead_;
  dead_ = nullptr;
  setWork_locked(false);
  return d;
}

void CacheImpl::setWork_locked(bool on) noexcept {
  if (on == work_flag_) return;
  work_flag_ = on;
  if (on) {
    attention_.fetch_add(kWorkBit, std::memory_order_seq_cst);
  } else {
    attention_.fetch_sub(kWorkBit, std::memory_order_seq_cst);
  }
}

// ---------------------------------------------------------------------------------------------------
// Index writers. Every change publishes a consistent index: a leaf is built aside and stored into
// its Top slot, or a new Top is built and stored into index_; what it replaces is retired.

template <typename F>
void CacheImpl::forEachOverlap_locked(std::uintptr_t start, std::uintptr_t end,
                                      F f) const noexcept {
  const Top* top = current_locked();
  std::size_t i = top->leafFor(start);
  const Leaf* leaf = top->leaf(i);
  std::size_t k = leaf->upper(start);
  if (k != 0) {
    --k;  // the floor entry; it overlaps if it reaches past start
    if (leaf->entries()[k].end <= start) ++k;
  } else if (i != 0) {
    const Leaf* prev = top->leaf(i - 1);
    if (prev->size != 0 && prev->entries()[prev->size - 1].end > start) {
      f(prev->entries()[prev->size - 1]);
    }
  }
  for (; i < top->size; ++i, k = 0) {
    leaf = top->leaf(i);
    for (; k < leaf->size; ++k) {
      const Entry& e = leaf->entries()[k];
      if (e.start >= end) return;
      f(e);
    }
  }
}

// Publishes a Top in which leaves [first, first + count) are replaced by leaves[0, n) with keys
// keys[0, n) (key 0 is forced to 0). On success retires the old Top and the replaced leaves; on
// failure (no memory) changes nothing and the caller still owns `leaves`.
bool CacheImpl::replaceLeaves_locked(std::size_t first, std::size_t count, Leaf* const* leaves,
                                     const std::uintptr_t* keys, std::size_t n) noexcept {
  Top* cur = current_locked();
  const std::size_t size = cur->size - count + n;
  Top* next = size != 0 ? Top::allocate(size) : nullptr;
  if (size != 0 && next == nullptr) return false;
  if (next == nullptr) {  // the index becomes empty
    index_.store(g_empty_top, std::memory_order_seq_cst);
  } else {
    TopSlot* to = next->slots();
    const TopSlot* from = cur->slots();
    std::size_t j = 0;
    for (std::size_t i = 0; i < first; ++i, ++j) {
      to[j].key = from[i].key;
      to[j].leaf.store(from[i].leaf.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
    for (std::size_t i = 0; i < n; ++i, ++j) {
      to[j].key = keys[i];
      to[j].leaf.store(leaves[i], std::memory_order_relaxed);
    }
    for (std::size_t i = first + count; i < cur->size; ++i, ++j) {
      to[j].key = from[i].key;
      to[j].leaf.store(from[i].leaf.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
    to[0].key = 0;
    index_.store(next, std::memory_order_seq_cst);
  }
  for (std::size_t i = first; i < first + count; ++i) {
    Leaf* old = cur->leaf(i);
    if (old != &g_empty_leaf) retire_locked(old);
  }
  if (cur != g_empty_top) retire_locked(cur);
  return true;
}

// Rewrites leaf i with `add` (may be null; it must overlap no entry) and without the entries of
// `drop` (a list linked by next_unindex_, sorted by start, of regions whose entries are in this
// leaf), splitting a leaf that grows past kLeafMax and merging one that shrinks below kLeafMin
// into a neighbour. Only the regions of `add` and `drop` are looked at, never the others (in a big
// cache they are cold). Sets in_index_ of `add`, clears it for `drop`. On failure (no memory)
// changes nothing.
bool CacheImpl::rewriteLeaf_locked(std::size_t i, RegionImpl* add, RegionImpl* drop) noexcept {
  Top* top = current_locked();
  Leaf* old = top->leaf(i);
  // The entries of l but those of d (sorted), and `a` (may be null) in its place, into out;
  // returns their number.
  auto gather = [](const Leaf* l, RegionImpl* a, const RegionImpl* d, Entry* out) {
    std::size_t j = 0;
    for (std::size_t k = 0; k < l->size; ++k) {
      const Entry& e = l->entries()[k];
      if (a != nullptr && a->start() < e.start) {
        out[j++] = Entry{a->start(), a->end(), a};
        a = nullptr;
      }
      while (d != nullptr && d->start() < e.start) d = d->next_unindex_;
      if (d == e.region) {
        d = d->next_unindex_;
        continue;
      }
      out[j++] = e;
    }
    if (a != nullptr) out[j++] = Entry{a->start(), a->end(), a};
    return j;
  };
  auto makeLeaf = [](const Entry* from, std::size_t n) {
    Leaf* l = Leaf::allocate(n);
    if (l != nullptr) std::copy(from, from + n, l->entries());
    return l;
  };

  Entry buf[2 * kLeafMax + 1];  // this leaf (+ add), then possibly a neighbour
  const std::size_t n = gather(old, add, drop, buf);
  const std::uintptr_t key = top->slots()[i].key;
  bool done = false;
  if (n == 0 && top->size > 1) {
    done = replaceLeaves_locked(i, 1, nullptr, nullptr, 0);  // drop the leaf
  } else if (n > kLeafMax) {
    // Split: the lower half keeps the key, the upper half starts at its first entry.
    Leaf* lo = makeLeaf(buf, n / 2);
    Leaf* hi = makeLeaf(buf + n / 2, n - n / 2);
    if (lo != nullptr && hi != nullptr) {
      Leaf* const leaves[2] = {lo, hi};
      const std::uintptr_t keys[2] = {key, buf[n / 2].start};
      done = replaceLeaves_locked(i, 1, leaves, keys, 2);
    }
    if (!done) {
      if (lo != nullptr) Leaf::release(lo);
      if (hi != nullptr) Leaf::release(hi);
    }
  } else {
    // A small leaf merges into a neighbour when both fit in one leaf.
    std::size_t m = 0;  // the neighbour's entries, gathered after ours
    std::size_t with = top->size;
    if (n < kLeafMin && top->size > 1) {
      // A neighbour's invalid entries come along; they leave with their own purge.
      if (i + 1 < top->size && n + (m = top->leaf(i + 1)->size) <= kLeafMax) {
        with = i + 1;
      } else if (i > 0 && n + (m = top->leaf(i - 1)->size) <= kLeafMax) {
        with = i - 1;
      }
      if (with != top->size) gather(top->leaf(with), nullptr, nullptr, buf + n);
    }
    if (with != top->size) {
      // buf holds [ours, theirs]; the merged leaf wants them in address order.
      if (with < i) std::rotate(buf, buf + n, buf + n + m);
      const std::size_t lo_i = std::min(i, with);
      Leaf* merged = makeLeaf(buf, n + m);
      if (merged != nullptr) {
        Leaf* const leaves[1] = {merged};
        const std::uintptr_t keys[1] = {top->slots()[lo_i].key};
        done = replaceLeaves_locked(lo_i, 2, leaves, keys, 1);
        if (!done) Leaf::release(merged);
      }
    } else {
      Leaf* next = n != 0 ? makeLeaf(buf, n) : &g_empty_leaf;
      if (next != nullptr && top == g_empty_top) {  // shared: never written to
        Leaf* const leaves[1] = {next};
        const std::uintptr_t keys[1] = {0};
        done = replaceLeaves_locked(0, 1, leaves, keys, 1);
        if (!done && next != &g_empty_leaf) Leaf::release(next);
      } else if (next != nullptr) {
        top->slots()[i].leaf.store(next, std::memory_order_release);
        if (old != &g_empty_leaf) retire_locked(old);
        done = true;
      }
    }
  }
  if (!done) return false;
  // The old leaf is retired, not freed before the next collect_locked(): mark what left it.
  const RegionImpl* d = drop;
  for (std::size_t k = 0; k < old->size && d != nullptr; ++k) {
    const Entry& e = old->entries()[k];
    while (d != nullptr && d->start() < e.start) d = d->next_unindex_;
    if (d == e.region) {
      e.region->in_index_ = false;
      d = d->next_unindex_;
    }
  }
  if (add != nullptr) add->in_index_ = true;
  return true;
}

// Reverses a list linked by next_unindex_.
RegionImpl* reverse(RegionImpl* list) noexcept {
  RegionImpl* reversed = nullptr;
  while (list != nullptr) {
    RegionImpl* next = list->next_unindex_;
    list->next_unindex_ = reversed;
    reversed = list;
    list = next;
  }
  return reversed;
}

// Sorts a list linked by next_unindex_ by start (merge sort; no allocation). An invalidation
// queues the regions of its range in descending order: that case is a reversal.
RegionImpl* sortByStart(RegionImpl* list) noexcept {
  if (list == nullptr || list->next_unindex_ == nullptr) return list;
  bool descending = true;
  for (RegionImpl* r = list; descending && r->next_unindex_ != nullptr; r = r->next_unindex_) {
    descending = r->next_unindex_->start() < r->start();
  }
  if (descending) return reverse(list);
  RegionImpl* slow = list;  // split in halves
  for (RegionImpl* fast = list->next_unindex_; fast != nullptr && fast->next_unindex_ != nullptr;
       fast = fast->next_unindex_->next_unindex_) {
    slow = slow->next_unindex_;
  }
  RegionImpl* b = slow->next_unindex_;
  slow->next_unindex_ = nullptr;
  RegionImpl* a = sortByStart(list);
  b = sortByStart(b);
  RegionImpl* head = nullptr;
  RegionImpl** tail = &head;
  while (a != nullptr && b != nullptr) {
    RegionImpl*& lower = a->start() < b->start() ? a : b;
    *tail = lower;
    tail = &lower->next_unindex_;
    lower = lower->next_unindex_;
  }
  *tail = a != nullptr ? a : b;
  return head;
}

// Takes the entries of invalid regions (queued on unindex_) out of their leaves, one rewrite per
// leaf. False if a leaf could not be rewritten (no memory): its regions stay queued, and dirty_,
// for a later pass.
bool CacheImpl::purge_locked() noexcept {
  RegionImpl* list = sortByStart(unindex_);
  RegionImpl* retry = nullptr;
  auto retryAll = [&](RegionImpl* batch) {
    while (batch != nullptr) {
      RegionImpl* next = batch->next_unindex_;
      batch->next_unindex_ = retry;
      retry = batch;
      batch = next;
    }
  };
  // From the highest leaf down: a leaf that shrinks merges preferably with the one above it,
  // already purged by then.
  list = reverse(list);
  while (list != nullptr) {
    // The regions of one leaf: those whose start is at or above its key (in ascending order).
    const Top* top = current_locked();
    const std::size_t i = top->leafFor(list->start());
    const std::uintptr_t key = top->slots()[i].key;
    RegionImpl* last = list;
    while (last->next_unindex_ != nullptr && last->next_unindex_->start() >= key) {
      last = last->next_unindex_;
    }
    RegionImpl* batch = list;
    list = last->next_unindex_;
    last->next_unindex_ = nullptr;
    batch = reverse(batch);
    if (!rewriteLeaf_locked(i, nullptr, batch)) {
      retryAll(batch);
      continue;
    }
    while (batch != nullptr) {  // all left the index, unless one was not where it should be
      RegionImpl* next = batch->next_unindex_;
      batch->next_unindex_ = nullptr;
      if (batch->in_index_) {
        batch->next_unindex_ = retry;
        retry = batch;
      }
      batch = next;
    }
  }
  unindex_ = retry;
  dirty_ = retry != nullptr;
  return retry == nullptr;
}

// Indexes `r` (valid, held by its requester) once the entries it overlaps were marked invalid.
// False when it cannot (no memory, or an overlapped entry could not be purged): then it must never
// be indexed.
bool CacheImpl::insert_locked(RegionImpl* r) noexcept {
  if (!purge_locked()) {
    bool clear = true;
    forEachOverlap_locked(r->start(), r->end(), [&](const Entry&) { clear = false; });
    if (!clear) return false;
  }
  if (!lru_.reserveOne()) return false;
  if (!rewriteLeaf_locked(current_locked()->leafFor(r->start()), r, nullptr)) return false;
  // Its requester releases it later, with a tick at least the current clock.
  lru_.push(r, lru_clock_.load(std::memory_order_relaxed));
  return true;
}

void CacheImpl::retire_locked(Retired* x) noexcept {
  x->retire_epoch = epoch_.load(std::memory_order_relaxed);
  x->next_retired = garbage_;
  garbage_ = x;
  ++garbage_count_;
  garbage_bytes_ += retiredBytes(x);
  retired_since_advance_ = true;
}

// `list` (linked by next_dead_) is deregistered. Once no leaf holds them they are retired; those
// whose leaf cannot be rewritten now (no memory) wait on zombies_ for the next pass.
void CacheImpl::retireRegions_locked(RegionImpl* list) noexcept {
  bool indexed = false;
  for (RegionImpl* r = list; r != nullptr; r = r->next_dead_) indexed = indexed || r->in_index_;
  if (indexed) purge_locked();
  for (RegionImpl* r = list; r != nullptr;) {
    RegionImpl* next = r->next_dead_;
    if (r->in_index_) {
      r->next_dead_ = zombies_;
      zombies_ = r;
      setWork_locked(true);
    } else {
      retire_locked(r);
    }
    r = next;
  }
}

// Frees what no reader can see any more: returns the list to free once lock_ is released.
// Each pass costs a membarrier(): batched, unless `force`.
Retired* CacheImpl::collect_locked(bool force) noexcept {
  if (garbage_ == nullptr ||
      (!force && garbage_count_ < kCollectBatch && garbage_bytes_ < kCollectBytes)) {
    return nullptr;
  }
  if (retired_since_advance_) {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    retired_since_advance_ = false;
  }
  writerFence();
  std::uint64_t min_active = UINT64_MAX;
  forEachSlot([&](const ReaderSlot& s) {
    const std::uint64_t e = s.epoch.load(std::memory_order_seq_cst);
    if (e != 0 && e < min_active) min_active = e;
  });
  Retired* freeable = nullptr;
  Retired** link = &garbage_;
  while (*link != nullptr) {
    Retired* x = *link;
    if (x->retire_epoch < min_active) {
      --garbage_count_;
      garbage_bytes_ -= retiredBytes(x);
      *link = x->next_retired;
      x->next_retired = freeable;
      freeable = x;
    } else {
      link = &x->next_retired;
    }
  }
  return freeable;
}

void CacheImpl::freeList(Retired* list) noexcept {
  while (list != nullptr) {
    Retired* next = list->next_retired;
    switch (list->kind) {
      case RetiredKind::kRegion:
        delete static_cast<RegionImpl*>(list);
        break;
      case RetiredKind::kLeaf:
        Leaf::release(static_cast<Leaf*>(list));
        break;
      case RetiredKind::kTop:
        Top::release(static_cast<Top*>(list));
        break;
    }
    list = next;
  }
}

// A registration made before a fork() is the parent's: the child never deregisters it.
void CacheImpl::deregister(RegionImpl* r) noexcept {
  if (r->fork_gen_ == fork_gen_.load(std::memory_order_relaxed))
    r->backend()->dereg(r->registration());
}

// Applies queued invalidations, deregisters dead regions (outside lock_) and frees what readers no
// longer see. Loops because a deregistration may itself raise invalidations (re-entrancy, rule 8).
__attribute__((noinline)) void CacheImpl::finishWork(bool force_collect) noexcept {
  for (;;) {
    RegionImpl* dead;
    Retired* freeable;
    {
      WriterGuard g(lock_);
      applyQueued_locked();
      enforceUnused_locked();
      dead = takeDead_locked();
      if (zombies_ != nullptr) {
        RegionImpl* z = zombies_;
        zombies_ = nullptr;
        retireRegions_locked(z);
      }
      if (dead == nullptr && dirty_) purge_locked();
      freeable = collect_locked(force_collect && dead == nullptr);
    }
    freeList(freeable);
    if (dead == nullptr) return;
    for (RegionImpl* r = dead; r != nullptr; r = r->next_dead_) deregister(r);
    {
      WriterGuard g(lock_);
      applyQueued_locked();
      retireRegions_locked(dead);
      freeable = collect_locked(force_collect);
    }
    freeList(freeable);
  }
}

__attribute__((noinline)) void CacheImpl::releaseInvalid(RegionImpl* r) noexcept {
  if (r->fork_gen_ == fork_gen_.load(std::memory_order_relaxed)) {
    regions_.fetch_sub(1, std::memory_order_relaxed);
    pinned_.fetch_sub(static_cast<std::int64_t>(r->length()), std::memory_order_relaxed);
    r->backend()->dereg(r->registration());
  }
  Retired* freeable;
  {
    WriterGuard g(lock_);
    r->next_dead_ = nullptr;
    retireRegions_locked(r);
    freeable = collect_locked();
  }
  freeList(freeable);
}

void CacheImpl::progress() noexcept { finishWork(/*force_collect=*/true); }

Stats CacheImpl::stats() const noexcept {
  Stats s;
  s.hits = slow_hits_.load(std::memory_order_relaxed);
  forEachSlot([&](const ReaderSlot& rs) { s.hits += rs.hits.load(std::memory_order_relaxed); });
  s.misses = misses_.load(std::memory_order_relaxed);
  s.merges = merges_.load(std::memory_order_relaxed);
  s.evictions = evictions_.load(std::memory_order_relaxed);
  s.invalidations_in_use = inval_in_use_.load(std::memory_order_relaxed);
  s.invalidations_unused = inval_unused_.load(std::memory_order_relaxed);
  s.deferred_deregs = deferred_.load(std::memory_order_relaxed);
  s.regions = static_cast<std::uint64_t>(std::max<std::int64_t>(0, regions_.load()));
  s.pinned_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, pinned_.load()));
  s.unused_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, unusedExact()));
  s.invalidation_overflows = overflows_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------------------------------
// fork() (rule 9)

// In the child, only the forking thread exists and lock_ is held by it (taken in forkPrepare()).
// The child must never hand out nor deregister the parent's registrations: every region becomes an
// orphan (invalid, never deregistered), the index is emptied, and orphans are freed as they are
// released. No allocation here.
void CacheImpl::forkChild() noexcept {
  if (!config_.purge_on_fork) {
    lock_.unlock();
    return;
  }
  // From here on every existing region belongs to an older generation: deregister() and
  // releaseInvalid() skip the backend for it and it leaves no trace in the counters.
  fork_gen_.fetch_add(1, std::memory_order_relaxed);
  Range r;
  while (ring_.pop(&r)) {
  }
  ring_overflow_.store(0, std::memory_order_relaxed);
  Top* top = current_locked();
  index_.store(g_empty_top, std::memory_order_relaxed);
  for (std::size_t i = 0; i < top->size; ++i) {
    Leaf* leaf = top->leaf(i);
    for (std::size_t k = 0; k < leaf->size; ++k) {
      RegionImpl* reg = leaf->entries()[k].region;
      reg->in_index_ = false;
      reg->next_unindex_ = nullptr;
      const std::uint64_t prev = reg->state_.fetch_or(kInvalid, std::memory_order_relaxed);
      if ((prev & (kInvalid | kHolderMask)) == 0) pushDead_locked(reg);  // freed by the next pass
    }
    if (leaf != &g_empty_leaf) retire_locked(leaf);
  }
  if (top != g_empty_top) retire_locked(top);
  unindex_ = nullptr;
  lru_.clear();
  forEachSlot([](ReaderSlot& s) {
    s.epoch.store(0, std::memory_order_relaxed);
    s.unused_delta.store(0, std::memory_order_relaxed);
  });
  regions_.store(0, std::memory_order_relaxed);
  pinned_.store(0, std::memory_order_relaxed);
  unused_shared_.store(0, std::memory_order_relaxed);
  attention_.store(work_flag_ ? kWorkBit : 0, std::memory_order_relaxed);
  dirty_ = false;
  lock_.unlock();
}

void atforkPrepare() {
  threadRegistry().mutex.lock();
  cacheRegistry().mutex.lock();
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkPrepare();
}

void atforkParent() {
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkParent();
  cacheRegistry().mutex.unlock();
  threadRegistry().mutex.unlock();
}

void atforkChild() {
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkChild();
  cacheRegistry().mutex.unlock();
  threadRegistry().mutex.unlock();
}

std::once_flag g_atfork_once;

}  // namespace

void setLogHandler(LogHandler handler) noexcept {
  g_log_handler.store(handler, std::memory_order_release);
}

Status Cache::create(const Config& config, std::unique_ptr<Cache>* out) {
  if (out == nullptr) return Status::kInvalidParam;
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto page_size = static_cast<std::size_t>(page > 0 ? page : 4096);
  const std::size_t a = config.alignment;
  if (a < page_size || (a & (a - 1)) != 0 || a > (std::size_t{1} << 30)) {
    logf(LogLevel::kError, "invalid alignment %zu: a power of two between %zu and 1 GiB", a,
         page_size);
    return Status::kInvalidParam;
  }
  if (config.max_regions == 0 || config.max_pinned_bytes < a ||
      (config.max_regions != SIZE_MAX && config.max_regions > (std::size_t{1} << 40)) ||
      (config.max_pinned_bytes != SIZE_MAX && config.max_pinned_bytes > kMaxRequestLength)) {
    logf(LogLevel::kError,
         "invalid limits: max_regions %zu (1..2^40 or unlimited), max_pinned_bytes %zu "
         "(alignment..2^57 or unlimited)",
         config.max_regions, config.max_pinned_bytes);
    return Status::kInvalidParam;
  }
  if (config.max_unused_bytes != SIZE_MAX && config.max_unused_bytes > kMaxRequestLength) {
    logf(LogLevel::kError, "invalid limit: max_unused_bytes %zu", config.max_unused_bytes);
    return Status::kInvalidParam;
  }
  std::call_once(g_atfork_once, [] { pthread_atfork(atforkPrepare, atforkParent, atforkChild); });
  auto* c = new (std::nothrow) CacheImpl(config);
  if (c == nullptr) return Status::kNoMemory;
  out->reset(c);
  return Status::kOk;
}

}  // namespace gmd::rcache
