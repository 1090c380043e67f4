// CUDA free and allocation hooks. Three pieces, all installed under one mutex, never removed:
//
//  1. Symbol-table redirection: the st_value of each free and allocation entry point in the driver's
//     .dynsym (and of cudaFree*/cudaMalloc* in a loaded libcudart) is rewritten so that every later binding made by
//     the dynamic linker (dlsym, lazy PLT binding, libraries loaded later) yields gmd's wrapper.
//  2. GOT patching: bindings made before installation (JUMP_SLOT and GLOB_DAT relocations of every
//     loaded object) are rewritten to the wrappers.
//  3. cuGetProcAddress: its wrapper hands back wrappers for those entry points, which is how a
//     static cudart (and a dynamic one) reaches the driver.
//
// A wrapper has one "next" function per chain slot. A slot that already held another interposer's
// function (e.g. UCX's UCM CUDA hooks) is chained to it rather than replaced, so both see the free.
#include "memtype/cuda_hooks.h"

#if GMD_HAVE_CUDA

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>

namespace gmd::memtype::detail {
namespace {

enum Kind : int {
  kMemFreeV1,      // cuMemFree (32-bit CUdeviceptr_v1)
  kMemFree,        // cuMemFree_v2
  kMemFreeAsync,   // cuMemFreeAsync, cuMemFreeAsync_ptsz
  kMemUnmap,       // cuMemUnmap
  kMemRelease,     // cuMemRelease
  kMemMap,         // cuMemMap (an allocation event; tracked so that cuMemRelease knows its ranges)
  kCudaFree,       // cudaFree
  kCudaFreeAsync,  // cudaFreeAsync, cudaFreeAsync_ptsz
  kGetProc,        // cuGetProcAddress (CUDA 11.3 signature)
  kGetProcV2,      // cuGetProcAddress_v2 (CUDA 12 signature)
  // Allocations.
  kMemAllocV1,               // cuMemAlloc (32-bit CUdeviceptr_v1)
  kMemAlloc,                 // cuMemAlloc_v2
  kMemAllocPitchV1,          // cuMemAllocPitch (32-bit)
  kMemAllocPitch,            // cuMemAllocPitch_v2
  kMemAllocManaged,          // cuMemAllocManaged
  kMemAllocAsync,            // cuMemAllocAsync, cuMemAllocAsync_ptsz
  kMemAllocFromPoolAsync,    // cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz
  kCudaMalloc,               // cudaMalloc
  kCudaMallocManaged,        // cudaMallocManaged
  kCudaMallocPitch,          // cudaMallocPitch
  kCudaMallocAsync,          // cudaMallocAsync, cudaMallocAsync_ptsz
  kCudaMallocFromPoolAsync,  // cudaMallocFromPoolAsync, cudaMallocFromPoolAsync_ptsz
  kNumKinds,
};
constexpr int kSlots = 4;

struct Name {
  const char* name;
  Kind kind;
  bool driver;  // defined by libcuda (else by libcudart)
};
constexpr Name kNames[] = {
    {"cuMemFree", kMemFreeV1, true},          {"cuMemFree_v2", kMemFree, true},
    {"cuMemFreeAsync", kMemFreeAsync, true},  {"cuMemFreeAsync_ptsz", kMemFreeAsync, true},
    {"cuMemUnmap", kMemUnmap, true},          {"cuMemRelease", kMemRelease, true},
    {"cuMemMap", kMemMap, true},              {"cudaFree", kCudaFree, false},
    {"cudaFreeAsync", kCudaFreeAsync, false}, {"cudaFreeAsync_ptsz", kCudaFreeAsync, false},
    {"cuGetProcAddress", kGetProc, true},     {"cuGetProcAddress_v2", kGetProcV2, true},
    {"cuMemAlloc", kMemAllocV1, true},
    {"cuMemAlloc_v2", kMemAlloc, true},
    {"cuMemAllocPitch", kMemAllocPitchV1, true},
    {"cuMemAllocPitch_v2", kMemAllocPitch, true},
    {"cuMemAllocManaged", kMemAllocManaged, true},
    {"cuMemAllocAsync", kMemAllocAsync, true},
    {"cuMemAllocAsync_ptsz", kMemAllocAsync, true},
    {"cuMemAllocFromPoolAsync", kMemAllocFromPoolAsync, true},
    {"cuMemAllocFromPoolAsync_ptsz", kMemAllocFromPoolAsync, true},
    {"cudaMalloc", kCudaMalloc, false},
    {"cudaMallocManaged", kCudaMallocManaged, false},
    {"cudaMallocPitch", kCudaMallocPitch, false},
    {"cudaMallocAsync", kCudaMallocAsync, false},
    {"cudaMallocAsync_ptsz", kCudaMallocAsync, false},
    {"cudaMallocFromPoolAsync", kCudaMallocFromPoolAsync, false},
    {"cudaMallocFromPoolAsync_ptsz", kCudaMallocFromPoolAsync, false},
};

const Name* findName(const char* name) noexcept {
  if (name[0] != 'c' || name[1] != 'u') return nullptr;  // fast reject for the ELF scans
  for (const Name& n : kNames) {
    if (std::strcmp(n.name, name) == 0) return &n;
  }
  return nullptr;
}

std::atomic<void*> g_next[kNumKinds][kSlots];
std::atomic<bool> g_installed{false};
std::atomic<std::uint64_t> g_slots{0};
std::atomic<std::uint64_t> g_foreign{0};

// Depth of wrapper calls on this thread: cudaFree reaches cuMemFree inside the runtime, and the
// inner wrapper must not report the same free twice.
thread_local int t_depth = 0;
struct DepthGuard {
  bool outer;
  DepthGuard() noexcept : outer(t_depth++ == 0) {
    if (outer) freeBegin();
  }
  ~DepthGuard() {
    if (outer) freeEnd();
    --t_depth;
  }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

// The same for allocations: cudaMalloc reaches cuMemAlloc inside the runtime, and only the
// outermost wrapper reports (with the range the application asked for).
thread_local int t_alloc_depth = 0;
struct AllocDepthGuard {
  bool outer;
  AllocDepthGuard() noexcept : outer(t_alloc_depth++ == 0) {}
  ~AllocDepthGuard() { --t_alloc_depth; }
  AllocDepthGuard(const AllocDepthGuard&) = delete;
  AllocDepthGuard& operator=(const AllocDepthGuard&) = delete;
};

template <typename F>
F next(Kind k, int s) noexcept {
  return reinterpret_cast<F>(g_next[k][s].load(std::memory_order_acquire));
}

// --- VMM mappings, so that cuMemRelease can name the ranges still mapped from a handle ------------
struct Mapping {
  CuDevicePtr ptr;
  std::size_t size;
  CuMemHandle handle;
};
constexpr std::size_t kMaxMappings = 1024;
std::mutex g_map_mutex;  // leaf lock: nothing is called while holding it
std::array<Mapping, kMaxMappings> g_mappings{};

void recordMapping(CuDevicePtr ptr, std::size_t size, CuMemHandle handle) noexcept {
  std::lock_guard<std::mutex> lock(g_map_mutex);
  for (Mapping& m : g_mappings) {
    if (m.size == 0) {
      m = {ptr, size, handle};
      return;
    }
  }
  // Table full: cuMemUnmap still reports the range; only cuMemRelease of a mapped handle is missed.
}

void forgetMappings(CuDevicePtr ptr, std::size_t size) noexcept {
  std::lock_guard<std::mutex> lock(g_map_mutex);
  for (Mapping& m : g_mappings) {
    if (m.size != 0 && m.ptr < ptr + size && ptr < m.ptr + m.size) m = {};
  }
}

void releaseHandle(CuMemHandle handle) noexcept {
  std::array<Mapping, 16> found{};
  std::size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(g_map_mutex);
    for (Mapping& m : g_mappings) {
      if (m.size != 0 && m.handle == handle && n < found.size()) {
        found[n++] = m;
        m = {};
      }
    }
  }
  // Still mapped: the memory stays alive until cuMemUnmap, but the owner has let go of it; report
  // now (conservative) so that nothing cached outlives the handle.
  for (std::size_t i = 0; i < n; ++i) onRangeFree(found[i].ptr, found[i].size);
}

// --- wrappers -------------------------------------------------------------------------------------
void* wrapProcResult(const char* symbol, int version, void* fn) noexcept;

CuDevicePtr toDevPtr(const void* p) noexcept { return reinterpret_cast<CuDevicePtr>(p); }

// The device a VMM handle's memory lives on (CUmemAllocationProp.location.id), or -1.
int handleDevice(CuMemHandle handle) noexcept {
  const DriverApi* api = driver();
  if (api == nullptr || api->memGetAllocationPropertiesFromHandle == nullptr) return -1;
  alignas(8) unsigned char prop[kAllocationPropSize] = {};
  if (api->memGetAllocationPropertiesFromHandle(prop, handle) != 0) return -1;
  int id = -1;
  std::memcpy(&id, prop + kAllocationPropLocationIdOffset, sizeof(id));
  return id;
}

template <int S>
CuResult wrapMemFreeV1(unsigned int ptr) {
  DepthGuard g;
  const Range r = g.outer && ptr != 0 ? onDeviceFree(ptr) : Range{};
  const CuResult result = next<CuResult (*)(unsigned int)>(kMemFreeV1, S)(ptr);
  afterFree(r);
  return result;
}
template <int S>
CuResult wrapMemFree(CuDevicePtr ptr) {
  DepthGuard g;
  const Range r = g.outer && ptr != 0 ? onDeviceFree(ptr) : Range{};
  const CuResult result = next<CuResult (*)(CuDevicePtr)>(kMemFree, S)(ptr);
  afterFree(r);
  return result;
}
template <int S>
CuResult wrapMemFreeAsync(CuDevicePtr ptr, CuStream stream) {
  DepthGuard g;
  const Range r = g.outer && ptr != 0 ? onDeviceFree(ptr) : Range{};
  const CuResult result = next<CuResult (*)(CuDevicePtr, CuStream)>(kMemFreeAsync, S)(ptr, stream);
  afterFree(r);
  return result;
}
template <int S>
CuResult wrapMemUnmap(CuDevicePtr ptr, std::size_t size) {
  DepthGuard g;
  if (g.outer && size != 0) onRangeFree(ptr, size);
  forgetMappings(ptr, size);
  const CuResult result = next<CuResult (*)(CuDevicePtr, std::size_t)>(kMemUnmap, S)(ptr, size);
  if (g.outer) afterFree({ptr, size});
  return result;
}
template <int S>
CuResult wrapMemRelease(CuMemHandle handle) {
  DepthGuard g;
  if (g.outer) releaseHandle(handle);
  return next<CuResult (*)(CuMemHandle)>(kMemRelease, S)(handle);
}
template <int S>
CuResult wrapMemMap(CuDevicePtr ptr, std::size_t size, std::size_t offset, CuMemHandle handle,
                    unsigned long long flags) {
  AllocDepthGuard g;
  CuResult r = next<CuResult (*)(CuDevicePtr, std::size_t, std::size_t, CuMemHandle,
                                 unsigned long long)>(kMemMap, S)(ptr, size, offset, handle, flags);
  if (r == 0) {
    recordMapping(ptr, size, handle);
    if (g.outer) onAllocation(ptr, size, MemType::kCuda, handleDevice(handle));
  }
  return r;
}

// Allocation wrappers: the real call first; on success, the outermost wrapper reports.
template <int S>
CuResult wrapMemAllocV1(unsigned int* ptr, unsigned int size) {
  AllocDepthGuard g;
  const CuResult r = next<CuResult (*)(unsigned int*, unsigned int)>(kMemAllocV1, S)(ptr, size);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(*ptr, size, MemType::kCuda);
  return r;
}
template <int S>
CuResult wrapMemAlloc(CuDevicePtr* ptr, std::size_t size) {
  AllocDepthGuard g;
  const CuResult r = next<CuResult (*)(CuDevicePtr*, std::size_t)>(kMemAlloc, S)(ptr, size);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(*ptr, size, MemType::kCuda);
  return r;
}
template <int S>
CuResult wrapMemAllocPitchV1(unsigned int* ptr, unsigned int* pitch, unsigned int width,
                             unsigned int height, unsigned int element) {
  AllocDepthGuard g;
  const CuResult r =
      next<CuResult (*)(unsigned int*, unsigned int*, unsigned int, unsigned int, unsigned int)>(
          kMemAllocPitchV1, S)(ptr, pitch, width, height, element);
  if (r == 0 && g.outer && ptr != nullptr && pitch != nullptr) {
    onAllocation(*ptr, std::size_t{*pitch} * height, MemType::kCuda);
  }
  return r;
}
template <int S>
CuResult wrapMemAllocPitch(CuDevicePtr* ptr, std::size_t* pitch, std::size_t width,
                           std::size_t height, unsigned int element) {
  AllocDepthGuard g;
  const CuResult r =
      next<CuResult (*)(CuDevicePtr*, std::size_t*, std::size_t, std::size_t, unsigned int)>(
          kMemAllocPitch, S)(ptr, pitch, width, height, element);
  if (r == 0 && g.outer && ptr != nullptr && pitch != nullptr) {
    onAllocation(*ptr, *pitch * height, MemType::kCuda);
  }
  return r;
}
template <int S>
CuResult wrapMemAllocManaged(CuDevicePtr* ptr, std::size_t size, unsigned int flags) {
  AllocDepthGuard g;
  const CuResult r = next<CuResult (*)(CuDevicePtr*, std::size_t, unsigned int)>(
      kMemAllocManaged, S)(ptr, size, flags);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(*ptr, size, MemType::kCudaManaged);
  return r;
}
template <int S>
CuResult wrapMemAllocAsync(CuDevicePtr* ptr, std::size_t size, CuStream stream) {
  AllocDepthGuard g;
  const CuResult r = next<CuResult (*)(CuDevicePtr*, std::size_t, CuStream)>(kMemAllocAsync, S)(
      ptr, size, stream);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(*ptr, size, MemType::kCuda);
  return r;
}
template <int S>
CuResult wrapMemAllocFromPoolAsync(CuDevicePtr* ptr, std::size_t size, void* pool,
                                   CuStream stream) {
  AllocDepthGuard g;
  const CuResult r = next<CuResult (*)(CuDevicePtr*, std::size_t, void*, CuStream)>(
      kMemAllocFromPoolAsync, S)(ptr, size, pool, stream);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(*ptr, size, MemType::kCuda);
  return r;
}
// The runtime's cudaError_t is an int, 0 on success, like CUresult.
template <int S>
int wrapCudaMalloc(void** ptr, std::size_t size) {
  AllocDepthGuard g;
  const int r = next<int (*)(void**, std::size_t)>(kCudaMalloc, S)(ptr, size);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(toDevPtr(*ptr), size, MemType::kCuda);
  return r;
}
template <int S>
int wrapCudaMallocManaged(void** ptr, std::size_t size, unsigned int flags) {
  AllocDepthGuard g;
  const int r =
      next<int (*)(void**, std::size_t, unsigned int)>(kCudaMallocManaged, S)(ptr, size, flags);
  if (r == 0 && g.outer && ptr != nullptr) {
    onAllocation(toDevPtr(*ptr), size, MemType::kCudaManaged);
  }
  return r;
}
template <int S>
int wrapCudaMallocPitch(void** ptr, std::size_t* pitch, std::size_t width, std::size_t height) {
  AllocDepthGuard g;
  const int r = next<int (*)(void**, std::size_t*, std::size_t, std::size_t)>(kCudaMallocPitch, S)(
      ptr, pitch, width, height);
  if (r == 0 && g.outer && ptr != nullptr && pitch != nullptr) {
    onAllocation(toDevPtr(*ptr), *pitch * height, MemType::kCuda);
  }
  return r;
}
template <int S>
int wrapCudaMallocAsync(void** ptr, std::size_t size, void* stream) {
  AllocDepthGuard g;
  const int r = next<int (*)(void**, std::size_t, void*)>(kCudaMallocAsync, S)(ptr, size, stream);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(toDevPtr(*ptr), size, MemType::kCuda);
  return r;
}
template <int S>
int wrapCudaMallocFromPoolAsync(void** ptr, std::size_t size, void* pool, void* stream) {
  AllocDepthGuard g;
  const int r = next<int (*)(void**, std::size_t, void*, void*)>(kCudaMallocFromPoolAsync, S)(
      ptr, size, pool, stream);
  if (r == 0 && g.outer && ptr != nullptr) onAllocation(toDevPtr(*ptr), size, MemType::kCuda);
  return r;
}
template <int S>
int wrapCudaFree(void* ptr) {
  DepthGuard g;
  const Range r =
      g.outer && ptr != nullptr ? onDeviceFree(reinterpret_cast<CuDevicePtr>(ptr)) : Range{};
  const int result = next<int (*)(void*)>(kCudaFree, S)(ptr);
  afterFree(r);
  return result;
}
template <int S>
int wrapCudaFreeAsync(void* ptr, void* stream) {
  DepthGuard g;
  const Range r =
      g.outer && ptr != nullptr ? onDeviceFree(reinterpret_cast<CuDevicePtr>(ptr)) : Range{};
  const int result = next<int (*)(void*, void*)>(kCudaFreeAsync, S)(ptr, stream);
  afterFree(r);
  return result;
}
template <int S>
CuResult wrapGetProc(const char* symbol, void** fn, int version, std::uint64_t flags) {
  CuResult r = next<CuResult (*)(const char*, void**, int, std::uint64_t)>(kGetProc, S)(
      symbol, fn, version, flags);
  if (r == 0 && symbol != nullptr && fn != nullptr && *fn != nullptr) {
    *fn = wrapProcResult(symbol, version, *fn);
  }
  return r;
}
template <int S>
CuResult wrapGetProcV2(const char* symbol, void** fn, int version, std::uint64_t flags, int* status) {
  CuResult r = next<CuResult (*)(const char*, void**, int, std::uint64_t, int*)>(kGetProcV2, S)(
      symbol, fn, version, flags, status);
  if (r == 0 && symbol != nullptr && fn != nullptr && *fn != nullptr) {
    *fn = wrapProcResult(symbol, version, *fn);
  }
  return r;
}

template <template <int> class W, std::size_t... I>
constexpr std::array<void*, kSlots> slotsOf(std::index_sequence<I...>) {
  return {W<static_cast<int>(I)>::get()...};
}
#define GMD_WRAPPER_GETTER(Name, fn)                             \
  template <int S>                                               \
  struct Name {                                                  \
    static void* get() { return reinterpret_cast<void*>(&fn<S>); } \
  };
GMD_WRAPPER_GETTER(GMemFreeV1, wrapMemFreeV1)
GMD_WRAPPER_GETTER(GMemFree, wrapMemFree)
GMD_WRAPPER_GETTER(GMemFreeAsync, wrapMemFreeAsync)
GMD_WRAPPER_GETTER(GMemUnmap, wrapMemUnmap)
GMD_WRAPPER_GETTER(GMemRelease, wrapMemRelease)
GMD_WRAPPER_GETTER(GMemMap, wrapMemMap)
GMD_WRAPPER_GETTER(GCudaFree, wrapCudaFree)
GMD_WRAPPER_GETTER(GCudaFreeAsync, wrapCudaFreeAsync)
GMD_WRAPPER_GETTER(GGetProc, wrapGetProc)
GMD_WRAPPER_GETTER(GGetProcV2, wrapGetProcV2)
GMD_WRAPPER_GETTER(GMemAllocV1, wrapMemAllocV1)
GMD_WRAPPER_GETTER(GMemAlloc, wrapMemAlloc)
GMD_WRAPPER_GETTER(GMemAllocPitchV1, wrapMemAllocPitchV1)
GMD_WRAPPER_GETTER(GMemAllocPitch, wrapMemAllocPitch)
GMD_WRAPPER_GETTER(GMemAllocManaged, wrapMemAllocManaged)
GMD_WRAPPER_GETTER(GMemAllocAsync, wrapMemAllocAsync)
GMD_WRAPPER_GETTER(GMemAllocFromPoolAsync, wrapMemAllocFromPoolAsync)
GMD_WRAPPER_GETTER(GCudaMalloc, wrapCudaMalloc)
GMD_WRAPPER_GETTER(GCudaMallocManaged, wrapCudaMallocManaged)
GMD_WRAPPER_GETTER(GCudaMallocPitch, wrapCudaMallocPitch)
GMD_WRAPPER_GETTER(GCudaMallocAsync, wrapCudaMallocAsync)
GMD_WRAPPER_GETTER(GCudaMallocFromPoolAsync, wrapCudaMallocFromPoolAsync)
#undef GMD_WRAPPER_GETTER

const std::array<std::array<void*, kSlots>, kNumKinds>& wrappers() noexcept {
  using Seq = std::make_index_sequence<kSlots>;
  static const std::array<std::array<void*, kSlots>, kNumKinds> w = {
      slotsOf<GMemFreeV1>(Seq{}),    slotsOf<GMemFree>(Seq{}),  slotsOf<GMemFreeAsync>(Seq{}),
      slotsOf<GMemUnmap>(Seq{}),     slotsOf<GMemRelease>(Seq{}), slotsOf<GMemMap>(Seq{}),
      slotsOf<GCudaFree>(Seq{}),     slotsOf<GCudaFreeAsync>(Seq{}), slotsOf<GGetProc>(Seq{}),
      slotsOf<GGetProcV2>(Seq{}),
      slotsOf<GMemAllocV1>(Seq{}),          slotsOf<GMemAlloc>(Seq{}),
      slotsOf<GMemAllocPitchV1>(Seq{}),     slotsOf<GMemAllocPitch>(Seq{}),
      slotsOf<GMemAllocManaged>(Seq{}),     slotsOf<GMemAllocAsync>(Seq{}),
      slotsOf<GMemAllocFromPoolAsync>(Seq{}), slotsOf<GCudaMalloc>(Seq{}),
      slotsOf<GCudaMallocManaged>(Seq{}),   slotsOf<GCudaMallocPitch>(Seq{}),
      slotsOf<GCudaMallocAsync>(Seq{}),     slotsOf<GCudaMallocFromPoolAsync>(Seq{}),
  };
  static_assert(kNumKinds == 22, "one wrapper row per kind, in Kind order");
  return w;
}

bool isWrapper(const void* fn) noexcept {
  for (const auto& kind : wrappers()) {
    for (void* w : kind) {
      if (w == fn) return true;
    }
  }
  return false;
}

// The wrapper whose next is `target`, claiming a free chain slot if needed; nullptr when full.
void* wrapperFor(Kind k, void* target) noexcept {
  if (target == nullptr) return nullptr;
  if (isWrapper(target)) return target;
  const auto& w = wrappers()[k];
  for (int s = 0; s < kSlots; ++s) {
    void* expected = nullptr;
    if (g_next[k][s].compare_exchange_strong(expected, target, std::memory_order_acq_rel) ||
        expected == target) {
      return w[s];
    }
  }
  log(LogLevel::kDebug, kLogModule,
      "cuda hooks: no free chain slot for kind %d; binding left unhooked", k);
  return nullptr;
}

// Which hook a cuGetProcAddress answer gets. The driver names entry points by base name and picks
// the ABI version from the requested CUDA version.
void* wrapProcResult(const char* symbol, int version, void* fn) noexcept {
  Kind k;
  if (std::strcmp(symbol, "cuMemFree") == 0) {
    k = version >= 3020 ? kMemFree : kMemFreeV1;
  } else if (std::strcmp(symbol, "cuMemAlloc") == 0) {
    k = version >= 3020 ? kMemAlloc : kMemAllocV1;
  } else if (std::strcmp(symbol, "cuMemAllocPitch") == 0) {
    k = version >= 3020 ? kMemAllocPitch : kMemAllocPitchV1;
  } else if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    k = version >= 12000 ? kGetProcV2 : kGetProc;
  } else if (const Name* n = findName(symbol)) {
    if (!n->driver) return fn;
    k = n->kind;
  } else {
    return fn;
  }
  void* w = wrapperFor(k, fn);
  return w != nullptr ? w : fn;
}

// --- ELF scanning -----------------------------------------------------------------------------------
struct Object {
  ElfW(Addr) base;
  const ElfW(Phdr) * phdr;
  int phnum;
  const char* name;
};

template <typename T>
T* dynPtr(const Object& o, ElfW(Addr) value) noexcept {
  // glibc relocates d_ptr entries of loaded objects in place; the vdso's are left relative.
  return reinterpret_cast<T*>(value < o.base ? o.base + value : value);
}

bool inObject(const Object& o, std::uintptr_t addr) noexcept {
  for (int i = 0; i < o.phnum; ++i) {
    const ElfW(Phdr)& p = o.phdr[i];
    if (p.p_type == PT_LOAD && addr >= o.base + p.p_vaddr && addr < o.base + p.p_vaddr + p.p_memsz) {
      return true;
    }
  }
  return false;
}

// The protection of the page holding `addr` as the loader left it.
int currentProt(const Object& o, std::uintptr_t addr) noexcept {
  for (int i = 0; i < o.phnum; ++i) {
    const ElfW(Phdr)& p = o.phdr[i];
    if (p.p_type == PT_GNU_RELRO && addr >= o.base + p.p_vaddr &&
        addr < o.base + p.p_vaddr + p.p_memsz) {
      return PROT_READ;
    }
  }
  for (int i = 0; i < o.phnum; ++i) {
    const ElfW(Phdr)& p = o.phdr[i];
    if (p.p_type == PT_LOAD && addr >= o.base + p.p_vaddr && addr < o.base + p.p_vaddr + p.p_memsz) {
      return ((p.p_flags & PF_R) ? PROT_READ : 0) | ((p.p_flags & PF_W) ? PROT_WRITE : 0) |
             ((p.p_flags & PF_X) ? PROT_EXEC : 0);
    }
  }
  return PROT_READ;
}

template <typename T>
bool writeWord(const Object& o, T* where, T value) noexcept {
  const std::uintptr_t page_size = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(where);
  void* page = reinterpret_cast<void*>(addr & ~(page_size - 1));
  const int prot = currentProt(o, addr);
  if (!(prot & PROT_WRITE) && mprotect(page, page_size, prot | PROT_WRITE) != 0) {
    log(LogLevel::kDebug, kLogModule, "cuda hooks: cannot make %p writable in %s", where,
        o.name[0] ? o.name : "(main)");
    return false;
  }
  __atomic_store_n(where, value, __ATOMIC_RELEASE);
  if (!(prot & PROT_WRITE)) mprotect(page, page_size, prot);
  return true;
}

struct Dynamic {
  const ElfW(Sym) * symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela) * rela = nullptr;
  std::size_t rela_size = 0;
  const ElfW(Rela) * jmprel = nullptr;
  std::size_t jmprel_size = 0;
  const std::uint32_t* hash = nullptr;
  const std::uint32_t* gnu_hash = nullptr;
};

