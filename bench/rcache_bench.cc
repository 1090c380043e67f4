// Registration cache benchmarks: gmd's cache against UCX's ucs_rcache, side by side, both with the
// same no-op registration backend, so the ratios measure the caches alone.
//
//   RcacheHit_*            get + release of a cached 64 KiB range, one thread
//   RcacheCallFloor        RcacheHit_gmd's calls into a cache that does nothing: the interface's
//                          share of a hit
//   RcacheHitThreads_*     the same with 1, 2 and 4 threads, each thread on its own 64 KiB buffer
//   RcacheHitTwo_*         get + release of two cached 64 KiB ranges in turn, one thread: gmd's
//                          thread keeps its parked hold (docs/rcache.md) on one of them, so every
//                          other hit searches the index and takes and drops a hold of its own
//   RcacheMiss_*           a new region each time, registered and released: get (a miss),
//   invalidate
//                          the region while held, release (which deregisters it), so that every
//                          get is a real miss and both caches stay empty
//   RcacheInvalidate_*     invalidate a range covering 64 cached regions, then one hit on another
//                          range (which is where ucs_rcache applies queued invalidations)
//   RcacheMissLarge_*/N    RcacheMiss with N unused one-page regions already cached (the new page
//                          lies between two of them), so the cost of a miss and an invalidation
//                          as the index grows
//   RcacheEvictLarge_*/N   a cache limited to N regions, full of N unused ones: every get is a
//                          miss that must evict the least recently released region, then release
//   RcacheHitLargeN_*/N    RcacheHit on one region among N cached ones; its bytes/region counter
//                          is the heap (malloc, headers included) the N regions took
//
// gmd's single-thread hit rows also report hits and locked/hit, the share of those hits the writer
// lock answered instead of the lock-free path (Stats::locked_hits; 0 in a healthy run).
//
// ucs_rcache receives its invalidation through libucm's event dispatch (ucm_vm_munmap, with the
// unmap event declared external so that no hook is installed); gmd through Cache::invalidate().
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <malloc.h>
#include <sys/mman.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <utility>

#include "bench/ucs_compat.h"
#include "gtest/common/fake_backend.h"
#include "rcache/rcache.h"

namespace gmd::bench {
std::unique_ptr<rcache::Cache> makeStubCache(rcache::Region* region);  // bench/rcache_stub.cc
}  // namespace gmd::bench

namespace {

using gmd::MemType;
namespace rc = gmd::rcache;

constexpr std::size_t kHitLength = 64 * 1024;
constexpr std::size_t kMissLength = 4096;
constexpr std::size_t kMissStride = 8192;
constexpr std::size_t kMissRanges = 16384;  // cycled
constexpr int kInvRegions = 64;
constexpr int kUcmEventVmUnmapped = 1 << 17;  // UCM_EVENT_VM_UNMAPPED

// One arena of real memory for every benchmark (ucs_rcache may inspect the mappings).
char* arena() {
  static char* a = [] {
    const std::size_t len = std::size_t{1} << 30;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap arena");
      std::abort();
    }
    return static_cast<char*>(p);
  }();
  return a;
}
char* hitBuffer(int thread) { return arena() + static_cast<std::size_t>(thread) * (1 << 20); }
char* missBase() { return arena() + (std::size_t{64} << 20); }
char* invBase() { return arena() + (std::size_t{512} << 20); }

// The large-cache benchmarks use their own reserved (never touched) range: up to 2 x 100,000
// one-page regions, two pages apart.
constexpr std::size_t kLargeStride = 2 * 4096;
char* largeArena() {
  static char* a = [] {
    const std::size_t len = std::size_t{4} << 30;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap large arena");
      std::abort();
    }
    return static_cast<char*>(p);
  }();
  return a;
}
// Slot k of the large arena: even pages hold the cached regions, odd ones the misses.
char* largeSlot(std::size_t k) { return largeArena() + k * kLargeStride; }
char* largeGap(std::size_t k) { return largeSlot(k) + 4096; }

// ---- gmd
// ------------------------------------------------------------------------------------------

// The tests' fake backend without its oracle: registration and deregistration cost nothing.
gmd::test::FakeBackend g_nop(gmd::test::FakeBackend::kNoOracle, "nop");

std::unique_ptr<rc::Cache> makeGmd(std::size_t max_regions = SIZE_MAX,
                                   std::size_t max_unused_bytes = rc::Config{}.max_unused_bytes) {
  rc::Config cfg;
  cfg.max_regions = max_regions;
  cfg.max_unused_bytes = max_unused_bytes;
  std::unique_ptr<rc::Cache> c;
  if (rc::Cache::create(cfg, &c) != rc::Status::kOk) std::abort();
  return c;
}

