// Invalidation: invalidate() and how the queued ranges are applied, and what becomes of a region
// that leaves the index (merged away, stale, invalidated or evicted). See the notes at the top of
// cache.cc: invalidate() never blocks and never allocates; deregistration happens later, outside
// lock_.
#include "rcache/cache_impl.h"

namespace gmd::rcache {
namespace detail {

void CacheImpl::invalidate(const void* address, std::size_t length) noexcept {
  if (length == 0) return;
  Range r;
  if (!alignOutwards(address, length, config_.alignment, &r)) {
    // Reaches the top of the address space (or wraps): everything from the start up.
    r = Range{reinterpret_cast<std::uintptr_t>(address) & ~(config_.alignment - 1), UINTPTR_MAX};
  }
  // With the writer lock free, the range is applied at once (after what others queued): no
  // queue, and no raising of attention_, whose two read-modify-writes every other get() would
  // see. When invalidate() returns, the regions it overlaps are out of the index either way.
  if (lock_.try_lock()) {
    unparkAll_locked();
    applyQueued_locked(/*wait=*/false, &r);
    lock_.unlock();
    return;
  }
  attention_.fetch_add(1, std::memory_order_seq_cst);
  queue_.push(r);
  if (lock_.try_lock()) {
    unparkAll_locked();
    applyQueued_locked(/*wait=*/false);
    lock_.unlock();
  }
}

void CacheImpl::applyQueued_locked(bool wait, const Range* also) noexcept {
  std::uint64_t over = 0;
  doom_batch_ = DoomBatch{true, 0, 0};  // one update of the shared counters per drain
  auto apply = [&](Range r) {
    index_.forEachOverlap(r.start, r.end, [&](const Entry& e) {
      markInvalid_locked(e.region(), DoomReason::kInvalidated);
    });
  };
  const std::uint64_t n = queue_.drain(wait, apply, &over);
  if (also != nullptr) queue_.applyNow(*also, apply);
  if (doom_batch_.regions != 0) {
    dropUnused_locked(doom_batch_.bytes);
    bump(regions_, -doom_batch_.regions);
    bump(pinned_, -doom_batch_.bytes);
  }
  doom_batch_ = DoomBatch{};
  if (over != 0) bump(overflows_, over);
  if (n != 0) attention_.fetch_sub(n, std::memory_order_acq_rel);
}

// Takes `r` out of the index (logically: its leaf is rewritten later, by the index's purge()).
// Returns false if it already was. An unused region goes to the dead list; a held one is
// deregistered by its last put(). Never allocates (invalidate() calls it).
bool CacheImpl::markInvalid_locked(RegionImpl* r, DoomReason why) noexcept {
  const std::uint32_t prev = r->state_.fetch_or(kInvalid, std::memory_order_acq_rel);
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

// `r` just became invalid: it leaves the eviction order, and its entry is queued for purge.
void CacheImpl::leaveIndex_locked(RegionImpl* r) noexcept {
  lru_.remove(r);
  index_.queuePurge(r);
}

// Bookkeeping for a region that just became invalid with no holder: it leaves the counters and
// waits on the dead list for deregistration outside lock_.
void CacheImpl::doomUnused_locked(RegionImpl* r, DoomReason why) noexcept {
  const auto len = static_cast<std::int64_t>(r->length());
  if (doom_batch_.on) {
    ++doom_batch_.regions;
    doom_batch_.bytes += len;
  } else {
    dropUnused_locked(len);
    bump(regions_, std::int64_t{-1});
    bump(pinned_, -len);
  }
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

}  // namespace detail
}  // namespace gmd::rcache