bool readDynamic(const Object& o, Dynamic* d) noexcept {
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < o.phnum; ++i) {
    if (o.phdr[i].p_type == PT_DYNAMIC) {
      dyn = reinterpret_cast<const ElfW(Dyn)*>(o.base + o.phdr[i].p_vaddr);
    }
  }
  if (dyn == nullptr) return false;
  bool plt_rela = true;
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    switch (dyn->d_tag) {
      case DT_SYMTAB: d->symtab = dynPtr<const ElfW(Sym)>(o, dyn->d_un.d_ptr); break;
      case DT_STRTAB: d->strtab = dynPtr<const char>(o, dyn->d_un.d_ptr); break;
      case DT_RELA: d->rela = dynPtr<const ElfW(Rela)>(o, dyn->d_un.d_ptr); break;
      case DT_RELASZ: d->rela_size = dyn->d_un.d_val; break;
      case DT_JMPREL: d->jmprel = dynPtr<const ElfW(Rela)>(o, dyn->d_un.d_ptr); break;
      case DT_PLTRELSZ: d->jmprel_size = dyn->d_un.d_val; break;
      case DT_PLTREL: plt_rela = dyn->d_un.d_val == DT_RELA; break;
      case DT_HASH: d->hash = dynPtr<const std::uint32_t>(o, dyn->d_un.d_ptr); break;
      case DT_GNU_HASH: d->gnu_hash = dynPtr<const std::uint32_t>(o, dyn->d_un.d_ptr); break;
      default: break;
    }
  }
  if (!plt_rela) d->jmprel = nullptr;  // REL-format PLT: not used on the supported 64-bit ABIs
  return d->symtab != nullptr && d->strtab != nullptr;
}