inline rc::Region* gmdGet(rc::Cache* c, void* p, std::size_t len) {
  rc::Region* r = nullptr;
  if (c->get(p, len, rc::kAccessLocalRead | rc::kAccessRemoteWrite, MemType::kHost, &g_nop, &r) !=
      rc::Status::kOk) {
    std::abort();
  }
  return r;
}

// ---- ucs_rcache
// -----------------------------------------------------------------------------------

// Registrations and deregistrations ucs_rcache asked for (the benchmarks are single-threaded).
std::uint64_t g_ucs_regs = 0;
std::uint64_t g_ucs_deregs = 0;

ucs_status_t ucsNopReg(void*, ucs_rcache_t*, void*, ucs_rcache_region_t*, uint16_t) {
  ++g_ucs_regs;
  return UCS_OK;
}
void ucsNopDereg(void*, ucs_rcache_t*, ucs_rcache_region_t*) { ++g_ucs_deregs; }
void ucsNopDump(void*, ucs_rcache_t*, ucs_rcache_region_t*, char* buf, size_t max) {
  if (max > 0) buf[0] = '\0';
}
const ucs_rcache_ops_t kUcsOps = {
    .mem_reg = ucsNopReg, .mem_dereg = ucsNopDereg, .dump_region = ucsNopDump};

struct UcmApi {
  void (*set_external_event)(int) = nullptr;
  void (*vm_munmap)(void*, size_t) = nullptr;
};
// libucm comes with libucs; reach it without linking it (the bench links ucx::ucs only).
const UcmApi& ucm() {
  static UcmApi api = [] {
    UcmApi a;
    a.set_external_event =
        reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "ucm_set_external_event"));
    a.vm_munmap = reinterpret_cast<void (*)(void*, size_t)>(dlsym(RTLD_DEFAULT, "ucm_vm_munmap"));
    if (a.set_external_event == nullptr || a.vm_munmap == nullptr) {
      std::fprintf(stderr, "libucm symbols not found\n");
      std::abort();
    }
    a.set_external_event(kUcmEventVmUnmapped);
    return a;
  }();
  return api;
}

// ucs_rcache 1.13 applies max_regions (LRU eviction) only to caches created without
// UCS_RCACHE_FLAG_NO_PFN_CHECK; with UCX's default UCX_RCACHE_CHECK_PFN=0 no page frame is checked
// either way, so the eviction benchmark drops the flag.
ucs_rcache_t* makeUcs(unsigned long max_regions = ULONG_MAX, bool evict = false) {
  ucm();
  ucs_rcache_params_t p = {};
  p.region_struct_size = sizeof(ucs_rcache_region_t);
  p.ucm_events = kUcmEventVmUnmapped;
  p.ucm_event_priority = 1000;
  p.ops = &kUcsOps;
  p.context = nullptr;
  p.flags = evict ? 0 : UCS_RCACHE_FLAG_NO_PFN_CHECK;
  p.max_regions = max_regions;
  p.max_size = SIZE_MAX;
  p.max_unreleased = SIZE_MAX;
  gmd::bench::ucsRcacheParams(p, UCS_RCACHE_MIN_ALIGNMENT, 4096);
  ucs_rcache_t* rcache = nullptr;
  if (ucs_rcache_create(&p, "bench", nullptr, &rcache) != UCS_OK) std::abort();
  return rcache;
}

inline ucs_rcache_region_t* ucsGet(ucs_rcache_t* c, void* p, std::size_t len) {
  ucs_rcache_region_t* r = nullptr;
  if (gmd::bench::ucsRcacheGet(c, p, len, UCS_RCACHE_MIN_ALIGNMENT, &r) != UCS_OK) std::abort();
  return r;
}

// ---- Hit
// ------------------------------------------------------------------------------------------

// The hits a run of gmd's cache took (since `before`), and the share of them the writer lock
// answered: 0 when every hit was lock-free, as it should be here (a hit under the lock costs
// several lock-free ones; Stats::locked_hits).
void hitCounters(benchmark::State& state, rc::Cache* c, const rc::Stats& before) {
  const rc::Stats s = c->stats();
  const auto hits = static_cast<double>(s.hits - before.hits);
  state.counters["hits"] = hits;
  state.counters["locked/hit"] =
      hits > 0 ? static_cast<double>(s.locked_hits - before.locked_hits) / hits : 0.0;
}

