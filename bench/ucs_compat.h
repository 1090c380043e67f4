// bench/ucs_compat.h — the few calls of UCX's own caches (ucs_rcache, the memtype cache) whose
// signatures differ between the UCX releases gmd supports (1.13, 1.18, 1.22–1.23), so the
// benchmarks drive the reference cache of whichever UCX they are built against.
//
// What changed after 1.13 (read from UCX's release tags): from 1.16 the memtype cache's lock is a
// spinlock; from 1.17 ucs_rcache_get() takes the alignment per call instead of the create
// parameters; from 1.18 the ops table has an (optional) merge callback; from 1.22
// ucs_memtype_cache_update() takes memory flags. The caches are created as UCX's IB MD creates its
// own (no UCS_RCACHE_FLAG_NEED_LRU_LOCK from 1.21 on: the LRU lock is off where max_regions is
// unlimited either way).
//
// Thread-safety: stateless helpers.
#pragma once

#include <sys/mman.h>
#include <uct/api/version.h>

#include <cstddef>

// Neither ucs/memory/rcache.h (1.13) nor ucs/datastruct/pgtable.h (included by memtype_cache.h) has
// C++ guards of its own.
extern "C" {
#include <ucs/datastruct/pgtable.h>
#include <ucs/memory/rcache.h>
}
#include <ucs/memory/memtype_cache.h>

namespace gmd::bench {

#define GMD_BENCH_UCX_AT_LEAST(minor) (UCT_VERNO_MAJOR > 1 || UCT_VERNO_MINOR >= (minor))

// Sets the alignment fields where this release keeps them in the create parameters.
inline void ucsRcacheParams(ucs_rcache_params_t& p, std::size_t align, std::size_t max_align) {
#if GMD_BENCH_UCX_AT_LEAST(17)
  (void)p;
  (void)align;
  (void)max_align;
#else
  p.alignment = align;
  p.max_alignment = max_align;
#endif
}

inline ucs_status_t ucsRcacheGet(ucs_rcache_t* c, void* addr, std::size_t len, std::size_t align,
                                 ucs_rcache_region_t** r) {
#if GMD_BENCH_UCX_AT_LEAST(17)
  return ucs_rcache_get(c, addr, len, align, PROT_READ | PROT_WRITE, nullptr, r);
#else
  (void)align;
  return ucs_rcache_get(c, addr, len, PROT_READ | PROT_WRITE, nullptr, r);
#endif
}

// Initialises the lock of a memtype cache the benchmark builds itself.
inline bool ucsMemtypeCacheLockInit(ucs_memtype_cache_t& cache) {
#if GMD_BENCH_UCX_AT_LEAST(16)
  return ucs_spinlock_init(&cache.lock, 0) == UCS_OK;
#else
  return pthread_rwlock_init(&cache.lock, nullptr) == 0;
#endif
}

inline void ucsMemtypeCacheUpdate(const void* addr, std::size_t len, ucs_memory_type_t type) {
#if GMD_BENCH_UCX_AT_LEAST(22)
  ucs_memtype_cache_update(addr, len, type, UCS_SYS_DEVICE_ID_UNKNOWN, 0);
#else
  ucs_memtype_cache_update(addr, len, type, UCS_SYS_DEVICE_ID_UNKNOWN);
#endif
}

}  // namespace gmd::bench