std::size_t symbolCount(const Dynamic& d) noexcept {
  if (d.hash != nullptr) return d.hash[1];  // nchain
  if (d.gnu_hash == nullptr) return 0;
  const std::uint32_t nbuckets = d.gnu_hash[0];
  const std::uint32_t symoffset = d.gnu_hash[1];
  const std::uint32_t bloom_size = d.gnu_hash[2];
  const auto* bloom = reinterpret_cast<const ElfW(Addr)*>(d.gnu_hash + 4);
  const auto* buckets = reinterpret_cast<const std::uint32_t*>(bloom + bloom_size);
  const std::uint32_t* chain = buckets + nbuckets;
  std::uint32_t last = 0;
  for (std::uint32_t b = 0; b < nbuckets; ++b) last = buckets[b] > last ? buckets[b] : last;
  if (last < symoffset) return symoffset;
  while ((chain[last - symoffset] & 1u) == 0) ++last;
  return last + 1;
}

bool isRelocType(unsigned type) noexcept {
#if defined(__x86_64__)
  return type == R_X86_64_JUMP_SLOT || type == R_X86_64_GLOB_DAT;
#elif defined(__aarch64__)
  return type == R_AARCH64_JUMP_SLOT || type == R_AARCH64_GLOB_DAT;
#else
  (void)type;
  return false;
#endif
}

