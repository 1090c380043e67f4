// CUDA allocations and frees raised as libucm memory-type events (UCM_EVENT_MEM_TYPE_ALLOC /
// UCM_EVENT_MEM_TYPE_FREE), as UCX's own libucm_cuda does on a UCX built with CUDA.
//
// Why: Debian's UCX has no CUDA support. Its global memtype cache exists and stays empty, so UCP
// takes every buffer for host memory without asking gmd; and from UCX 1.16 UCP's registration cache
// keeps registrations of device memory across cuMemFree, because nothing raises MEM_TYPE_FREE.
// Feeding libucm's events fixes both: the memtype cache answers CUDA for device memory, and UCP's
// cache drops registrations of freed device memory.
//
// start() (once per process; the first call decides, later ones do nothing):
// - nothing without a CUDA driver with devices, with UCX_GMD_CUDA_EVENTS=n, or where libucm lacks
//   its (internal) dispatch entry points;
// - nothing where the running UCX has CUDA support of its own (libucm_cuda or libuct_cuda mapped in
//   the process): UCX raises the events itself. One debug line says which reason applied;
// - otherwise it makes UCX's global memtype cache exist (one lookup; ucs_memtype_cache_update is a
//   no-op while there is none), raises UCM_EVENT_MEM_TYPE_ALLOC for the allocations that already
//   exist (/proc/self/maps ranges that are PROT_NONE or map /dev/nvidia*, as libucm_cuda does, with
//   type unknown; device allocations the classifier finds there or at the start of any mapping,
//   with their exact range and type), and subscribes to memtype/'s allocation and free events.
//
// Event paths (allocation and free callbacks) are hook-safe on gmd's side: no allocation, no lock,
// no exception; libucm's handlers (UCX's memtype cache, UCP's registration cache) run inside them,
// as they do inside libucm_cuda's hooks.
//
// Thread safety: every function may be called from any thread; start() serialises on a mutex.
#pragma once

#include <ucs/memory/memory_type.h>
#include <ucs/sys/topo/base/topo.h>

#include <cstddef>
#include <cstdint>

#include "memtype/memtype.h"

namespace gmd::md::ucm_events {

// What start() decided.
enum class State : std::uint8_t {
  kNotStarted = 0,
  kActive,        // events raised
  kDisabled,      // UCX_GMD_CUDA_EVENTS=n
  kNoCuda,        // no CUDA driver with devices
  kNoDispatch,    // libucm does not export the dispatch entry points
  kUcxHasCuda,    // UCX's own CUDA support is loaded: it raises the events
};
const char* stateName(State state) noexcept;

// Decides once per process (see the top comment). `enabled` is UCX_GMD_CUDA_EVENTS.
State start(bool enabled) noexcept;
State state() noexcept;
inline bool active() noexcept { return state() == State::kActive; }

// Raise one event (the subscribers' bodies; tests call them directly). Nothing unless active().
// Hook-safe.
void raiseAlloc(const memtype::AllocEvent& event) noexcept;
void raiseFree(std::uintptr_t start, std::size_t length) noexcept;

// mem_query's write-back into UCX's memtype cache (nothing unless active()): device memory gets its
// exact range and type; a host answer inside a range the cache holds as unknown (a PROT_NONE
// reservation from the maps scan, e.g. a glibc arena) is removed, so later lookups there answer
// "host" at once instead of asking the MDs again.
void writeBack(const void* address, std::size_t length, const memtype::Info& info,
               ucs_sys_device_t sys_dev) noexcept;

// Whether UCX's own CUDA support is loaded in this process (libucm_cuda / libuct_cuda, or libucm's
// CUDA hooks linked in); what start() checks. Exposed for tests.
bool ucxHasCuda() noexcept;

// Called once before gmd's CUDA hooks are first installed (memtype::Classifier::setBeforeHooks, set
// when the module loads): has libucm load its modules and install its memory-type hooks now, as
// UCP's memory-type cache or registration cache would later. libucm_cuda patches the driver's entry
// points in place and must find them as the driver exports them: once gmd has redirected them, it
// finds gmd's wrappers, cannot patch them and refuses every memory-type handler. Installed first,
// its hooks sit in the driver's code and gmd's wrappers call through them, so both see every
// allocation and free. Nothing happens where libucm has no CUDA module or its events are off.
void installUcxHooksFirst() noexcept;

}  // namespace gmd::md::ucm_events
