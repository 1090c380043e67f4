// Deferred work: dead regions (invalid, nobody holds them) wait on a list for their deregistration,
// which happens outside lock_ (finishWork(), from get(), put() and progress()); then they are
// retired, and freed once no reader can see them (reclaim.h). See the notes at the top of cache.cc.
#include "rcache/cache_impl.h"

namespace gmd::rcache::detail {

void CacheImpl::pushDead_locked(RegionImpl* r) noexcept {
  r->setNextDead(dead_);
  dead_ = r;
  if (!own_dead_) setWork_locked(true);
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

// `list` (linked by nextDead()) is deregistered. Once no leaf holds them they are retired (the
// record in their line: a retired region is on no list and out of the index's purge list, as
// in_index_ is false); those whose leaf cannot be rewritten now (no memory) wait on zombies_ for
// the next pass.
void CacheImpl::retireRegions_locked(RegionImpl* list) noexcept {
  // An invalid region whose entry is in a leaf is on the purge list (invariant 1a).
  if (index_.dirty()) index_.purge();
  for (RegionImpl* r = list; r != nullptr;) {
    RegionImpl* next = r->nextDead();
    if (r->in_index_) {
      r->setNextDead(zombies_);
      zombies_ = r;
      setWork_locked(true);
    } else {
      reclaim_.retire(r->retireRecord());
    }
    r = next;
  }
}

void CacheImpl::freeList(Reclaimed list) noexcept {
  for (Retired* x = list.objects; x != nullptr;) {
    Retired* next = x->next_retired;
    (void)IndexT::freeRetired(x);  // only leaves and tops retire as objects
    x = next;
  }
  freeRegions_locked(list.records);
}

void CacheImpl::freeRegions_locked(RetiredRecord* records) noexcept {
  for (RetiredRecord* rec = records; rec != nullptr;) {
    RetiredRecord* next = rec->next;
    freeRegion_locked(RegionImpl::ofRecord(rec));
    rec = next;
  }
}

// A registration made before a fork() is the parent's: the child never deregisters it.
void CacheImpl::deregister(RegionImpl* r) noexcept {
  if (r->ofForkGen(fork_gen_.load(std::memory_order_relaxed)))
    r->backend()->dereg(r->registration());
}

// Applies queued invalidations, deregisters dead regions (outside lock_) and frees what readers no
// longer see. Loops because a deregistration may itself raise invalidations (re-entrancy, rule 8).
__attribute__((noinline)) void CacheImpl::finishWork(bool force_collect) noexcept {
  for (;;) {
    RegionImpl* dead;
    Reclaimed freeable;
    {
      WriterGuard g(lock_);
      unparkAll_locked();
      applyQueued_locked();
      enforceUnused_locked();
      dead = takeDead_locked();
      if (zombies_ != nullptr) {
        RegionImpl* z = zombies_;
        zombies_ = nullptr;
        retireRegions_locked(z);
      }
      if (dead == nullptr && index_.dirty()) index_.purge();
      freeable = collect_locked(force_collect && dead == nullptr);
    }
    freeList(freeable);
    if (dead == nullptr) return;
    for (RegionImpl* r = dead; r != nullptr; r = r->nextDead()) deregister(r);
    {
      WriterGuard g(lock_);
      applyQueued_locked();
      retireRegions_locked(dead);
      freeable = collect_locked(force_collect);
    }
    freeList(freeable);
    // Nothing queued or dead since (the usual case): no need for another pass under the lock.
    if (!force_collect && attention_.load(std::memory_order_acquire) == 0) return;
  }
}

__attribute__((noinline)) void CacheImpl::releaseInvalid(RegionImpl* r) noexcept {
  r->backend()->dereg(r->registration());
  Reclaimed freeable;
  {
    WriterGuard g(lock_);
    bump(regions_, std::int64_t{-1});
    bump(pinned_, -static_cast<std::int64_t>(r->length()));
    r->setNextDead(nullptr);
    retireRegions_locked(r);
    freeable = collect_locked(false);
  }
  freeList(freeable);
}

void CacheImpl::progress() noexcept { finishWork(/*force_collect=*/true); }

}  // namespace gmd::rcache::detail
