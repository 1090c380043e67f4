// The registration cache: lookups (the lock-free hit path), parked holds and counters. See
// rcache/cache_impl.h for the shape and rcache/README.md for the invariants; miss.cc holds the
// misses, invalidation.cc invalidation, eviction.cc the limits, fork.cc the fork() handling.
//
//  - The index (index.h) is published through an atomic pointer. Readers look it up inside an epoch
//    (reclaim.h) and take a reference with one CAS on the region's state word, which fails once the
//    region is invalid. Writers are serialised by lock_; what they replace is retired and freed
//    once no reader can still see it.
//  - invalidate() never blocks and never allocates: it queues the range (invalidation_queue.h),
//    bumps attention_, and applies the queue at once when it can try-lock the writer lock. Every
//    get() reads attention_ before its lookup and drains the queue first when it is non-zero.
//  - Deregistration happens outside lock_, in get()/put()/progress(), never inside invalidate().
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <new>

#include "common/log.h"
#include "rcache/cache_impl.h"
#include "rcache/fork.h"

namespace gmd::rcache {
namespace detail {
namespace {

constexpr const char* kModule = "rcache";

std::atomic<std::uint64_t> g_next_cache_id{1};

// A thread's parked hold that this many of its hits in a row did not find (the thread moved on to
// other buffers, or the slot's previous owner, a thread that exited, left it) gives way to the
// next region the thread releases. Up to this many buffers taken in turn keep it where it is.
constexpr std::uint32_t kStaleParkMisses = 8;

}  // namespace

__attribute__((tls_model("initial-exec"))) constinit thread_local TlsSlot tls_slot{0, nullptr, 0};

CacheImpl::CacheImpl(const Config& config) noexcept
    : config_(config),
      id_(g_next_cache_id.fetch_add(1, std::memory_order_relaxed)),
      unused_flush_bound_(static_cast<std::int64_t>(
          std::min<std::size_t>(config.max_unused_bytes / 8, std::size_t{64} << 20))) {
  registerCache(this);
}

void* CacheImpl::operator new(std::size_t size, const std::nothrow_t&) noexcept {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void CacheImpl::operator delete(void* p, std::size_t size) noexcept { ::munmap(p, size); }

CacheImpl::~CacheImpl() {
  unregisterCache(this);
  finishWork();
  // The contract says nothing is held and nobody calls in any more. Deregister what is left (alone
  // here: region_pool_ needs no lock).
  IndexT::TopT* top;
  {
    WriterGuard g(lock_);
    top = index_.detach();
  }
  std::size_t held = 0;
  for (std::size_t i = 0; i < top->size; ++i) {
    IndexT::LeafT* leaf = top->leaf(i);
    const std::size_t n = leaf->count();
    for (std::size_t k = 0; k < n; ++k) {
      RegionImpl* r = leaf->entry(k).region();
      const std::uint32_t s = r->state_.load(std::memory_order_acquire);
      if ((s & kInvalid) != 0) continue;  // owned by a holder (a contract breach) or a zombie
      if ((s & kHolderMask) != 0) ++held;
      deregister(r);
      freeRegion_locked(r);
    }
    IndexT::releaseLeaf(leaf);
  }
  for (RegionImpl* z = zombies_; z != nullptr;) {
    RegionImpl* next = z->nextDead();
    freeRegion_locked(z);
    z = next;
  }
  if (held != 0) log(LogLevel::kWarn, kModule, "cache destroyed with %zu regions still held", held);
  IndexT::releaseTop(top);
  freeList(reclaim_.retired.takeAll());
}

// Tells what is wrong with a request the fast check in get() refused. Caller mistakes: the status
// says it, the line is for debugging.
__attribute__((noinline, cold)) Result CacheImpl::checkRequest(const void* address,
                                                               std::size_t length, unsigned access,
                                                               const Resolver& resolver,
                                                               Region* const* region,
                                                               Range* rq) const noexcept {
  if (region == nullptr || (resolver.isFixed() && resolver.fixedBackend() == nullptr)) {
    log(LogLevel::kDebug, kModule, "get(%p, %zu): null %s", address, length,
        region == nullptr ? "region output" : "backend");
    return Status::kInvalidParam;
  }
  if (length == 0 || length > kMaxRequestLength) {
    log(LogLevel::kDebug, kModule, "get(%p, %zu): %s length", address, length,
        length == 0 ? "zero" : "absurd");
    return Status::kInvalidParam;
  }
  if ((access & ~static_cast<unsigned>(kAccessAll)) != 0) {
    log(LogLevel::kDebug, kModule, "get(%p, %zu): unknown access bits 0x%x", address, length,
        access);
    return Status::kInvalidParam;
  }
  if (!alignOutwards(address, length, config_.alignment, rq)) {
    log(LogLevel::kDebug, kModule, "get(%p, %zu): range wraps around the address space", address,
        length);
    return Status::kInvalidParam;
  }
  if (rq->length() > config_.max_pinned_bytes) {
    log(LogLevel::kDebug, kModule, "get(%p, %zu): %zu aligned bytes exceed max_pinned_bytes %zu",
        address, length, rq->length(), config_.max_pinned_bytes);
    return Status::kExceedsLimit;
  }
  return Status::kOk;
}

__attribute__((noinline)) ReaderSlot* CacheImpl::mySlotSlow() noexcept {
  const int ti = threadIndex();
  ReaderSlot* s = ti >= 0 ? reclaim_.slots.slot(ti) : nullptr;
  if (s != nullptr) tls_slot = TlsSlot{id_, s, 0};
  return s;
}

// The slot's delta passed its bound (or there is no slot): move it to the shared counter.
bool CacheImpl::moveUnused(ReaderSlot* slot, std::int64_t delta) noexcept {
  std::int64_t v = delta;
  if (slot != nullptr) {
    v += slot->unused_delta.load(std::memory_order_relaxed);
    slot->unused_delta.store(0, std::memory_order_relaxed);
  }
  const std::int64_t total = unused_shared_.fetch_add(v, std::memory_order_relaxed) + v;
  return delta > 0 && total > static_cast<std::int64_t>(config_.max_unused_bytes);
}

__attribute__((noinline)) void CacheImpl::flushUnused(ReaderSlot* slot,
                                                      std::int64_t delta) noexcept {
  if (moveUnused(slot, delta)) {
    // Over the unused limit: have the next caller (or this put) evict.
    WriterGuard g(lock_);
    setWork_locked(true);
  }
}

void CacheImpl::advanceLruClock_locked() noexcept {
  std::uint64_t m = lru_clock_.load(std::memory_order_relaxed);
  reclaim_.slots.forEach(
      [&](const ReaderSlot& s) { m = std::max(m, s.lru_seq.load(std::memory_order_relaxed)); });
  lru_clock_.store(m + 1, std::memory_order_relaxed);
}

std::int64_t CacheImpl::unusedExact() const noexcept {
  std::int64_t sum = unused_shared_.load(std::memory_order_relaxed);
  reclaim_.slots.forEach(
      [&](const ReaderSlot& s) { sum += s.unused_delta.load(std::memory_order_relaxed); });
  return sum;
}

// ---------------------------------------------------------------------------------------------------
// Hit path

// Whether a region answers a request's access (and, for a fixed resolver, its kind and backend;
// any region's when `resolver` is null).
namespace {
__attribute__((always_inline)) inline bool servesRequest(const RegionImpl* r, unsigned access,
                                                         const Resolver* resolver) noexcept {
  return resolver == nullptr ? (r->access() & access) == access : r->serves(access, *resolver);
}
}  // namespace

// The common request, in one test: a length and access get() takes, somewhere to put the region,
// a fixed resolver with its backend, and within the limits once aligned (into *rq).
// checkRequest() tells what is wrong otherwise.
__attribute__((always_inline)) inline bool CacheImpl::plainRequest(
    const void* address, std::size_t length, unsigned access, const Resolver& resolver,
    Region* const* region, Range* rq) const noexcept {
  return length - 1 < kMaxRequestLength && (access & ~static_cast<unsigned>(kAccessAll)) == 0 &&
         region != nullptr && !(resolver.isFixed() && resolver.fixedBackend() == nullptr) &&
         alignOutwards(address, length, config_.alignment, rq) &&
         rq->length() <= config_.max_pinned_bytes;
}

// get() is the hit on the thread's parked hold (parkedHit(), inline), which makes no call, so
// that get() saves no register and needs no frame of its own (with a frame, a hit took a fifth
// longer); everything else (a bad request, no slot known yet, the index's hit, a miss) is
// getIndexed(), a tail call with get()'s own arguments.
Result CacheImpl::get(const void* address, std::size_t length, unsigned access,
                      const Resolver& resolver, Region** region) noexcept {
  Range rq;
  if (__builtin_expect(plainRequest(address, length, access, resolver, region, &rq), 1)) {
    if (ReaderSlot* slot = knownSlot()) {
      if (RegionImpl* r = parkedHit(slot, rq.start, rq.end, access, &resolver)) {
        *region = r;
        return Status::kOk;
      }
      return getIndexed<false>(address, length, access, resolver, region);
    }
  }
  return getIndexed<true>(address, length, access, resolver, region);
}

// get() past the parked hold: the request's check (unless get() made it: kTryParked false means
// get() checked the request and tried the parked hold), the lock-free hit (the parked hold unless
// get() tried it, then the index), the slow path.
template <bool kTryParked>
__attribute__((noinline)) Result CacheImpl::getIndexed(const void* address, std::size_t length,
                                                       unsigned access, const Resolver& resolver,
                                                       Region** region) noexcept {
  Range rq;
  if (!kTryParked) {
    alignOutwards(address, length, config_.alignment, &rq);  // succeeded in get()
  } else if (__builtin_expect(!plainRequest(address, length, access, resolver, region, &rq), 0)) {
    const Result st = checkRequest(address, length, access, resolver, region, &rq);
    if (!st.ok()) return st;
  }
  if (RegionImpl* r = fastHit<kTryParked>(rq.start, rq.end, access, &resolver)) {
    *region = r;
    return Status::kOk;
  }
  return getSlow(address, length, rq, access, resolver, region);
}

// In an epoch: the region of the index's entry that covers [start, end), null when none does (or
// a writer kept editing its leaf: the slow path then looks under the lock). Out of line, with its
// arguments by value: inlined, the search ran out of registers and spilled the reader slot around
// the leaf search (about 1 ns more per hit among 100,000 regions).
__attribute__((noinline)) RegionImpl* CacheImpl::floorRegion(ReaderSlot* slot, std::uintptr_t start,
                                                             std::uintptr_t end) noexcept {
  // A copy of the floor entry, from a consistent read of its leaf. The region it names is live
  // for our epoch.
  Entry e;
  std::uint64_t pos = slot->read_pos.load(std::memory_order_relaxed);
  const bool found = index_.top()->floor(start, &e, &pos);
  slot->read_pos.store(pos, std::memory_order_relaxed);
  return found && e.word != 0 && e.reaches(end) ? e.region() : nullptr;
}

// The hit on the region this thread parked a hold on, when it covers [start, end) (told from the
// bounds the slot keeps, without reading the region's line), serves the request and is valid:
// taken back with one CAS on our own slot's line; else null, and nothing changed. A valid region
// is indexed (a miss marks one it cannot index invalid), and its entry is the only one its range
// meets (invariant 1): it is the region the index would name. Makes no call (get() stays without
// a frame).
//
// No epoch: the region's line is read only once the CAS has taken its hold back, and a held
// region is not freed. The CAS compares with what we loaded from our own slot, which only we
// ever store a region into: if a writer took the hold out meanwhile (then the region may be gone),
// the slot holds null or a hold we parked since, and the CAS fails. A region that turns out not
// to serve the request, or to have been invalidated since it was parked, goes back where it was
// (the slot is still empty: only we fill it), the latter for the next writer pass to release (and
// deregister: the hit path never takes the lock nor deregisters); the index may name a newer one.
__attribute__((always_inline)) inline RegionImpl* CacheImpl::parkedHit(
    ReaderSlot* slot, std::uintptr_t start, std::uintptr_t end, unsigned access,
    const Resolver* resolver) noexcept {
  if (__builtin_expect(attention_.load(std::memory_order_acquire) != 0, 0)) return nullptr;
  void* mine = slot->parked.load(std::memory_order_relaxed);
  if (mine == nullptr || slot->parked_start > start || end > slot->parked_end) return nullptr;
  auto* r = static_cast<RegionImpl*>(mine);
  if (!slot->parked.compare_exchange_strong(mine, nullptr, std::memory_order_acquire,
                                            std::memory_order_relaxed)) {
    return nullptr;
  }
  if (__builtin_expect((r->state_.load(std::memory_order_acquire) & kInvalid) != 0 ||
                           !servesRequest(r, access, resolver),
                       0)) {
    slot->parked.store(r, std::memory_order_release);
    return nullptr;
  }
  bump(slot->hits, std::uint64_t{1});
  return r;
}

// The lock-free hit: a valid region covering [start, end) with `access` that serves `resolver`
// (any region when null), acquired; null when there is none or pending work must run first.
// First the parked hold (unless the caller tried it), then the index, whose search is out of
// line (floorRegion()): a new hold with one CAS on the region's state word, which fails if it is
// invalid. Each hit past a parked hold counts as a miss of it (put() then makes a stale one give
// way).
template <bool kTryParked>
__attribute__((always_inline)) inline RegionImpl* CacheImpl::fastHit(
    std::uintptr_t start, std::uintptr_t end, unsigned access, const Resolver* resolver) noexcept {
  ReaderSlot* slot = mySlot();
  if (__builtin_expect(slot == nullptr, 0)) return nullptr;
  if (kTryParked) {
    if (RegionImpl* r = parkedHit(slot, start, end, access, resolver)) return r;
  }
  if (__builtin_expect(attention_.load(std::memory_order_acquire) != 0, 0)) return nullptr;
  readerEnter(slot->epoch, reclaim_.slots.epoch());
  if (slot->parked.load(std::memory_order_relaxed) != nullptr) ++tls_slot.park_misses;
  std::uint64_t prev = 0;
  RegionImpl* r = floorRegion(slot, start, end);
  const bool hit = r != nullptr && servesRequest(r, access, resolver) && r->tryAcquire(&prev);
  slot->epoch.store(0, std::memory_order_release);
  if (!hit) return nullptr;
  if (prev == 0) addUnused(slot, -static_cast<std::int64_t>(r->length()));
  bump(slot->hits, std::uint64_t{1});
  return r;
}

bool CacheImpl::find(const void* address, std::size_t length, unsigned access,
                     Region** region) noexcept {
  Range rq;
  if (length - 1 >= kMaxRequestLength || (access & ~static_cast<unsigned>(kAccessAll)) != 0 ||
      region == nullptr || !alignOutwards(address, length, config_.alignment, &rq)) {
    return false;
  }
  RegionImpl* r = fastHit<true>(rq.start, rq.end, access, nullptr);
  if (r == nullptr) return false;
  *region = r;
  return true;
}

// The owner parks its hold on r in its empty slot: the bounds first, for its hits to read.
__attribute__((always_inline)) inline void CacheImpl::park(ReaderSlot* slot,
                                                           RegionImpl* r) noexcept {
  slot->parked_start = r->start();
  slot->parked_end = r->end();
  slot->parked.store(r, std::memory_order_release);
  if (__builtin_expect(tls_slot.park_misses != 0, 0)) tls_slot.park_misses = 0;
}

// Drops one hold on r, a valid or invalid region of this fork generation, as put() does.
__attribute__((noinline)) void CacheImpl::releaseHold(ReaderSlot* slot, RegionImpl* r) noexcept {
  const auto len = static_cast<std::int64_t>(r->length());  // before: r may go once released
  const std::uint32_t prev = r->state_.fetch_sub(1, std::memory_order_acq_rel);
  if ((prev & kHolderMask) != 1) return;
  if ((prev & kInvalid) == 0) {
    addUnused(slot, len);
  } else {
    releaseInvalid(r);
  }
}

// put() parks the hold in the thread's empty slot (stores only, no call: put() stays frameless);
// everything else is putSlow(), a tail call.
void CacheImpl::put(Region* region) noexcept {
  auto* r = static_cast<RegionImpl*>(region);
  ReaderSlot* slot = knownSlot();
  if (__builtin_expect(r != nullptr && slot != nullptr, 1)) {
    const std::uint32_t s = r->state_.load(std::memory_order_relaxed);
    const std::uint32_t gen = fork_gen_.load(std::memory_order_relaxed);
    if (slot->parked.load(std::memory_order_relaxed) == nullptr && (s & kInvalid) == 0 &&
        (s & kHolderMask) != 0 && (gen == 0 || r->ofForkGen(gen))) {
      r->last_used_.store(releaseTick(slot), std::memory_order_relaxed);
      park(slot, r);
      if (attention_.load(std::memory_order_acquire) != 0) finishWork();
      return;
    }
  }
  putSlow(region);
}

__attribute__((noinline)) void CacheImpl::putSlow(Region* region) noexcept {
  if (region == nullptr) {
    log(LogLevel::kWarn, kModule, "put(nullptr)");
    return;
  }
  auto* r = static_cast<RegionImpl*>(region);
  const auto len = static_cast<std::int64_t>(r->length());
  ReaderSlot* slot = mySlot();
  r->last_used_.store(releaseTick(slot), std::memory_order_relaxed);
  // Read before the hold is dropped: once it is, an unused valid region may be evicted and freed
  // by another thread at any moment. Until a fork() every region is of generation 0, and put()
  // reads only the region's own line.
  const std::uint32_t gen = fork_gen_.load(std::memory_order_relaxed);
  const bool orphan = gen != 0 && !r->ofForkGen(gen);
  bool repark = false;
  if (__builtin_expect(slot != nullptr && !orphan, 1)) {
    void* parked = slot->parked.load(std::memory_order_relaxed);
    const std::uint32_t s = r->state_.load(std::memory_order_relaxed);
    // No hold at all (a caller's mistake): the path below says so. A legitimate put() always
    // sees at least its own hold.
    // Park the hold: no read-modify-write (see "Parked holds" below). The slot must be empty, or
    // hold another region that the thread's hits keep missing: that hold is taken out first (a
    // writer may be taking it too) and released.
    if ((s & kInvalid) == 0 && (s & kHolderMask) != 0 &&
        (parked == nullptr || (parked != r && tls_slot.park_misses >= kStaleParkMisses))) {
      auto* old = static_cast<RegionImpl*>(parked);
      if (old != nullptr &&
          slot->parked.compare_exchange_strong(parked, nullptr, std::memory_order_acquire,
                                               std::memory_order_relaxed)) {
        releaseHold(slot, old);
      }
      park(slot, r);  // the slot is empty now: it was, or we or a writer took its hold out
      if (attention_.load(std::memory_order_acquire) != 0) finishWork();
      return;
    }
    // r's hold is parked here already: this thread held r twice, or releases it twice. Take the
    // parked one out (a writer may be taking it out too) and count what is left.
    if (parked == r && slot->parked.compare_exchange_strong(
                           parked, nullptr, std::memory_order_acquire, std::memory_order_relaxed)) {
      if ((r->state_.load(std::memory_order_acquire) & kHolderMask) == 1) {
        // The parked hold is its only one: this put() releases a hold nobody has.
        slot->parked.store(r, std::memory_order_release);
        log(LogLevel::kWarn, kModule, "put(%p): region is not held", static_cast<void*>(r));
        return;
      }
      repark = true;  // release this hold below, park the other one again after
    }
  }
  const std::uint32_t prev = r->state_.fetch_sub(1, std::memory_order_acq_rel);
  // At least the parked hold is left (prev >= 2): not the last holder, nothing below applies.
  if (repark) slot->parked.store(r, std::memory_order_release);
  if (__builtin_expect((prev & kHolderMask) == 1, 1)) {
    // The last holder. A valid region stays cached (unused); an invalid one is ours to deregister.
    // A region from before a fork() (in the child) is an orphan: out of every index, left alone.
    if (__builtin_expect(orphan, 0)) return;
    if ((prev & kInvalid) == 0) {
      addUnused(slot, len);
    } else {
      releaseInvalid(r);
    }
  } else if ((prev & kHolderMask) == 0) {
    r->state_.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn, kModule, "put(%p): region is not held", static_cast<void*>(r));
    return;
  }
  if (attention_.load(std::memory_order_acquire) != 0) finishWork();
}

// Parked holds. put() of a valid region keeps the hold in the calling thread's reader slot when
// the slot has none, instead of decrementing the region's state word; the thread's next hit on
// that region takes it back with a compare-and-swap on its own slot. A hit and its release then
// cost one atomic read-modify-write instead of two: what a rendezvous protocol or a loop over one
// buffer does. A parked hold is a hold like any other (the region stays alive and registered,
// counts as in use, is not evicted), so every writer pass first takes every slot's parked hold out
// (exchange to null) and releases it: writers never see a hold that no caller has, invalidations
// count it as unused, and eviction may take it. The owner stores into its slot only while it is
// null, everyone else only takes out of it, so each parked hold is released exactly once: by the
// owner's compare-and-swap (then it is the owner's again) or by the exchange that took it.
void CacheImpl::unparkAll_locked() noexcept {
  ReaderSlot* const mine = mySlot();
  reclaim_.slots.forEach([this, mine](ReaderSlot& rs) {
    if (rs.parked.load(std::memory_order_relaxed) == nullptr) return;
    RegionImpl* r;
    if (&rs == mine) {
      // Our own slot: only its owner (us, in this pass) and writers (lock_, ours) write it.
      r = static_cast<RegionImpl*>(rs.parked.load(std::memory_order_relaxed));
      rs.parked.store(nullptr, std::memory_order_relaxed);
    } else {
      r = static_cast<RegionImpl*>(rs.parked.exchange(nullptr, std::memory_order_acquire));
      if (r == nullptr) return;
    }
    const std::uint32_t prev = r->state_.fetch_sub(1, std::memory_order_acq_rel);
    if ((prev & kHolderMask) != 1) return;  // others hold it still
    const auto len = static_cast<std::int64_t>(r->length());
    if ((prev & kInvalid) == 0) {
      // Cached, unused: counted as put() counts it, in our own slot's share (we hold lock_, so
      // over the limit we raise the work bit ourselves).
      if (!addUnusedInSlot(mine, len) && moveUnused(mine, len)) setWork_locked(true);
      return;
    }
    // Invalidated while parked, and this was its last hold: deregistered by the next pass
    // outside the lock, as an unused region invalidated (no deregistration under lock_).
    bump(regions_, std::int64_t{-1});
    bump(pinned_, -len);
    pushDead_locked(r);
  });
}

Stats CacheImpl::stats() const noexcept {
  {
    // Parked holds are nobody's: counted as what they are (unused, or invalid and dead) first.
    auto* self = const_cast<CacheImpl*>(this);
    WriterGuard g(self->lock_);
    self->unparkAll_locked();
  }
  Stats s;
  s.locked_hits = slow_hits_.load(std::memory_order_relaxed);
  s.hits = s.locked_hits;
  reclaim_.slots.forEach(
      [&](const ReaderSlot& rs) { s.hits += rs.hits.load(std::memory_order_relaxed); });
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

}  // namespace detail

Status Cache::create(const Config& config, std::unique_ptr<Cache>* out) {
  using detail::kModule;
  if (out == nullptr) return Status::kInvalidParam;
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto page_size = static_cast<std::size_t>(page > 0 ? page : 4096);
  const std::size_t a = config.alignment;
  if (a < page_size || (a & (a - 1)) != 0 || a > (std::size_t{1} << 30)) {
    log(LogLevel::kDebug, kModule, "invalid alignment %zu: a power of two between %zu and 1 GiB", a,
        page_size);
    return Status::kInvalidParam;
  }
  if (config.max_regions == 0 || config.max_pinned_bytes < a ||
      (config.max_regions != SIZE_MAX && config.max_regions > (std::size_t{1} << 40)) ||
      (config.max_pinned_bytes != SIZE_MAX && config.max_pinned_bytes > kMaxRequestLength)) {
    log(LogLevel::kDebug, kModule,
        "invalid limits: max_regions %zu (1..2^40 or unlimited), max_pinned_bytes %zu "
        "(alignment..2^57 or unlimited)",
        config.max_regions, config.max_pinned_bytes);
    return Status::kInvalidParam;
  }
  if (config.max_unused_bytes != SIZE_MAX && config.max_unused_bytes > kMaxRequestLength) {
    log(LogLevel::kDebug, kModule, "invalid limit: max_unused_bytes %zu", config.max_unused_bytes);
    return Status::kInvalidParam;
  }
  detail::installForkHandlers();
  auto* c = new (std::nothrow) detail::CacheImpl(config);
  if (c == nullptr) return Status::kNoMemory;
  out->reset(c);
  return Status::kOk;
}

}  // namespace gmd::rcache
