// The registration cache's miss path: getSlow() (a miss registers under the rules of
// rcache/README.md), the bare miss and the insertion. See the notes at the top of cache.cc.
#include "common/log.h"
#include "rcache/cache_impl.h"

namespace gmd::rcache {
namespace detail {
namespace {

constexpr const char* kModule = "rcache";

}  // namespace

__attribute__((noinline)) Result CacheImpl::getSlow(const void* address, std::size_t length,
                                                    const Range& rq, unsigned access,
                                                    const Resolver& resolver,
                                                    Region** out) noexcept {
  // What to register, asked once and outside the lock (classification may call a driver).
  const Resolution what = resolver.resolve(address, length);
  if (!what.result.ok()) return what.result;
  if (what.backend == nullptr) {
    log(LogLevel::kDebug, kModule, "get(%p, %zu): the resolver named no backend", address, length);
    return Status::kInvalidParam;
  }
  const MemType type = what.memory.type;
  Backend* const backend = what.backend;
  RegionImpl* hit = nullptr;
  RegionImpl* evicted = nullptr;  // unused regions our eviction doomed, linked by nextDead()
  Range want = rq;
  unsigned want_access = access;
  std::uint64_t seq0 = 0;
  std::size_t overlaps = 0;       // entries the first walk met
  std::uint64_t insertions0 = 0;  // the index's insertion count then
  Status st = Status::kOk;
  // Nothing for the first pass to do (nothing it would find): register at once, lock once.
  const bool bare = bareMiss(rq, &seq0, &insertions0);
  if (!bare) {
    WriterGuard g(lock_);
    unparkAll_locked();
    applyQueued_locked();
    // The walk starts where our failed lookup ended, if that still answers it (the lookup left
    // the leaf and its lines in our cache; in a big cache the search is most of a walk).
    if (ReaderSlot* slot = mySlot()) index_.suggest(slot->read_pos.load(std::memory_order_relaxed));
    // One walk over the entries overlapping the request: the one covering it (a hit: another
    // thread registered it since our lookup) and, rule 3, the union of the valid ones of the same
    // kind, which the new registration covers.
    std::uint64_t prev = 0;
    index_.forEachOverlap(rq.start, rq.end, [&](const Entry& o) {
      ++overlaps;
      RegionImpl* r = o.region();
      if (hit == nullptr && o.start <= rq.start && o.end() >= rq.end &&
          r->serves(access, resolver) && r->tryAcquire(&prev)) {
        hit = r;
      }
      if ((r->state_.load(std::memory_order_relaxed) & kInvalid) != 0) return;
      if (r->memType() != type || r->backend() != backend) return;
      want.start = std::min(want.start, o.start);
      want.end = std::max(want.end, o.end());
      want_access |= r->access();
    });
    insertions0 = index_.insertions();
    if (hit != nullptr) {
      bump(slow_hits_, std::uint64_t{1});
      if (prev == 0) {
        dropUnused_locked(static_cast<std::int64_t>(hit->length()));
      }
    } else {
      if (want.length() > config_.max_pinned_bytes) want = rq;
      advanceLruClock_locked();
      // What this eviction frees is ours to deregister (before we register) and to retire (when
      // we insert), without the work bit that would send every other get() to the slow path and
      // without the two more lock round trips of finishWork().
      own_dead_ = true;
      const bool room = makeRoom_locked(want.length());
      own_dead_ = false;
      if (!work_flag_) {  // else dead_ holds others' regions too: finishWork() takes them all
        evicted = dead_;
        dead_ = nullptr;
      }
      if (!room) {
        st = Status::kNoResource;
      } else {
        bump(regions_, std::int64_t{1});
        bump(pinned_, static_cast<std::int64_t>(want.length()));
        seq0 = queue_.applied();
      }
    }
  }
  if (attention_.load(std::memory_order_acquire) != 0) finishWork();
  if (hit != nullptr) {
    *out = hit;
    return Status::kOk;
  }
  for (RegionImpl* r = evicted; r != nullptr; r = r->nextDead()) deregister(r);
  if (st != Status::kOk) {
    if (evicted != nullptr) {
      WriterGuard g(lock_);
      retireRegions_locked(evicted);
    }
    log(LogLevel::kDebug, kModule,
        "register [0x%zx, 0x%zx): region limits reached (max_regions %zu, max_pinned_bytes %zu) "
        "and every region is in use",
        static_cast<std::size_t>(rq.start), static_cast<std::size_t>(rq.end), config_.max_regions,
        config_.max_pinned_bytes);
    return st;
  }

  std::size_t len = want.length();
  auto unreserve_locked = [&] {
    if (bare) return;  // nothing reserved, nothing evicted
    bump(regions_, std::int64_t{-1});
    bump(pinned_, -static_cast<std::int64_t>(len));
    if (evicted != nullptr) retireRegions_locked(evicted);
  };
  Registration reg{};
  Result res = backend->reg(want.start, len, want_access, what.memory, &reg);
  if (res.status == Status::kNoResource) {
    // Rule 6: evict every unused region, then retry once.
    std::size_t n_evicted;
    {
      WriterGuard g(lock_);
      unparkAll_locked();  // a parked hold is unused: it goes too (a bare miss did not unpark)
      n_evicted = evictAllUnused_locked();
    }
    finishWork();
    log(LogLevel::kDebug, kModule, "backend out of resources: evicted %zu unused regions, retrying",
        n_evicted);
    res = backend->reg(want.start, len, want_access, what.memory, &reg);
  }
  if (!res.ok() && (want.start != rq.start || want.end != rq.end)) {
    // The union with the overlapping regions failed, e.g. because a neighbour's pages were
    // unmapped since we looked (EFAULT): the caller's own pages may all be mapped. Retry with the
    // request alone, as UCX's cache does.
    log(LogLevel::kDebug, kModule,
        "%s: registering the union [0x%zx, 0x%zx) failed (%s), retrying [0x%zx, 0x%zx) alone",
        backend->name(), static_cast<std::size_t>(want.start), static_cast<std::size_t>(want.end),
        statusString(res.status), static_cast<std::size_t>(rq.start),
        static_cast<std::size_t>(rq.end));
    {
      WriterGuard g(lock_);
      bump(pinned_, -static_cast<std::int64_t>(len - rq.length()));
    }
    want = rq;
    want_access = access;
    len = want.length();
    res = backend->reg(want.start, len, want_access, what.memory, &reg);
  }
  if (!res.ok()) {
    if (!bare) {
      WriterGuard g(lock_);
      unreserve_locked();
    }
    // The caller reports the failure (md/ at the level its caller asked for).
    log(LogLevel::kDebug, kModule, "%s: registering [0x%zx, 0x%zx) failed: %s", backend->name(),
        static_cast<std::size_t>(want.start), static_cast<std::size_t>(want.end),
        statusString(res.status));
    return res;
  }
  RegionImpl* nr;
  Reclaimed freeable;
  {
    WriterGuard g(lock_);
    nr = newRegion_locked(want, want_access, type, backend, reg);
    if (nr == nullptr) {
      unreserve_locked();
    } else {
      if (bare) {  // what the first pass does for every miss
        advanceLruClock_locked();
        bump(regions_, std::int64_t{1});
        bump(pinned_, static_cast<std::int64_t>(len));
        if (ReaderSlot* slot = mySlot())
          index_.suggest(slot->read_pos.load(std::memory_order_relaxed));
      }
      bump(misses_, std::uint64_t{1});
      applyQueued_locked();
      if (queue_.invalidatedSince(seq0, want)) {
        // The memory changed while we registered it. The caller asked before the invalidation
        // completed, so it may use this registration, but nobody else will: it never enters the
        // index.
        nr->state_.store(1 | kInvalid, std::memory_order_relaxed);
        bump(inval_in_use_, std::uint64_t{1});
        bump(deferred_, std::uint64_t{1});
      } else {
        bool merged = false;
        // Entries only enter the index by insertion: when the first walk met none in what is now
        // `want` (then want == rq) and nothing was inserted since, nothing overlaps it.
        if (overlaps != 0 || index_.insertions() != insertions0) {
          index_.forEachOverlap(want.start, want.end, [&](const Entry& o) {
            RegionImpl* r = o.region();
            const bool same = r->memType() == type && r->backend() == backend;
            if (markInvalid_locked(r, same ? DoomReason::kMerged : DoomReason::kStale)) {
              merged = merged || same;
            }
          });
        }
        if (merged) bump(merges_, std::uint64_t{1});
        if (!insert_locked(nr)) {
          nr->state_.store(1 | kInvalid, std::memory_order_relaxed);  // usable, never indexed
          bump(deferred_, std::uint64_t{1});
        }
        enforceUnused_locked();
      }
      if (evicted != nullptr) retireRegions_locked(evicted);
    }
    freeable = collect_locked(false);
  }
  freeList(freeable);
  if (nr == nullptr) {
    backend->dereg(reg);
    log(LogLevel::kDebug, kModule, "no memory for a region");
    return Status::kNoMemory;
  }
  if (attention_.load(std::memory_order_acquire) != 0) finishWork();
  *out = nr;
  return Status::kOk;
}

// Whether a miss may skip its first pass under the lock, because that pass would find nothing to
// do: no limit to make room under (regions, pinned bytes), no invalidation queued, no work
// waiting, and no entry of the index (valid or awaiting purge) overlapping the request, read in an
// epoch as a hit reads. The common miss (a new buffer) then takes the lock once, to insert.
// *seq0 and *insertions0 are read before the look: an invalidation applied or an entry inserted
// after it shows under the lock (rule 5; the overlap walk), as after the first pass. False when
// unsure (an insertion under way, a leaf that kept changing).
bool CacheImpl::bareMiss(const Range& rq, std::uint64_t* seq0,
                         std::uint64_t* insertions0) noexcept {
  if (config_.max_regions != SIZE_MAX || config_.max_pinned_bytes != SIZE_MAX) return false;
  ReaderSlot* slot = mySlot();
  if (slot == nullptr || attention_.load(std::memory_order_acquire) != 0) return false;
  *seq0 = queue_.applied();
  *insertions0 = index_.insertions();
  if ((*insertions0 & 1) != 0) return false;
  readerEnter(slot->epoch, reclaim_.slots.epoch());
  // The entry with the greatest start below the request's end: the entries are disjoint, so
  // nothing overlaps the request when it ends at or before the request's start.
  Entry e;
  std::uint64_t pos = slot->read_pos.load(std::memory_order_relaxed);
  const bool clear = index_.top()->floor(rq.end - 1, &e, &pos) &&
                     (e.word == 0 || (e.start <= rq.start && !e.reaches(rq.start + 1)));
  slot->epoch.store(0, std::memory_order_release);
  return clear;
}

// Indexes `r` (valid, held by its requester) once the entries it overlaps were marked invalid.
// False when it cannot (no memory, or an overlapped entry could not be purged): then it must never
// be indexed.
bool CacheImpl::insert_locked(RegionImpl* r) noexcept {
  if (!lru_.reserve(1) || !index_.insert(r)) return false;
  // Its requester releases it later, with a tick at least the current clock.
  lru_.push(r, lru_clock_.load(std::memory_order_relaxed));
  return true;
}

}  // namespace detail
}  // namespace gmd::rcache