ElfW(Addr) g_driver_base = 0;
bool g_driver_base_known = false;

// Piece 1: redirect definitions in .dynsym. The driver's cu* entries; cudaFree* wherever defined.
void patchDefinitions(const Object& o, const Dynamic& d, bool is_driver) noexcept {
  const std::size_t count = symbolCount(d);
  for (std::size_t i = 1; i < count; ++i) {
    const ElfW(Sym)& sym = d.symtab[i];
    if (sym.st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym.st_info) != STT_FUNC) continue;
    const Name* n = findName(d.strtab + sym.st_name);
    if (n == nullptr || n->driver != is_driver) continue;
    void* target = reinterpret_cast<void*>(o.base + sym.st_value);
    if (isWrapper(target)) continue;
    void* w = wrapperFor(n->kind, target);
    if (w == nullptr) continue;
    // Symbol values are relative to the load base; unsigned wrap-around makes base + value == w.
    auto* value = const_cast<ElfW(Addr)*>(&sym.st_value);
    if (writeWord(o, value, static_cast<ElfW(Addr)>(reinterpret_cast<std::uintptr_t>(w) - o.base))) {
      g_slots.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

// Piece 2: redirect existing bindings (GOT slots) of one object.
void patchRelocations(const Object& o, const Dynamic& d, const ElfW(Rela) * rel,
                      std::size_t size) noexcept {
  if (rel == nullptr) return;
  for (std::size_t i = 0; i < size / sizeof(ElfW(Rela)); ++i) {
    if (!isRelocType(static_cast<unsigned>(ELF64_R_TYPE(rel[i].r_info)))) continue;
    const std::size_t sym = ELF64_R_SYM(rel[i].r_info);
    if (sym == 0) continue;
    const char* name = d.strtab + d.symtab[sym].st_name;
    const Name* n = findName(name);
    if (n == nullptr) continue;
    auto** slot = reinterpret_cast<void**>(o.base + rel[i].r_offset);
    void* cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (isWrapper(cur)) continue;
    void* target = cur;
    if (cur == nullptr || inObject(o, reinterpret_cast<std::uintptr_t>(cur))) {
      // Not bound yet (lazy PLT stub): resolve now; the patched .dynsym answers with the wrapper.
      target = dlsym(RTLD_DEFAULT, name);
      if (target == nullptr) continue;
    } else {
      Dl_info info{};
      if (dladdr(cur, &info) != 0 && info.dli_sname != nullptr &&
          std::strcmp(info.dli_sname, name) != 0 && !isWrapper(cur)) {
        g_foreign.fetch_add(1, std::memory_order_relaxed);
        log(LogLevel::kDebug, kLogModule,
            "cuda hooks: %s in %s is bound to %s (another interposer): chained", name,
            o.name[0] ? o.name : "(main)", info.dli_sname);
      }
    }
    void* w = wrapperFor(n->kind, target);
    if (w != nullptr && w != cur && writeWord(o, slot, w)) {
      g_slots.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

bool skipObject(const Object& o) noexcept {
  return std::strstr(o.name, "linux-vdso") != nullptr || std::strstr(o.name, "linux-gate") != nullptr;
}

int scanObject(struct dl_phdr_info* info, std::size_t, void*) {
  Object o{info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum,
           info->dlpi_name != nullptr ? info->dlpi_name : ""};
  if (skipObject(o)) return 0;
  Dynamic d;
  if (!readDynamic(o, &d)) return 0;
  const bool is_driver = g_driver_base_known && o.base == g_driver_base;
  patchDefinitions(o, d, is_driver);
  if (is_driver) return 0;  // the driver's own internal bindings stay as they are
  patchRelocations(o, d, d.jmprel, d.jmprel_size);
  patchRelocations(o, d, d.rela, d.rela_size);
  return 0;
}

int countObjects(struct dl_phdr_info* info, std::size_t, void* data) {
  auto* out = static_cast<std::pair<unsigned long long, unsigned long long>*>(data);
  out->first = info->dlpi_adds;
  out->second = info->dlpi_subs;
  return 1;  // the counters are the same in every entry
}

std::mutex g_install_mutex;  // serialises scans; taken only outside hooks
std::pair<unsigned long long, unsigned long long> g_seen{0, 0};

void scanAll() noexcept {
  dl_iterate_phdr(countObjects, &g_seen);
  dl_iterate_phdr(scanObject, nullptr);
}

// Classifier::setBeforeHooks: called once before the first installation.
std::atomic<void (*)() noexcept> g_before_install{nullptr};
std::once_flag g_before_install_once;

}  // namespace

void setBeforeInstall(void (*fn)() noexcept) noexcept {
  g_before_install.store(fn, std::memory_order_release);
}

bool installHooks(const DriverApi& api) noexcept {
  if (!g_installed.load(std::memory_order_acquire)) {
    // Outside g_install_mutex: what it calls takes locks of its own (libucm's).
    std::call_once(g_before_install_once, [] {
      if (auto* fn = g_before_install.load(std::memory_order_acquire)) fn();
    });
  }
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed.load(std::memory_order_acquire)) return true;
  struct link_map* lm = nullptr;
  if (api.handle == nullptr || dlinfo(api.handle, RTLD_DI_LINKMAP, &lm) != 0 || lm == nullptr) {
    log(LogLevel::kDebug, kLogModule, "cuda hooks: cannot locate the driver's link map");
    return false;
  }
  g_driver_base = lm->l_addr;
  g_driver_base_known = true;
  scanAll();
  const bool ok = g_slots.load(std::memory_order_relaxed) != 0;
  g_installed.store(ok, std::memory_order_release);
  log(ok ? LogLevel::kDebug : LogLevel::kWarn, kLogModule,
      "cuda hooks: %llu slots redirected, %llu chained to another interposer%s",
      static_cast<unsigned long long>(g_slots.load()),
      static_cast<unsigned long long>(g_foreign.load()),
      ok ? "" : "; CUDA frees will not be seen (use free mode 'validate')");
  return ok;
}

bool hooksInstalled() noexcept { return g_installed.load(std::memory_order_acquire); }

void refreshHooks(bool force) noexcept {
  if (!g_installed.load(std::memory_order_acquire)) return;
  std::pair<unsigned long long, unsigned long long> now{0, 0};
  dl_iterate_phdr(countObjects, &now);
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (!force && now == g_seen) return;
  scanAll();
}

HookCounters hookCounters() noexcept {
  return {g_slots.load(std::memory_order_relaxed), g_foreign.load(std::memory_order_relaxed)};
}

}  // namespace gmd::memtype::detail

#else  // !GMD_HAVE_CUDA

namespace gmd::memtype::detail {
bool installHooks(const DriverApi&) noexcept { return false; }
void setBeforeInstall(void (*)() noexcept) noexcept {}
bool hooksInstalled() noexcept { return false; }
void refreshHooks(bool) noexcept {}
HookCounters hookCounters() noexcept { return {}; }
}  // namespace gmd::memtype::detail

#endif  // GMD_HAVE_CUDA
