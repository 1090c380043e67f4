// fork() handling of the registration cache (internal to rcache/; rule 9, docs/rcache.md "fork()").
//
// Every live cache is on one registry. pthread_atfork handlers, installed once by the first
// Cache::create(), take the thread registry mutex, the registry mutex and every cache's writer
// lock before fork(), release them in the parent, and in the child let each cache drop the
// parent's regions (CacheImpl::forkChild(), defined in fork.cc) before releasing them.
//
// Thread safety: all functions from any thread; the handlers run in the forking thread.
#pragma once

namespace gmd::rcache::detail {

class CacheImpl;

void installForkHandlers() noexcept;
void registerCache(CacheImpl* cache) noexcept;
void unregisterCache(CacheImpl* cache) noexcept;

}  // namespace gmd::rcache::detail
