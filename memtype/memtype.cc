// The Classifier: range cache of known CUDA allocations, free and allocation subscribers, free mode.
//
// Lock order: g_cache_lock (shared for lookups, exclusive for insert/remove) is a leaf: no driver
// call, no subscriber call and no hook is made while holding it. Subscribers are called with no lock
// held; unsubscribe() waits for in-flight notifications with a reader count instead of a lock.
#include "memtype/memtype.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "memtype/cuda_driver.h"
#include "memtype/cuda_hooks.h"

namespace gmd::memtype {

const char* kFreeModeNames[] = {"hooks", "validate", "off", "both", nullptr};
static_assert(static_cast<unsigned>(FreeMode::kHooks) == 0 &&
                  static_cast<unsigned>(FreeMode::kValidate) == 1 &&
                  static_cast<unsigned>(FreeMode::kOff) == 2 &&
                  static_cast<unsigned>(FreeMode::kHooksAndValidate) == 3,
              "FreeMode values index kFreeModeNames");

const char* freeModeName(FreeMode m) noexcept {
  const auto i = static_cast<unsigned>(m);
  return i < 4 ? kFreeModeNames[i] : "unknown";
}

namespace {

enum State : int { kUnknown = 0, kNoCuda = 1, kCudaReady = 2 };

std::atomic<int> g_state{kUnknown};
std::mutex g_init_mutex;  // first use only
std::atomic<FreeMode> g_mode{FreeMode::kHooks};

// Range cache: allocation base -> Info. Generation counts removals so that a thread's last-hit
// memo and a lookup racing with a free can tell they are stale.
std::shared_mutex g_cache_lock;
std::map<std::uintptr_t, Info>* g_ranges = nullptr;  // never destroyed: hooks may run at exit
std::atomic<std::uint64_t> g_generation{1};
// Intercepted frees between their entry and their return (see detail::freeBegin).
std::atomic<int> g_frees_in_flight{0};

// Plain fields (no constructor) so that the thread-local needs no initialisation guard.
struct Memo {
  std::uint64_t generation;
  std::uintptr_t start;
  std::uintptr_t end;
  std::uint64_t buffer_id;
  int device;
  MemType type;
  std::uint32_t unflushed_hits;  // memo hits not yet added to g_counters.cache_hits
};
[[maybe_unused]] thread_local Memo t_memo;
[[maybe_unused]] constexpr std::uint32_t kHitFlush = 64;  // Stats::cache_hits lags by less than this per thread

// Subscribers: fixed slots, published with the callback last.
constexpr int kMaxSubscribers = 16;
struct Subscriber {
  std::atomic<FreeCallback> cb{nullptr};
  std::atomic<void*> arg{nullptr};
};
Subscriber g_subs[kMaxSubscribers];
std::mutex g_subs_mutex;  // serialises subscribe/unsubscribe; never taken by a notification
std::atomic<int> g_notifying{0};

// Allocation subscribers, the same way (g_subs_mutex serialises their changes too).
struct AllocSubscriber {
  std::atomic<AllocCallback> cb{nullptr};
  std::atomic<void*> arg{nullptr};
};
AllocSubscriber g_alloc_subs[kMaxSubscribers];
std::atomic<int> g_alloc_sub_count{0};  // lets allocations skip the device query when nobody listens
std::atomic<int> g_alloc_notifying{0};

struct Counters {
  alignas(64) std::atomic<std::uint64_t> cache_hits{0};  // the hit path's only shared write
  alignas(64) std::atomic<std::uint64_t> driver_queries{0};
  std::atomic<std::uint64_t> frees_seen{0};
  std::atomic<std::uint64_t> stale_hits{0};
} g_counters;

void bump(std::atomic<std::uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }

[[maybe_unused]] bool validating() noexcept {
  const FreeMode m = g_mode.load(std::memory_order_relaxed);
  return m == FreeMode::kValidate || m == FreeMode::kHooksAndValidate;
}
bool hooking(FreeMode m) noexcept {
  return m == FreeMode::kHooks || m == FreeMode::kHooksAndValidate;
}

void notifySubscribers(std::uintptr_t start, std::size_t length) noexcept {
  bump(g_counters.frees_seen);
  g_notifying.fetch_add(1, std::memory_order_acq_rel);
  for (Subscriber& s : g_subs) {
    FreeCallback cb = s.cb.load(std::memory_order_acquire);
    if (cb != nullptr) cb(s.arg.load(std::memory_order_acquire), start, length);
  }
  g_notifying.fetch_sub(1, std::memory_order_acq_rel);
}

// Erases every cached range overlapping [start, start + length). Caller holds g_cache_lock.
void eraseOverlapsLocked(std::uintptr_t start, std::size_t length) noexcept {
  if (g_ranges == nullptr) return;
  const std::uintptr_t end = start + length;
  auto it = g_ranges->upper_bound(start);
  if (it != g_ranges->begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > start) it = prev;
  }
  while (it != g_ranges->end() && it->first < end) it = g_ranges->erase(it);
}

// Drops every cached range overlapping [start, start + length).
void forget(std::uintptr_t start, std::size_t length) noexcept {
  std::unique_lock<std::shared_mutex> lock(g_cache_lock);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  eraseOverlapsLocked(start, length);
}

bool lookupCached(std::uintptr_t addr, Info* out) noexcept {
  std::shared_lock<std::shared_mutex> lock(g_cache_lock);
  if (g_ranges == nullptr) return false;
  auto it = g_ranges->upper_bound(addr);
  if (it == g_ranges->begin()) return false;
  --it;
  if (addr >= it->first + it->second.size) return false;
  *out = it->second;
  return true;
}

#if GMD_HAVE_CUDA
constexpr int kAttrMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttrBufferId = 7;       // CU_POINTER_ATTRIBUTE_BUFFER_ID
constexpr int kAttrIsManaged = 8;      // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kAttrDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kAttrRangeStart = 11;    // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kAttrRangeSize = 12;     // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned kMemoryTypeDevice = 2;  // CU_MEMORYTYPE_DEVICE

// One cuPointerGetAttributes call. Host (or unknown to CUDA) answers leave *out as host.
void queryDriver(const detail::DriverApi& api, std::uintptr_t addr, Info* out) noexcept {
  bump(g_counters.driver_queries);
  unsigned mem_type = 0;
  unsigned is_managed = 0;
  int ordinal = -1;
  detail::CuDevicePtr range_start = 0;
  std::size_t range_size = 0;
  unsigned long long buffer_id = 0;
  int attrs[] = {kAttrMemoryType, kAttrIsManaged, kAttrDeviceOrdinal,
                 kAttrRangeStart, kAttrRangeSize, kAttrBufferId};
  void* data[] = {&mem_type, &is_managed, &ordinal, &range_start, &range_size, &buffer_id};
  const detail::CuResult r = api.pointerGetAttributes(6, attrs, data, addr);
  if (r != 0) {
    log(LogLevel::kDebug, detail::kLogModule,
        "cuPointerGetAttributes(%p) failed (%d): treated as host", reinterpret_cast<void*>(addr),
        r);
    return;
  }
  if (is_managed != 0) {
    out->type = MemType::kCudaManaged;
  } else if (mem_type == kMemoryTypeDevice) {
    out->type = MemType::kCuda;
  } else {
    return;
  }
  if (range_size == 0) {
    // Drivers without the range attributes: ask for the allocation extent.
    if (api.memGetAddressRange(&range_start, &range_size, addr) != 0) {
      range_start = addr;
      range_size = 1;
    }
  }
  out->base = static_cast<std::uintptr_t>(range_start);
  out->size = range_size;
  out->device = ordinal;
  out->buffer_id = buffer_id;
}

// Buffer-ID check of a cached answer; false when the allocation behind it is gone.
bool stillValid(const detail::DriverApi& api, const Info& info) noexcept {
  unsigned long long id = 0;
  if (api.pointerGetAttribute(&id, kAttrBufferId, info.base) != 0) return false;
  return id == info.buffer_id;
}
#endif

void ensureLoaded() noexcept {
  if (g_state.load(std::memory_order_acquire) != kUnknown) return;
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (g_state.load(std::memory_order_relaxed) != kUnknown) return;
  const detail::DriverApi* api = detail::driver();
  if (api == nullptr) {
    g_state.store(kNoCuda, std::memory_order_release);
    return;
  }
  {
    std::unique_lock<std::shared_mutex> cache_lock(g_cache_lock);
    g_ranges = new (std::nothrow) std::map<std::uintptr_t, Info>();
  }
  if (g_ranges == nullptr) {
    log(LogLevel::kError, detail::kLogModule,
        "out of memory creating the CUDA range cache; CUDA support off");
    g_state.store(kNoCuda, std::memory_order_release);
    return;
  }
  if (hooking(g_mode.load(std::memory_order_relaxed))) detail::installHooks(*api);
  g_state.store(kCudaReady, std::memory_order_release);
}

}  // namespace

