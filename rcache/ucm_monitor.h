// Invalidation source backed by UCX's libucm: memory-unmap events (munmap, mremap, shmdt, brk
// shrink, madvise DONTNEED/FREE/REMOVE, mmap MAP_FIXED over a mapping) become
// InvalidationSink::invalidate(). Lives in its own target, gmd_rcache_ucm, so that gmd_rcache stays
// UCX-free.
//
// Thread safety: subscribe()/unsubscribe() from any thread; events are delivered on the thread that
// unmaps, before the memory goes away, possibly while that thread is inside the cache. Subscribing
// the first sink makes libucm install its hooks.
#pragma once

#include "rcache/rcache.h"

namespace gmd::rcache {

class UcmMonitor final : public Monitor {
 public:
  // Priority of our handler among libucm's (dispatched low to high); UCX's own caches use 1000.
  static constexpr int kDefaultPriority = 1000;

  explicit UcmMonitor(int priority = kDefaultPriority) noexcept : priority_(priority) {}
  ~UcmMonitor() override = default;  // sinks must have been unsubscribed

  // kUnsupported when libucm cannot deliver the event (hooks could not be installed).
  Status subscribe(InvalidationSink* sink) noexcept override;
  void unsubscribe(InvalidationSink* sink) noexcept override;
  int priority() const noexcept { return priority_; }

 private:
  const int priority_;
};

}  // namespace gmd::rcache
