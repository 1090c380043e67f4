// fork() (rule 9): the registry of live caches, the pthread_atfork handlers, and what a cache does
// in the child. See rcache/fork.h and docs/rcache.md, "fork()".
#include "rcache/fork.h"

#include <pthread.h>

#include <mutex>
#include <new>

#include "common/log.h"
#include "rcache/cache_impl.h"

namespace gmd::rcache::detail {
namespace {

// Live caches, for the fork handlers. In static storage, never destroyed (a fork may follow
// main()'s return), and never on the heap: the child handler unlocks its mutex, and a heap page may
// be do-not-fork when it shares a page with a registered buffer.
struct CacheRegistry {
  std::mutex mutex;
  CacheImpl* head = nullptr;
};
alignas(CacheRegistry) unsigned char g_registry_storage[sizeof(CacheRegistry)];
CacheRegistry& cacheRegistry() {
  static CacheRegistry* r = new (g_registry_storage) CacheRegistry;
  return *r;
}

void atforkPrepare() {
  // First, with no cache locked: drop what nobody holds (deregistration happens outside lock_,
  // and a backend's deregistration may raise invalidations that try-lock it).
  {
    std::lock_guard<std::mutex> g(cacheRegistry().mutex);
    for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) {
      c->dropUnusedBeforeFork();
    }
  }
  lockThreadRegistry();
  cacheRegistry().mutex.lock();
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkPrepare();
  lockLeafPoolsForFork();
  SpanTable::lockForFork();  // last: a region pool takes it under its own lock when it grows
}

void atforkParent() {
  SpanTable::unlockAfterFork();
  unlockLeafPoolsAfterFork();
  for (CacheImpl* c = cacheRegistry().head; c != nullptr; c = c->reg_next_) c->forkParent();
  cacheRegistry().mutex.unlock();
  unlockThreadRegistry();
}

void atforkChild() {
  SpanTable::unlockAfterFork();  // static storage
  unlockLeafPoolsAfterFork();    // static storage
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

// Before fork() (parent, no lock held): what nobody holds is evicted and deregistered now, as UCX's
// own cache does. With ibv_fork_init() every registered page is do-not-fork: a cached unused
// registration would take the application's heap that shares its pages away from the child.
void CacheImpl::dropUnusedBeforeFork() noexcept {
  if (!config_.purge_on_fork) return;
  std::size_t n;
  {
    WriterGuard g(lock_);
    unparkAll_locked();
    applyQueued_locked();
    n = evictAllUnused_locked();
  }
  finishWork(/*force_collect=*/true);
  if (n != 0) log(LogLevel::kDebug, "rcache", "fork: dropped %zu unused registrations", n);
}

// In the child, only the forking thread exists and lock_ is held by it (taken in forkPrepare()).
// The child must never hand out nor deregister the parent's registrations, and must touch nothing
// the parent allocated elsewhere than on the cache's own pages: a heap page that shares a page
// with a buffer the parent holds registered is absent in the child (MADV_DONTFORK). So the parent's
// index, regions, dead and retired lists and eviction order are abandoned, unread (they leak in the
// child: only what the parent held registered at fork is left, the rest was dropped by
// dropUnusedBeforeFork()). Only this object (its own pages, see operator new) and the reader slots
// (their own pages too) are written. No allocation here.
void CacheImpl::forkChild() noexcept {
  if (!config_.purge_on_fork) {
    lock_.unlockInForkChild();
    return;
  }
  // From here on every existing region belongs to an older generation: deregister(), put() and
  // releaseInvalid() skip the backend and the counters for it.
  fork_gen_.fetch_add(1, std::memory_order_relaxed);
  queue_.discard();
  (void)index_.detach();
  lru_.abandon();
  region_pool_.abandon();  // the parent's regions live there
  (void)reclaim_.retired.takeAll();
  dead_ = nullptr;
  zombies_ = nullptr;
  work_flag_ = false;
  reclaim_.slots.forEach([](ReaderSlot& s) {
    s.epoch.store(0, std::memory_order_relaxed);
    s.unused_delta.store(0, std::memory_order_relaxed);
    s.parked.store(nullptr, std::memory_order_relaxed);  // the parent's region: abandoned
  });
  regions_.store(0, std::memory_order_relaxed);
  pinned_.store(0, std::memory_order_relaxed);
  unused_shared_.store(0, std::memory_order_relaxed);
  attention_.store(0, std::memory_order_relaxed);
  lock_.unlockInForkChild();
}

}  // namespace gmd::rcache::detail