namespace detail {

void onRangeFree(std::uintptr_t start, std::size_t length) noexcept {
  forget(start, length);
  notifySubscribers(start, length);
}

Range onDeviceFree(CuDevicePtr ptr) noexcept {
  const auto addr = static_cast<std::uintptr_t>(ptr);
  Info info;
  if (lookupCached(addr, &info) && info.base == addr) {
    onRangeFree(info.base, info.size);
    return {info.base, info.size};
  }
  const DriverApi* api = driver();
  CuDevicePtr base = 0;
  std::size_t size = 0;
  if (api != nullptr && api->memGetAddressRange(&base, &size, ptr) == 0 && size != 0) {
    onRangeFree(static_cast<std::uintptr_t>(base), size);
    return {static_cast<std::uintptr_t>(base), size};
  }
  return {};  // not a live allocation: the driver will reject the free; nothing to report
}

void onAllocation(CuDevicePtr start, std::size_t length, MemType type, int device) noexcept {
  if (g_alloc_sub_count.load(std::memory_order_acquire) == 0) return;
  AllocEvent event;
  event.start = static_cast<std::uintptr_t>(start);
  event.length = length;
  event.type = type;
  event.device = device;
#if GMD_HAVE_CUDA
  // The device, as classify() would find it. Nothing is cached here: a cache insert allocates, and
  // the hooks do not (the next classify() of the range pays the same query once).
  const DriverApi* api = device < 0 ? driver() : nullptr;
  if (api != nullptr) {
    Info info;
    queryDriver(*api, event.start, &info);
    event.device = info.device;
  }
#endif
  g_alloc_notifying.fetch_add(1, std::memory_order_acq_rel);
  for (AllocSubscriber& s : g_alloc_subs) {
    AllocCallback cb = s.cb.load(std::memory_order_acquire);
    if (cb != nullptr) cb(s.arg.load(std::memory_order_acquire), event);
  }
  g_alloc_notifying.fetch_sub(1, std::memory_order_acq_rel);
}

void afterFree(Range range) noexcept {
  if (range.length != 0) forget(range.start, range.length);
}

void freeBegin() noexcept { g_frees_in_flight.fetch_add(1, std::memory_order_seq_cst); }

void freeEnd() noexcept {
  // A lookup that queried the driver while the free ran sees the generation move and does not cache.
  g_generation.fetch_add(1, std::memory_order_seq_cst);
  g_frees_in_flight.fetch_sub(1, std::memory_order_seq_cst);
}

void simulateNoDriver(bool on) noexcept {
  static int saved = kUnknown;
  if (on) {
    ensureLoaded();
    saved = g_state.exchange(kNoCuda, std::memory_order_acq_rel);
  } else if (saved != kUnknown) {
    g_state.store(saved, std::memory_order_release);
  }
}

}  // namespace detail

