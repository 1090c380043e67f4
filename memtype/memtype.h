// gmd memory-type classification: host, CUDA device or CUDA managed. UCX-free.
//
// The CUDA driver is loaded at run time (dlopen libcuda.so.1, or the file named by the environment
// variable GMD_CUDA_DRIVER_PATH, used by the tests). Without a driver or a device, classify() answers
// kHost at near-zero cost (one atomic load) and logs nothing above debug level. Builds configured with
// GMD_WITH_CUDA=OFF never look for a driver.
//
// Known device allocations are kept in a range cache (base, size, device, buffer ID). An unknown
// pointer costs one driver query (cuPointerGetAttributes); device and managed answers are cached, host
// answers are not (host address space is reused by mmap without telling the driver).
//
// CUDA frees are seen through hooks on the driver's and the runtime's free entry points (see
// memtype/README.md for the mechanism and its limits). Each free removes the range from the cache and
// calls every subscriber on the freeing thread before the free reaches the driver.
//
// Thread safety: all methods may be called from any thread; classify() on a known range takes no
// exclusive lock. Free subscribers are called synchronously on the freeing thread, before the memory
// can be reused, and must be hook-safe: no allocation, no blocking lock, no call back into the
// Classifier (classify() included) and no unsubscribe() from inside the callback.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/mem_type.h"

namespace gmd::memtype {

struct Info {
  MemType type = MemType::kHost;
  std::uintptr_t base = 0;     // allocation base (0 for host)
  std::size_t size = 0;        // allocation size (0 for host)
  int device = -1;             // CUDA device ordinal, -1 for host
  std::uint64_t buffer_id = 0; // CU_POINTER_ATTRIBUTE_BUFFER_ID, 0 when unknown
};

// How CUDA frees are noticed. The values index kFreeModeNames, which is also the table md/'s
// UCX_GMD_CUDA_FREE_MODE is parsed with (the parser stores the index: no name round trip).
enum class FreeMode : std::uint8_t {
  kHooks = 0,             // intercept the driver's free entry points (default)
  kValidate = 1,          // check the buffer ID on each lookup instead of hooking
  kOff = 2,               // neither (unsafe; for experiments)
  kHooksAndValidate = 3,  // hooks, plus the buffer-ID check on each hit (catches missed frees)
};
extern const char* kFreeModeNames[];  // "hooks", "validate", "off", "both", nullptr
const char* freeModeName(FreeMode m) noexcept;

using FreeCallback = void (*)(void* arg, std::uintptr_t start, std::size_t length);

// A CUDA allocation the hooks saw succeed (driver or runtime; device, managed, pitched, async/pool,
// or a VMM cuMemMap): [start, start + length) of type, on CUDA device ordinal device (-1 unknown).
struct AllocEvent {
  std::uintptr_t start = 0;
  std::size_t length = 0;
  MemType type = MemType::kCuda;
  int device = -1;
};
// Called on the allocating thread after the driver returned the memory and before the allocation
// call returns to the application; same hook-safety rules as FreeCallback.
using AllocCallback = void (*)(void* arg, const AllocEvent& event);

// The PCI address of CUDA device `ordinal` as the driver writes it (cuDeviceGetPCIBusId,
// "dddd:bb:dd.f"), NUL-terminated into buf. False without a driver, for an ordinal it does not have,
// or when it cannot say; buf is then untouched. Loads the driver on first use, like classify().
bool cudaDevicePciBusId(int ordinal, char* buf, std::size_t len) noexcept;

// Counters (monotonic), for tests, benchmarks and the user.
struct Stats {
  std::uint64_t lookups = 0;          // classify() calls that reached the CUDA path (hits + queries)
  std::uint64_t cache_hits = 0;       // answered from the range cache (lags < 64 per thread)
  std::uint64_t driver_queries = 0;   // cuPointerGetAttributes calls
  std::uint64_t frees_seen = 0;       // frees delivered to subscribers (hooks, validation, notifyFree)
  std::uint64_t stale_hits = 0;       // cache hits rejected by the buffer-ID check
  std::uint64_t hook_slots = 0;       // symbol-table and GOT slots redirected to gmd's hooks
  std::uint64_t foreign_slots = 0;    // slots already redirected by another interposer, chained to it
};

// Process-wide classifier (one CUDA driver per process).
class Classifier {
 public:
  static Classifier& instance() noexcept;

  bool cudaAvailable() const noexcept;  // a driver was loaded and reports at least one device
  int deviceCount() const noexcept;     // 0 without CUDA
  Info classify(const void* address, std::size_t length) noexcept;

  // Subscribe to CUDA frees; returns false when no room. Subscribers are called for every range freed.
  bool subscribe(FreeCallback cb, void* arg) noexcept;
  // Removes the subscription and waits until no free in flight is still calling it.
  void unsubscribe(FreeCallback cb, void* arg) noexcept;

  // Subscribe to CUDA allocations (installs the hooks if they are not yet installed); false when no
  // room, no driver, or the hooks cannot be installed. Each allocation reaches every subscriber once (a cudaMalloc that calls
  // cuMemAlloc inside the runtime is one event).
  bool subscribeAllocations(AllocCallback cb, void* arg) noexcept;
  // Removes the subscription and waits until no allocation in flight is still calling it.
  void unsubscribeAllocations(AllocCallback cb, void* arg) noexcept;

  // Free detection (default kHooks). Switching to a hooking mode installs the hooks once for the
  // life of the process; switching away keeps them installed but cached ranges stay authoritative
  // only in the hooking modes. Takes effect for every later classify().
  void setFreeMode(FreeMode mode) noexcept;
  FreeMode freeMode() const noexcept;
  bool hooksInstalled() const noexcept;

  // Called once, just before the hooks are first installed (outside the hooks' own lock).
  // For an interposer that patches the driver's entry points in place and must find them as the
  // driver exports them, not redirected to gmd's wrappers: UCX's libucm_cuda (md/ucm_events.cc
  // makes it install its hooks here). Set at load time, before anything classifies.
  static void setBeforeHooks(void (*fn)() noexcept) noexcept;

  // Re-scan loaded objects for free entry points bound after the hooks were installed (e.g. a
  // libcudart.so dlopen'ed later). Also done automatically on a cache miss when the set of loaded
  // objects changed. Cheap when nothing changed.
  void refreshHooks() noexcept;

  // An external source (e.g. UCX's UCM_EVENT_MEM_TYPE_FREE when UCX's own CUDA hooks are active)
  // reports that [start, start + length) was freed: forget it and tell subscribers. Hook-safe.
  void notifyFree(std::uintptr_t start, std::size_t length) noexcept;

  // Forget every cached range (does not notify). For tests and after fork().
  void flushCache() noexcept;

  Stats stats() const noexcept;
};

}  // namespace gmd::memtype
