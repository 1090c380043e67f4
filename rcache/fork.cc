// fork() (rule 9): the registry of live caches, the pthread_atfork handlers, and what a cache does
// in the child. See rcache/fork.h and docs/rcache.md, "fork()".
#include "rcache/fork.h"

#include <pthread.h>

#include <mutex>

#include "rcache/cache_impl.h"

namespace gmd::rcache::detail {
namespace {

// Live caches, for the fork handlers.
struct CacheRegistry {
  std::mutex mutex;
  CacheImpl* head = nullptr;
};
CacheRegistry& cacheRegistry() {
  static auto* r = new CacheRegistry;  // never destroyed: a fork may follow main()'s return
  return *r;
}

void atforkPrepare() {
  lockThreadRegistry();
  cacheRegistry().mutex.lock();
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkPrepare();
}

void atforkParent() {
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkParent();
  cacheRegistry().mutex.unlock();
  unlockThreadRegistry();
}

void atforkChild() {
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkChild();
  cacheRegistry().mutex.unlock();
  unlockThreadRegistry();
}

std::once_flag g_atfork_once;

}  // namespace

void installForkHandlers() noexcept {
  std::call_once(g_atfork_once, [] { pthread_atfork(atforkPrepare, atforkParent, atforkChild); });
}

void registerCache(CacheImpl* cache) noexcept {
  CacheRegistry& reg = cacheRegistry();
  std::lock_guard<std::mutex> g(reg.mutex);
  cache->reg_next_ = reg.head;
  if (reg.head != nullptr) reg.head->reg_prev_ = cache;
  reg.head = cache;
}

void unregisterCache(CacheImpl* cache) noexcept {
  CacheRegistry& reg = cacheRegistry();
  std::lock_guard<std::mutex> g(reg.mutex);
  if (cache->reg_prev_ != nullptr) {
    cache->reg_prev_->reg_next_ = cache->reg_next_;
  } else {
    reg.head = cache->reg_next_;
  }
  if (cache->reg_next_ != nullptr) cache->reg_next_->reg_prev_ = cache->reg_prev_;
}

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
  queue_.discard();
  IndexT::TopT* top = index_.detach();
  for (std::size_t i = 0; i < top->size; ++i) {
    IndexT::LeafT* leaf = top->leaf(i);
    for (std::size_t k = 0; k < leaf->size; ++k) {
      RegionImpl* reg = leaf->entries()[k].region;
      reg->in_index_ = false;
      reg->next_unindex_ = nullptr;
      const std::uint64_t prev = reg->state_.fetch_or(kInvalid, std::memory_order_relaxed);
      if ((prev & (kInvalid | kHolderMask)) == 0) pushDead_locked(reg);  // freed by the next pass
    }
    if (!IndexT::isEmptyLeaf(leaf)) index_.retire(leaf);
  }
  if (!IndexT::isEmptyTop(top)) index_.retire(top);
  lru_.clear();
  reclaim_.slots.forEach([](ReaderSlot& s) {
    s.epoch.store(0, std::memory_order_relaxed);
    s.unused_delta.store(0, std::memory_order_relaxed);
  });
  regions_.store(0, std::memory_order_relaxed);
  pinned_.store(0, std::memory_order_relaxed);
  unused_shared_.store(0, std::memory_order_relaxed);
  attention_.store(work_flag_ ? kWorkBit : 0, std::memory_order_relaxed);
  lock_.unlock();
}

}  // namespace gmd::rcache::detail