Classifier& Classifier::instance() noexcept {
  static Classifier c;
  return c;
}

bool Classifier::cudaAvailable() const noexcept {
  ensureLoaded();
  return g_state.load(std::memory_order_acquire) == kCudaReady;
}

int Classifier::deviceCount() const noexcept {
  if (!cudaAvailable()) return 0;
  return detail::driver()->device_count;
}

Info Classifier::classify(const void* address, std::size_t length) noexcept {
  (void)length;  // the answer describes the allocation holding `address`; callers check the end
  int state = g_state.load(std::memory_order_acquire);
  if (state != kCudaReady) {
    if (state == kNoCuda) return Info{};
    ensureLoaded();
    if (g_state.load(std::memory_order_acquire) != kCudaReady) return Info{};
  }
#if GMD_HAVE_CUDA
  const detail::DriverApi& api = *detail::driver();
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  const bool validate = validating();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::uint64_t gen = g_generation.load(std::memory_order_acquire);
    Info info;
    bool hit = false;
    if (!validate && t_memo.generation == gen && addr >= t_memo.start && addr < t_memo.end) {
      // No shared write on this path: hits are counted per thread and flushed in batches.
      if (++t_memo.unflushed_hits == kHitFlush) {
        g_counters.cache_hits.fetch_add(kHitFlush, std::memory_order_relaxed);
        t_memo.unflushed_hits = 0;
      }
      info.type = t_memo.type;
      info.base = t_memo.start;
      info.size = t_memo.end - t_memo.start;
      info.device = t_memo.device;
      info.buffer_id = t_memo.buffer_id;
      return info;
    } else if (lookupCached(addr, &info)) {
      hit = true;
    }
    if (hit) {
      if (validate && !stillValid(api, info)) {
        bump(g_counters.stale_hits);
        log(LogLevel::kDebug, detail::kLogModule,
            "buffer ID of %p changed: range %#lx+%zu was freed", address,
            static_cast<unsigned long>(info.base), info.size);
        detail::onRangeFree(info.base, info.size);
        continue;
      }
      g_counters.cache_hits.fetch_add(1 + t_memo.unflushed_hits, std::memory_order_relaxed);
      t_memo = {gen, info.base, info.base + info.size, info.buffer_id, info.device, info.type, 0};
      return info;
    }
    if (hooking(g_mode.load(std::memory_order_relaxed))) detail::refreshHooks(false);
    queryDriver(api, addr, &info);
    if (info.type == MemType::kHost) return info;
    {
      std::unique_lock<std::shared_mutex> lock(g_cache_lock);
      // A free that ran since the query started, or is running now, may concern this very range
      // (or its address reused by a new allocation): answer without caching then.
      if (g_generation.load(std::memory_order_seq_cst) == gen &&
          g_frees_in_flight.load(std::memory_order_seq_cst) == 0) {
        eraseOverlapsLocked(info.base, info.size);
        try {
          g_ranges->emplace(info.base, info);
        } catch (...) {
          // Out of memory: answer without caching; the next lookup asks the driver again.
        }
      }
    }
    return info;
  }
  return Info{};
