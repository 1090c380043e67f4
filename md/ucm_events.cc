#include "md/ucm_events.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

// ucs/datastruct/pgtable.h, included by memtype_cache.h, has no C++ guards of its own (1.13).
extern "C" {
#include <ucs/datastruct/pgtable.h>
}
#include <ucs/memory/memtype_cache.h>

#include "md/mapping.h"
#include "md/md.h"
#include "md/ucs_topology.h"
#include "md/ucx_abi.h"
#include "memtype/maps_scan.h"

namespace gmd::md::ucm_events {
namespace {

// UCS_MEM_FLAG_REGISTRABLE (1.22 on), as UCX's own CUDA memory hooks mark device memory.
constexpr std::uint8_t kRegistrable = kMemFlagRegistrable;
// Device allocations the maps scan looks for back to back from the start of one mapping.
constexpr int kMaxProbesPerMapping = 4096;

std::atomic<State> g_state{State::kNotStarted};
std::mutex g_start_mutex;  // start() only; never taken in an event path

// libucm's dispatch entry points; written once in start() before g_state turns kActive (release),
// read only after an acquire load that saw kActive.
ucx::UcmEventEnterFn g_enter = nullptr;
ucx::UcmEventDispatchFn g_dispatch = nullptr;
ucx::UcmEventLeaveFn g_leave = nullptr;

// UCX system device of each CUDA ordinal, resolved in start() (the topology lookup allocates the
// first time), read in the event paths.
std::array<ucs_sys_device_t, topology::SysDevices::kMaxCudaDevices> g_sys_dev;

// The event libucm's handlers receive: ucm_event_t's storage, filled through gmd's mirror of its
// mem_type member for this generation.
union Event {
  ucm_event_t ucx;
  ucx::UcmMemTypeEvent mem_type;
};
static_assert(sizeof(Event) == sizeof(ucm_event_t));

// sys_dev and mem_flags exist from 1.22 on.
template <typename E>
void fillDevice(E& e, ucs_sys_device_t sys_dev) noexcept {
  if constexpr (requires { e.sys_dev; e.mem_flags; }) {
    e.sys_dev = sys_dev;
    e.mem_flags = kRegistrable;
  } else {
    (void)e;
    (void)sys_dev;
  }
}

// ucs_memtype_cache_update() gains mem_flags in 1.22.
template <typename Fn = decltype(ucs_memtype_cache_update)>
void cacheUpdate(const void* address, std::size_t length, ucs_memory_type_t type,
                 ucs_sys_device_t sys_dev) noexcept {
  Fn* update = &ucs_memtype_cache_update;  // dependent: only the matching branch is compiled
  if constexpr (std::is_invocable_v<Fn*, const void*, std::size_t, ucs_memory_type_t,
                                    ucs_sys_device_t, std::uint8_t>) {
    update(address, length, type, sys_dev, kRegistrable);
  } else {
    update(address, length, type, sys_dev);
  }
}

// Hook-safe: the event lives on the stack; libucm's read lock is what its own hooks take.
void dispatch(int event_type, std::uintptr_t start, std::size_t length, ucs_memory_type_t type,
              ucs_sys_device_t sys_dev) noexcept {
  Event event;
  std::memset(&event, 0, sizeof(event));
  event.mem_type.address = reinterpret_cast<void*>(start);
  event.mem_type.size = length;
  event.mem_type.mem_type = type;
  fillDevice(event.mem_type, sys_dev);
  g_enter();
  g_dispatch(static_cast<ucm_event_type_t>(event_type), &event.ucx);
  g_leave();
}

ucs_sys_device_t sysDevice(int ordinal) noexcept {
  return ordinal >= 0 && static_cast<std::size_t>(ordinal) < g_sys_dev.size()
             ? g_sys_dev[static_cast<std::size_t>(ordinal)]
             : UCS_SYS_DEVICE_ID_UNKNOWN;
}

void onAlloc(void*, const memtype::AllocEvent& event) noexcept { raiseAlloc(event); }
void onFree(void*, std::uintptr_t start, std::size_t length) noexcept { raiseFree(start, length); }
void ignoreEvent(ucm_event_type_t, ucm_event_t*, void*) {}

// libucm's exported but undeclared entry points, from the libucm this module is linked with.
bool resolveDispatch() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ucm_set_event_handler), &info) == 0 ||
      info.dli_fname == nullptr) {
    return false;
  }
  void* ucm = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);  // kept: libucm is never unloaded
  if (ucm == nullptr) return false;
  g_enter = reinterpret_cast<ucx::UcmEventEnterFn>(dlsym(ucm, ucx::kUcmEventEnter));
  g_dispatch = reinterpret_cast<ucx::UcmEventDispatchFn>(dlsym(ucm, ucx::kUcmEventDispatch));
  g_leave = reinterpret_cast<ucx::UcmEventLeaveFn>(dlsym(ucm, ucx::kUcmEventLeave));
  return g_enter != nullptr && g_dispatch != nullptr && g_leave != nullptr;
}

