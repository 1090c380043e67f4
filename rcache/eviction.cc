// Limits and eviction (rule 6): least recently released unused region first, through the writers'
// eviction order (lru_queue.h). Every function here requires CacheImpl::lock_.
#include "common/log.h"
#include "rcache/cache_impl.h"

namespace gmd::rcache::detail {
namespace {
constexpr const char* kModule = "rcache";
}  // namespace

// Takes the minimum until it is an unused region whose key is its current release tick (the
// oldest, as every key is at most its region's tick but for the case in docs/rcache.md, "LRU").
// Held regions are set aside and come back keyed by the current clock: they are released later.
// False when no unused region is left, or (no memory) the order could not take a region back.
bool CacheImpl::evictOne_locked() noexcept {
  RegionImpl* skipped = nullptr;  // linked by nextDead() (valid regions are on no dead list)
  std::size_t n_skipped = 0;      // each has room reserved for its return
  bool evicted = false, no_room = false;
  while (lru_.size() != 0) {
    const LruQueue<RegionImpl>::Item top = lru_.top();
    RegionImpl* r = top.region;
    const std::uint32_t state = r->state_.load(std::memory_order_acquire);
    if ((state & kInvalid) != 0) {  // cannot happen: invalid regions leave the order at once
      lru_.remove(r);
      continue;
    }
    if ((state & kHolderMask) != 0) {
      if ((no_room = !lru_.reserve(n_skipped + 1))) break;
      lru_.remove(r);
      r->setNextDead(skipped);
      skipped = r;
      ++n_skipped;
      continue;
    }
    const std::uint64_t tick = r->last_used_.load(std::memory_order_relaxed);
    if (tick > top.key) {  // released again since it was keyed
      if ((no_room = !lru_.reserve(n_skipped + 1))) break;
      lru_.update(r, tick);
      continue;
    }
    std::uint32_t unused_valid = 0;
    if (r->state_.compare_exchange_strong(unused_valid, kInvalid, std::memory_order_acq_rel)) {
      leaveIndex_locked(r);
      doomUnused_locked(r, DoomReason::kEvicted);
      evicted = true;
      // The next victim, most often: its line is cold in a big cache, and the next miss reads it.
      if (lru_.size() != 0) {
        RegionImpl* next = lru_.top().region;
        __builtin_prefetch(next);
      }
      break;
    }
    // A reader took it meanwhile: it is held now, look again.
  }
  const std::uint64_t now = lru_clock_.load(std::memory_order_relaxed);
  while (skipped != nullptr) {
    RegionImpl* r = skipped;
    skipped = r->nextDead();
    r->setNextDead(nullptr);
    // Room was reserved. A region released meanwhile keeps its tick.
    const bool unused = (r->state_.load(std::memory_order_acquire) & kHolderMask) == 0;
    lru_.push(r, unused ? r->last_used_.load(std::memory_order_relaxed) : now);
  }
  if (no_room) log(LogLevel::kDebug, kModule, "eviction stopped: no memory for the eviction order");
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

}  // namespace gmd::rcache::detail