#else
  (void)address;
  return Info{};
#endif
}

bool Classifier::subscribe(FreeCallback cb, void* arg) noexcept {
  if (cb == nullptr) return false;
  std::lock_guard<std::mutex> lock(g_subs_mutex);
  for (Subscriber& s : g_subs) {
    if (s.cb.load(std::memory_order_relaxed) == nullptr) {
      s.arg.store(arg, std::memory_order_relaxed);
      s.cb.store(cb, std::memory_order_release);
      return true;
    }
  }
  log(LogLevel::kError, detail::kLogModule, "too many CUDA free subscribers (%d)", kMaxSubscribers);
  return false;
}

void Classifier::unsubscribe(FreeCallback cb, void* arg) noexcept {
  {
    std::lock_guard<std::mutex> lock(g_subs_mutex);
    for (Subscriber& s : g_subs) {
      if (s.cb.load(std::memory_order_relaxed) == cb &&
          s.arg.load(std::memory_order_relaxed) == arg) {
        s.cb.store(nullptr, std::memory_order_release);
        break;
      }
    }
  }
  // A notification that loaded the callback before it was cleared may still be running it.
  while (g_notifying.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

bool Classifier::subscribeAllocations(AllocCallback cb, void* arg) noexcept {
  if (cb == nullptr || !cudaAvailable()) return false;
  // The hooks serve frees and allocations alike; installing them in a non-hooking free mode only
  // adds notifications nobody trusts the cache on.
  if (!detail::installHooks(*detail::driver())) return false;
  std::lock_guard<std::mutex> lock(g_subs_mutex);
  for (AllocSubscriber& s : g_alloc_subs) {
    if (s.cb.load(std::memory_order_relaxed) == nullptr) {
      s.arg.store(arg, std::memory_order_relaxed);
      s.cb.store(cb, std::memory_order_release);
      g_alloc_sub_count.fetch_add(1, std::memory_order_acq_rel);
      return true;
    }
  }
  log(LogLevel::kError, detail::kLogModule, "too many CUDA allocation subscribers (%d)",
      kMaxSubscribers);
  return false;
}

void Classifier::unsubscribeAllocations(AllocCallback cb, void* arg) noexcept {
  {
    std::lock_guard<std::mutex> lock(g_subs_mutex);
    for (AllocSubscriber& s : g_alloc_subs) {
      if (s.cb.load(std::memory_order_relaxed) == cb &&
          s.arg.load(std::memory_order_relaxed) == arg) {
        s.cb.store(nullptr, std::memory_order_release);
        g_alloc_sub_count.fetch_sub(1, std::memory_order_acq_rel);
        break;
      }
    }
  }
  while (g_alloc_notifying.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void Classifier::setFreeMode(FreeMode mode) noexcept {
  g_mode.store(mode, std::memory_order_relaxed);
  if (hooking(mode) && g_state.load(std::memory_order_acquire) == kCudaReady) {
    detail::installHooks(*detail::driver());
  }
  flushCache();  // answers cached under another mode are not trusted under this one
}

FreeMode Classifier::freeMode() const noexcept { return g_mode.load(std::memory_order_relaxed); }

bool Classifier::hooksInstalled() const noexcept { return detail::hooksInstalled(); }

void Classifier::setBeforeHooks(void (*fn)() noexcept) noexcept { detail::setBeforeInstall(fn); }

void Classifier::refreshHooks() noexcept { detail::refreshHooks(true); }

void Classifier::notifyFree(std::uintptr_t start, std::size_t length) noexcept {
  if (length == 0) return;
  detail::onRangeFree(start, length);
}

void Classifier::flushCache() noexcept {
  std::unique_lock<std::shared_mutex> lock(g_cache_lock);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  if (g_ranges != nullptr) g_ranges->clear();
}

Stats Classifier::stats() const noexcept {
  Stats s;
  s.cache_hits = g_counters.cache_hits.load(std::memory_order_relaxed);
  s.driver_queries = g_counters.driver_queries.load(std::memory_order_relaxed);
  s.frees_seen = g_counters.frees_seen.load(std::memory_order_relaxed);
  s.stale_hits = g_counters.stale_hits.load(std::memory_order_relaxed);
  s.lookups = s.cache_hits + s.driver_queries;
  const detail::HookCounters h = detail::hookCounters();
  s.hook_slots = h.slots;
  s.foreign_slots = h.foreign;
  return s;
}

}  // namespace gmd::memtype