void RcacheHit_gmd(benchmark::State& state) {
  auto c = makeGmd();
  c->put(gmdGet(c.get(), hitBuffer(0), kHitLength));
  const rc::Stats before = c->stats();
  for (auto _ : state) {
    rc::Region* r = gmdGet(c.get(), hitBuffer(0), kHitLength);
    benchmark::DoNotOptimize(r);
    c->put(r);
  }
  hitCounters(state, c.get(), before);
}
BENCHMARK(RcacheHit_gmd);

void RcacheHit_ucs(benchmark::State& state) {
  ucs_rcache_t* c = makeUcs();
  ucs_rcache_region_put(c, ucsGet(c, hitBuffer(0), kHitLength));
  for (auto _ : state) {
    ucs_rcache_region_t* r = ucsGet(c, hitBuffer(0), kHitLength);
    benchmark::DoNotOptimize(r);
    ucs_rcache_region_put(c, r);
  }
  ucs_rcache_destroy(c);
}
BENCHMARK(RcacheHit_ucs);

// RcacheHit_gmd's calls into a cache that does nothing (bench/rcache_stub.cc): the part of a hit
// that is the interface (two virtual calls, the resolver, the result) and the loop, whatever the
// cache behind it does.
void RcacheCallFloor(benchmark::State& state) {
  auto c = gmd::bench::makeStubCache(reinterpret_cast<rc::Region*>(hitBuffer(0)));
  for (auto _ : state) {
    rc::Region* r = gmdGet(c.get(), hitBuffer(0), kHitLength);
    benchmark::DoNotOptimize(r);
    c->put(r);
  }
}
BENCHMARK(RcacheCallFloor);

// Two buffers in turn; each iteration is one get + release (the counter and times are per hit).
void RcacheHitTwo_gmd(benchmark::State& state) {
  auto c = makeGmd();
  char* const bufs[2] = {hitBuffer(0), hitBuffer(1)};
  for (char* b : bufs) c->put(gmdGet(c.get(), b, kHitLength));
  const rc::Stats before = c->stats();
  unsigned i = 0;
  for (auto _ : state) {
    rc::Region* r = gmdGet(c.get(), bufs[i++ & 1], kHitLength);
    benchmark::DoNotOptimize(r);
    c->put(r);
  }
  hitCounters(state, c.get(), before);
}
BENCHMARK(RcacheHitTwo_gmd);

void RcacheHitTwo_ucs(benchmark::State& state) {
  ucs_rcache_t* c = makeUcs();
  char* const bufs[2] = {hitBuffer(0), hitBuffer(1)};
  for (char* b : bufs) ucs_rcache_region_put(c, ucsGet(c, b, kHitLength));
  unsigned i = 0;
  for (auto _ : state) {
    ucs_rcache_region_t* r = ucsGet(c, bufs[i++ & 1], kHitLength);
    benchmark::DoNotOptimize(r);
    ucs_rcache_region_put(c, r);
  }
  ucs_rcache_destroy(c);
}
BENCHMARK(RcacheHitTwo_ucs);

// ---- Hit, several threads on one cache, each on its own buffer ----------------------------------

rc::Cache* sharedGmd() {
  static rc::Cache* c = makeGmd().release();  // lives for the process
  return c;
}
ucs_rcache_t* sharedUcs() {
  static ucs_rcache_t* c = makeUcs();
  return c;
}

void RcacheHitThreads_gmd(benchmark::State& state) {
  rc::Cache* c = sharedGmd();
  char* buf = hitBuffer(state.thread_index() + 1);
  c->put(gmdGet(c, buf, kHitLength));
  for (auto _ : state) {
    rc::Region* r = gmdGet(c, buf, kHitLength);
    benchmark::DoNotOptimize(r);
    c->put(r);
  }
}
BENCHMARK(RcacheHitThreads_gmd)->Threads(1)->Threads(2)->Threads(4);

void RcacheHitThreads_ucs(benchmark::State& state) {
  ucs_rcache_t* c = sharedUcs();
  char* buf = hitBuffer(state.thread_index() + 1);
  ucs_rcache_region_put(c, ucsGet(c, buf, kHitLength));
  for (auto _ : state) {
    ucs_rcache_region_t* r = ucsGet(c, buf, kHitLength);
    benchmark::DoNotOptimize(r);
    ucs_rcache_region_put(c, r);
  }
}
BENCHMARK(RcacheHitThreads_ucs)->Threads(1)->Threads(2)->Threads(4);

// ---- Miss
// -----------------------------------------------------------------------------------------