int findUcxCuda(dl_phdr_info* info, std::size_t, void* found) {
  if (info->dlpi_name == nullptr) return 0;
  std::string_view name(info->dlpi_name);
  if (const auto slash = name.rfind('/'); slash != std::string_view::npos) {
    name.remove_prefix(slash + 1);
  }
  if (name.starts_with("libucm_cuda.so") || name.starts_with("libuct_cuda.so")) {
    *static_cast<const char**>(found) = info->dlpi_name;
    return 1;
  }
  return 0;
}

// Allocations made before gmd was loaded: ranges that may be CUDA as unknown (UCP asks the MDs, and
// gmd's mem_query writes the answer back), and device allocations the classifier recognises at the
// start of a mapping (and back to back after it) with their exact range and type.
void raiseExisting(bool cache_exists) {
  if (!cache_exists) return;  // UCX_MEMTYPE_CACHE=n: nothing to feed
  memtype::Classifier& classifier = memtype::Classifier::instance();
  std::size_t unknown = 0, exact = 0;
  for (const memtype::maps::Mapping& m : memtype::maps::readProcMaps()) {
    if (m.candidate) {
      dispatch(ucx::kUcmEventMemTypeAlloc, m.start, m.end - m.start, UCS_MEMORY_TYPE_UNKNOWN,
               UCS_SYS_DEVICE_ID_UNKNOWN);
      ++unknown;
    }
    std::uintptr_t probe = m.start;
    for (int i = 0; i < kMaxProbesPerMapping && probe < m.end; ++i) {
      const memtype::Info info = classifier.classify(reinterpret_cast<const void*>(probe), 1);
      if (info.type == MemType::kHost || info.size == 0 || info.base + info.size <= probe) break;
      dispatch(ucx::kUcmEventMemTypeAlloc, info.base, info.size, toUcsMemType(info.type),
               sysDevice(info.device));
      ++exact;
      probe = info.base + info.size;
    }
  }
  ucs_debug("gmd: existing allocations: %zu ranges of unknown type, %zu CUDA allocations", unknown,
            exact);
}

State decide(bool enabled) {
  if (!enabled) return State::kDisabled;
  memtype::Classifier& classifier = memtype::Classifier::instance();
  if (!classifier.cudaAvailable()) return State::kNoCuda;
  if (!resolveDispatch()) return State::kNoDispatch;
  // The cache must exist before anything is raised: its handler is what the events feed. Creating
  // it also makes libucm load its modules (libucm_cuda where UCX has one), checked next.
  ucs_memory_info_t probe_info{};
  const int probe = 0;
  const ucs_status_t st = ucs_memtype_cache_lookup(&probe, sizeof(probe), &probe_info);
  if (ucxHasCuda()) return State::kUcxHasCuda;
  const bool cache_exists = st == UCS_OK || st == UCS_ERR_NO_ELEM;
  if (!cache_exists) {
    ucs_debug("gmd: UCX's memtype cache is off (%s): CUDA frees still reach UCP's caches",
              ucs_status_string(st));
  }
  const int devices = std::min(classifier.deviceCount(), static_cast<int>(g_sys_dev.size()));
  for (int d = 0; d < devices; ++d) g_sys_dev[static_cast<std::size_t>(d)] = sysDevices().cudaDevice(d);

  g_state.store(State::kActive, std::memory_order_release);  // subscribers may fire from here on
  if (!classifier.subscribe(onFree, nullptr)) {
    g_state.store(State::kNotStarted, std::memory_order_release);
    ucs_error("gmd: cannot subscribe to CUDA frees: CUDA memory events off");
    return State::kNoCuda;
  }
  if (!classifier.subscribeAllocations(onAlloc, nullptr)) {
    ucs_debug("gmd: CUDA allocations are not hooked: only existing allocations and frees raised");
  }
  raiseExisting(cache_exists);
  return State::kActive;
}

}  // namespace

