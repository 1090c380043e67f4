// Internal to memtype/: hooks on the CUDA free and allocation entry points (mechanism in
// memtype/README.md).
//
// Thread safety: installHooks() and refreshHooks() serialise on one internal mutex and may be called
// from any thread; the hooks themselves run on the freeing thread and take no lock that a subscriber
// or the Classifier's lookup path could hold.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memtype/cuda_driver.h"

namespace gmd::memtype::detail {

struct HookCounters {
  std::uint64_t slots = 0;    // symbol-table and GOT slots redirected to a hook
  std::uint64_t foreign = 0;  // slots found redirected by another interposer (chained, not replaced)
};

// Redirects the driver's exported free and allocation entry points and every loaded object's
// bindings to them.
// Returns false when nothing could be hooked (the caller then recommends FreeMode::kValidate).
bool installHooks(const DriverApi& api) noexcept;
// What installHooks() calls once before it first installs (Classifier::setBeforeHooks).
void setBeforeInstall(void (*fn)() noexcept) noexcept;
bool hooksInstalled() noexcept;
// Picks up objects loaded since the last scan; a no-op when the set of loaded objects is unchanged.
void refreshHooks(bool force) noexcept;
HookCounters hookCounters() noexcept;

// Implemented by memtype.cc and called by the hooks before the free reaches the driver. Hook-safe.
// onDeviceFree: an allocation starting at ptr, extent looked up; returns the range reported (length 0
// when ptr is no live allocation). afterFree: called once the driver has freed the range, drops
// whatever a lookup racing with the free may have cached in between (no notification).
struct Range {
  std::uintptr_t start = 0;
  std::size_t length = 0;
};
Range onDeviceFree(CuDevicePtr ptr) noexcept;
void onRangeFree(std::uintptr_t start, std::size_t length) noexcept;
void afterFree(Range range) noexcept;
// Bracket every intercepted free (outermost wrapper only): while one is in flight, classify() does
// not cache what the driver answers, since the allocation it describes may be about to go (or gone
// and its address reused) before afterFree() could drop the entry.
void freeBegin() noexcept;
void freeEnd() noexcept;
// Called by the outermost allocation wrapper once the driver (or runtime) returned [start, start +
// length) of type: tells the allocation subscribers. device: the ordinal when the wrapper knows it
// (a VMM handle's), else -1 and the driver is asked for the pointer's. Hook-safe.
void onAllocation(CuDevicePtr start, std::size_t length, MemType type, int device = -1) noexcept;

}  // namespace gmd::memtype::detail