void RcacheMiss_gmd(benchmark::State& state) {
  auto c = makeGmd();
  std::size_t i = 0;
  for (auto _ : state) {
    char* p = missBase() + (i++ % kMissRanges) * kMissStride;
    rc::Region* r = gmdGet(c.get(), p, kMissLength);
    c->invalidate(p, kMissLength);
    c->put(r);
  }
  const rc::Stats s = c->stats();
  state.counters["misses"] = static_cast<double>(s.misses);
  state.counters["regions"] = static_cast<double>(s.regions);
}
BENCHMARK(RcacheMiss_gmd);

void ucsInvalidated(void*) {}

void RcacheMiss_ucs(benchmark::State& state) {
  ucs_rcache_t* c = makeUcs();
  std::size_t i = 0;
  for (auto _ : state) {
    char* p = missBase() + (i++ % kMissRanges) * kMissStride;
    ucs_rcache_region_t* r = ucsGet(c, p, kMissLength);
    ucs_rcache_region_invalidate(c, r, ucsInvalidated, nullptr);
    ucs_rcache_region_put(c, r);
  }
  ucs_rcache_destroy(c);
}
BENCHMARK(RcacheMiss_ucs);

// ---- Invalidate
// -----------------------------------------------------------------------------------

// 64 one-page regions, one page apart: the invalidated range covers 128 pages.
char* invRegion(int k) { return invBase() + static_cast<std::size_t>(k) * 2 * 4096; }
constexpr std::size_t kInvSpan = static_cast<std::size_t>(kInvRegions) * 2 * 4096;

void RcacheInvalidate_gmd(benchmark::State& state) {
  auto c = makeGmd();
  char* other = hitBuffer(0);
  c->put(gmdGet(c.get(), other, kHitLength));
  for (auto _ : state) {
    state.PauseTiming();
    for (int k = 0; k < kInvRegions; ++k) c->put(gmdGet(c.get(), invRegion(k), 4096));
    state.ResumeTiming();
    c->invalidate(invBase(), kInvSpan);
    c->put(gmdGet(c.get(), other, kHitLength));
  }
  state.counters["inval_unused"] = static_cast<double>(c->stats().invalidations_unused);
}
BENCHMARK(RcacheInvalidate_gmd);

void RcacheInvalidate_ucs(benchmark::State& state) {
  ucs_rcache_t* c = makeUcs();
  char* other = hitBuffer(0);
  ucs_rcache_region_put(c, ucsGet(c, other, kHitLength));
  for (auto _ : state) {
    state.PauseTiming();
    for (int k = 0; k < kInvRegions; ++k) ucs_rcache_region_put(c, ucsGet(c, invRegion(k), 4096));
    state.ResumeTiming();
    ucm().vm_munmap(invBase(), kInvSpan);
    ucs_rcache_region_put(c, ucsGet(c, other, kHitLength));
  }
  ucs_rcache_destroy(c);
}
BENCHMARK(RcacheInvalidate_ucs);

// ---- Large caches
// ---------------------------------------------------------------------------------

// Populating 100,000 regions takes a while, and Google Benchmark calls a benchmark function several
// times (to size its iteration count, then per repetition): each cache is built once per process
// and N, and every iteration leaves it as it found it (N unused regions).
struct LargeGmd {
  std::unique_ptr<rc::Cache> cache;
  std::size_t next = 0;           // eviction: next slot to register
  double bytes_per_region = 0.0;  // heap the N regions took (heapInUse()), per region
};
struct LargeUcs {
  ucs_rcache_t* cache = nullptr;
  std::size_t next = 0;
  double bytes_per_region = 0.0;
};

// Bytes the process has allocated from malloc (small chunks and mmap()ed ones), allocator headers
// included: what populating a cache adds is its memory per region (index, region, LRU).
double heapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd);
}

// N unused regions in slots 0..N-1, released in slot order (slot 0 is the least recently used).
LargeGmd& largeGmd(std::size_t n, bool limited) {
  static std::map<std::pair<std::size_t, bool>, LargeGmd> caches;
  LargeGmd& l = caches[{n, limited}];
  if (!l.cache) {
    const double before = heapInUse();
    l.cache = makeGmd(limited ? n : SIZE_MAX, SIZE_MAX);
    for (std::size_t k = 0; k < n; ++k) l.cache->put(gmdGet(l.cache.get(), largeSlot(k), 4096));
    l.cache->progress();  // frees the leaves and tops that the insertions replaced
    l.bytes_per_region = (heapInUse() - before) / static_cast<double>(n);
    l.next = n;
  }
  return l;
}
LargeUcs& largeUcs(std::size_t n, bool limited) {
  static std::map<std::pair<std::size_t, bool>, LargeUcs> caches;
  LargeUcs& l = caches[{n, limited}];
  if (l.cache == nullptr) {
    const double before = heapInUse();
    l.cache = makeUcs(limited ? n : ULONG_MAX, limited);
    for (std::size_t k = 0; k < n; ++k)
      ucs_rcache_region_put(l.cache, ucsGet(l.cache, largeSlot(k), 4096));
    l.bytes_per_region = (heapInUse() - before) / static_cast<double>(n);
    l.next = n;
  }
  return l;
}