const char* stateName(State state) noexcept {
  switch (state) {
    case State::kNotStarted:
      return "not started";
    case State::kActive:
      return "raised";
    case State::kDisabled:
      return "off (UCX_GMD_CUDA_EVENTS=n)";
    case State::kNoCuda:
      return "off (no CUDA driver with devices)";
    case State::kNoDispatch:
      return "off (libucm exports no ucm_event_dispatch)";
    case State::kUcxHasCuda:
      return "off (UCX's own CUDA support is loaded and raises them)";
  }
  return "?";
}

State start(bool enabled) noexcept {
  if (const State s = g_state.load(std::memory_order_acquire); s != State::kNotStarted) return s;
  try {
    std::lock_guard<std::mutex> lock(g_start_mutex);
    if (const State s = g_state.load(std::memory_order_acquire); s != State::kNotStarted) return s;
    g_sys_dev.fill(UCS_SYS_DEVICE_ID_UNKNOWN);
    const State s = decide(enabled);
    g_state.store(s, std::memory_order_release);
    ucs_debug("gmd: libucm memory-type events for CUDA memory: %s", stateName(s));
    return s;
  } catch (...) {
    ucs_error("gmd: unexpected failure starting CUDA memory events");
    return g_state.load(std::memory_order_acquire);
  }
}

State state() noexcept { return g_state.load(std::memory_order_acquire); }

void raiseAlloc(const memtype::AllocEvent& event) noexcept {
  if (!active() || event.length == 0) return;
  dispatch(ucx::kUcmEventMemTypeAlloc, event.start, event.length, toUcsMemType(event.type),
           event.type == MemType::kCuda ? sysDevice(event.device) : UCS_SYS_DEVICE_ID_UNKNOWN);
}

void raiseFree(std::uintptr_t start, std::size_t length) noexcept {
  if (!active() || length == 0) return;
  dispatch(ucx::kUcmEventMemTypeFree, start, length, UCS_MEMORY_TYPE_CUDA,
           UCS_SYS_DEVICE_ID_UNKNOWN);
}

void writeBack(const void* address, std::size_t length, const memtype::Info& info,
               ucs_sys_device_t sys_dev) noexcept {
  if (!active() || ucs_memtype_cache_global_instance == nullptr) return;
  if (info.type != MemType::kHost && info.size != 0) {
    cacheUpdate(reinterpret_cast<const void*>(info.base), info.size, toUcsMemType(info.type),
                sys_dev);
    return;
  }
  const std::size_t len = std::max<std::size_t>(length, 1);
  ucs_memory_info_t cached{};
  if (ucs_memtype_cache_lookup(address, len, &cached) == UCS_OK &&
      cached.type == UCS_MEMORY_TYPE_UNKNOWN) {
    ucs_memtype_cache_remove(address, len);
  }
}

void installUcxHooksFirst() noexcept {
  // A handler for the memory-type events makes libucm install what raises them; removed at once,
  // the hooks stay.
  constexpr int kEvents = UCM_EVENT_MEM_TYPE_ALLOC | UCM_EVENT_MEM_TYPE_FREE;
  const ucs_status_t st = ucm_set_event_handler(kEvents, 0, ignoreEvent, nullptr);
  if (st == UCS_OK) ucm_unset_event_handler(kEvents, ignoreEvent, nullptr);
  if (ucxHasCuda()) {
    ucs_debug("gmd: libucm's CUDA hooks installed before gmd's: %s", ucs_status_string(st));
  } else {
    ucs_debug("gmd: libucm has no CUDA hooks to install before gmd's (%s)", ucs_status_string(st));
  }
}

bool ucxHasCuda() noexcept {
  const char* found = nullptr;
  dl_iterate_phdr(findUcxCuda, &found);
  if (found != nullptr) {
    ucs_debug("gmd: UCX's CUDA support is loaded (%s)", found);
    return true;
  }
  // libucm_cuda's hook replacements, wherever they were linked.
  return dlsym(RTLD_DEFAULT, "ucm_cuMemFree") != nullptr;
}

}  // namespace gmd::md::ucm_events