void RcacheMissLarge_gmd(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  rc::Cache* c = largeGmd(n, false).cache.get();
  std::size_t i = 0;
  for (auto _ : state) {
    char* p = largeGap((i++ * 7919) % n);  // spread over the index
    rc::Region* r = gmdGet(c, p, 4096);
    c->invalidate(p, 4096);
    c->put(r);
  }
  state.counters["regions"] = static_cast<double>(c->stats().regions);
}
BENCHMARK(RcacheMissLarge_gmd)->Arg(1000)->Arg(10000)->Arg(100000);

void RcacheMissLarge_ucs(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  ucs_rcache_t* c = largeUcs(n, false).cache;
  std::size_t i = 0;
  for (auto _ : state) {
    char* p = largeGap((i++ * 7919) % n);
    ucs_rcache_region_t* r = ucsGet(c, p, 4096);
    ucs_rcache_region_invalidate(c, r, ucsInvalidated, nullptr);
    ucs_rcache_region_put(c, r);
  }
}
BENCHMARK(RcacheMissLarge_ucs)->Arg(1000)->Arg(10000)->Arg(100000);

// Slots cycle over 2N: iteration i registers slot (N + i) mod 2N, which is not cached (the cache
// holds the N slots released before it), and evicts the least recently released one.
void RcacheEvictLarge_gmd(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  LargeGmd& l = largeGmd(n, true);
  rc::Cache* c = l.cache.get();
  const std::uint64_t ev0 = c->stats().evictions;
  for (auto _ : state) {
    c->put(gmdGet(c, largeSlot(l.next++ % (2 * n)), 4096));
  }
  const rc::Stats s = c->stats();
  state.counters["evictions/iter"] = benchmark::Counter(static_cast<double>(s.evictions - ev0) /
                                                        static_cast<double>(state.iterations()));
  state.counters["regions"] = static_cast<double>(s.regions);
}
BENCHMARK(RcacheEvictLarge_gmd)->Arg(1000)->Arg(10000)->Arg(100000);

void RcacheEvictLarge_ucs(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  LargeUcs& l = largeUcs(n, true);
  const std::uint64_t regs0 = g_ucs_regs, deregs0 = g_ucs_deregs;
  for (auto _ : state) {
    ucs_rcache_region_put(l.cache, ucsGet(l.cache, largeSlot(l.next++ % (2 * n)), 4096));
  }
  const auto iters = static_cast<double>(state.iterations());
  state.counters["regs/iter"] = static_cast<double>(g_ucs_regs - regs0) / iters;
  state.counters["deregs/iter"] = static_cast<double>(g_ucs_deregs - deregs0) / iters;
}
BENCHMARK(RcacheEvictLarge_ucs)->Arg(1000)->Arg(10000)->Arg(100000);

void RcacheHitLargeN_gmd(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  LargeGmd& l = largeGmd(n, false);
  rc::Cache* c = l.cache.get();
  state.counters["bytes/region"] = l.bytes_per_region;
  char* p = largeSlot(n / 2);
  const rc::Stats before = c->stats();
  for (auto _ : state) {
    rc::Region* r = gmdGet(c, p, 4096);
    benchmark::DoNotOptimize(r);
    c->put(r);
  }
  hitCounters(state, c, before);
}
BENCHMARK(RcacheHitLargeN_gmd)->Arg(100000);

void RcacheHitLargeN_ucs(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  LargeUcs& l = largeUcs(n, false);
  ucs_rcache_t* c = l.cache;
  state.counters["bytes/region"] = l.bytes_per_region;
  char* p = largeSlot(n / 2);
  for (auto _ : state) {
    ucs_rcache_region_t* r = ucsGet(c, p, 4096);
    benchmark::DoNotOptimize(r);
    ucs_rcache_region_put(c, r);
  }
}
BENCHMARK(RcacheHitLargeN_ucs)->Arg(100000);

}  // namespace
