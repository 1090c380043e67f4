// A fake CUDA driver for gmd's unit tests, built as libcuda.so.1 in its own folder and found first on
// LD_LIBRARY_PATH (or through GMD_CUDA_DRIVER_PATH). It implements the driver API subset that
// memtype/ and its tests use, with "device" memory simulated by host memory:
//
//   cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute,
//   cuGetProcAddress (11.3 and 12 signatures), cuMemAlloc(_v2), cuMemFree(_v2), cuMemAllocManaged,
//   cuMemAllocAsync(_ptsz), cuMemFreeAsync(_ptsz), cuMemAddressReserve/Free, cuMemCreate, cuMemMap,
//   cuMemUnmap, cuMemRelease, cuMemSetAccess, cuMemGetAllocationGranularity, cuPointerGetAttribute(s),
//   cuMemGetAddressRange(_v2), cuMemGetHandleForAddressRange (a memfd stands in for the dma-buf),
//   cuDeviceGetPCIBusId, cuDevicePrimaryCtxRetain/Release, cuCtxSetCurrent/GetCurrent,
//   cuCtxSynchronize, cuStreamSynchronize (contexts are tokens; setting one selects the device that
//   later allocations land on, like the "current_device" control).
//
// PCI bus ids: device d answers GMD_FAKE_CUDA_PCI_BUS_IDS's d-th comma-separated entry when the
// variable is set (read at each call), else 0000:<0x3b + d>:00.0. cuDeviceGetAttribute's PCI domain,
// bus and device attributes agree with it.
//
// Allocations come first-fit from one arena placed below 4 GiB (so that the 32-bit cuMemFree v1 can
// be exercised) and freed space is reused lowest address first, so a re-allocation of the same size
// lands at the same address with a new buffer ID, as on a real device.
//
// GMD_FAKE_CUDA_FRESH_PAGES=1 gives freed ranges fresh pages (see freshPages()).
//
// Test controls (exported, C linkage): gmd_fake_cuda_driver (marker), gmd_fake_cuda_set(key, value),
// gmd_fake_cuda_get(key). Built with -Bsymbolic so that its own references (e.g. the table behind
// cuGetProcAddress) bind to its functions, not to gmd's redirected symbols.
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#ifndef GMD_FAKE_CUDA_DEFAULT_DEVICES
#define GMD_FAKE_CUDA_DEFAULT_DEVICES 1
#endif

namespace {

using CUresult = int;
using CUdeviceptr = std::uint64_t;
using CUhandle = std::uint64_t;

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;      // CUDA_ERROR_INVALID_VALUE
constexpr CUresult kNotInitialized = 3;    // CUDA_ERROR_NOT_INITIALIZED
constexpr CUresult kNoDevice = 100;        // CUDA_ERROR_NO_DEVICE
constexpr CUresult kInvalidDevice = 101;   // CUDA_ERROR_INVALID_DEVICE
constexpr CUresult kNotFound = 500;        // CUDA_ERROR_NOT_FOUND
constexpr CUresult kNotSupported = 801;    // CUDA_ERROR_NOT_SUPPORTED
constexpr CUresult kOutOfMemory = 2;       // CUDA_ERROR_OUT_OF_MEMORY

constexpr std::size_t kArenaSize = 512ul << 20;
// Below 4 GiB, and below AddressSanitizer's shadow (which starts just under 2 GiB).
constexpr std::uintptr_t kArenaHints[] = {0x40000000, 0x10000000};
constexpr std::size_t kGranule = 64 * 1024;

enum class Kind { kDevice, kManaged, kMapped };
struct Alloc {
  std::size_t size;
  std::uint64_t id;
  Kind kind;
  CUhandle handle;
  int device;
};
struct Handle {
  std::size_t size;
  int mappings;
  bool released;
  int device;
};

std::mutex g_mu;
bool g_initialized = false;
std::uintptr_t g_arena = 0;
std::map<std::uintptr_t, std::size_t> g_free;      // free VA: start -> size
std::map<std::uintptr_t, Alloc> g_allocs;          // live allocations and mappings
std::map<std::uintptr_t, std::size_t> g_reserved;  // cuMemAddressReserve ranges
std::map<CUhandle, Handle> g_handles;
std::uint64_t g_next_id = 1000;
CUhandle g_next_handle = 1;

// Test controls.
std::atomic<long> g_devices{-1};  // -1: GMD_FAKE_CUDA_DEVICES, else the built-in default
std::atomic<long> g_current_device{0};
std::atomic<long> g_dmabuf_supported{1};
std::atomic<long> g_dmabuf_pcie{1};  // accepts CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
std::atomic<long> g_dmabuf_fail{0};
std::atomic<long> g_last_dmabuf_fd{-1};
std::atomic<long> g_last_dmabuf_flags{-1};
std::atomic<long> g_dmabuf_exports{0};
std::atomic<long> g_pointer_queries{0};
std::atomic<long> g_frees{0};

long devices() {
  long d = g_devices.load();
  if (d >= 0) return d;
  const char* env = std::getenv("GMD_FAKE_CUDA_DEVICES");
  return env != nullptr ? std::atol(env) : GMD_FAKE_CUDA_DEFAULT_DEVICES;
}

// Device d's PCI address (see the top comment). False when the variable names no such entry or
// the entry is not domain:bus:device.function in hex.
bool pciAddress(int device, unsigned* domain, unsigned* bus, unsigned* slot, unsigned* function) {
  const char* env = std::getenv("GMD_FAKE_CUDA_PCI_BUS_IDS");
  if (env == nullptr || env[0] == '\0') {
    *domain = 0;
    *bus = 0x3b + static_cast<unsigned>(device);
    *slot = 0;
    *function = 0;
    return true;
  }
  const char* entry = env;
  for (int i = 0; i < device && entry != nullptr; ++i) {
    entry = std::strchr(entry, ',');
    if (entry != nullptr) ++entry;
  }
  return entry != nullptr &&
         std::sscanf(entry, "%x:%x:%x.%x", domain, bus, slot, function) == 4;
}

bool ensureArena() {
  if (g_arena != 0) return true;
  void* p = MAP_FAILED;
  for (std::uintptr_t hint : kArenaHints) {
    p = mmap(reinterpret_cast<void*>(hint), kArenaSize, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED) break;
  }
  if (p == MAP_FAILED) {
    p = mmap(nullptr, kArenaSize, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
  }
  g_arena = reinterpret_cast<std::uintptr_t>(p);
  g_free[g_arena] = kArenaSize;
  return true;
}

std::size_t roundUp(std::size_t n) { return (n + kGranule - 1) & ~(kGranule - 1); }

// Caller holds g_mu.
std::uintptr_t takeVa(std::size_t size) {
  if (!ensureArena()) return 0;
  size = roundUp(size);
  for (auto it = g_free.begin(); it != g_free.end(); ++it) {
    if (it->second >= size) {
      const std::uintptr_t start = it->first;
      const std::size_t left = it->second - size;
      g_free.erase(it);
      if (left != 0) g_free[start + size] = left;
      return start;
    }
  }
  return 0;
}

// GMD_FAKE_CUDA_FRESH_PAGES=1: a freed range gets fresh pages (its old pages are dropped with a
// direct madvise system call, which libucm does not see, as it sees no real cuMemFree), so that a
// registration kept across the free still holds the old pages, as on a device.
bool freshPages() {
  const char* env = std::getenv("GMD_FAKE_CUDA_FRESH_PAGES");
  return env != nullptr && env[0] == '1';
}

void giveVa(std::uintptr_t start, std::size_t size) {
  size = roundUp(size);
  // Scrub like a device would not, so that tests can tell new memory from old.
  std::memset(reinterpret_cast<void*>(start), 0, size);
  if (freshPages()) syscall(SYS_madvise, start, size, MADV_DONTNEED);
  auto next = g_free.lower_bound(start);
  if (next != g_free.end() && start + size == next->first) {
    size += next->second;
    next = g_free.erase(next);
  }
  if (next != g_free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return;
    }
  }
  g_free[start] = size;
}

// Caller holds g_mu. The live allocation or mapping holding ptr, or end().
std::map<std::uintptr_t, Alloc>::iterator findAlloc(CUdeviceptr ptr) {
  auto it = g_allocs.upper_bound(ptr);
  if (it == g_allocs.begin()) return g_allocs.end();
  --it;
  return ptr < it->first + it->second.size ? it : g_allocs.end();
}

CUresult allocate(CUdeviceptr* out, std::size_t size, Kind kind) {
  if (out == nullptr || size == 0) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_initialized) return kNotInitialized;
  const std::uintptr_t va = takeVa(size);
  if (va == 0) return kOutOfMemory;
  g_allocs[va] = {size, g_next_id++, kind, 0, static_cast<int>(g_current_device.load())};
  *out = va;
  return kSuccess;
}

CUresult release(CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_initialized) return kNotInitialized;
  auto it = g_allocs.find(ptr);
  if (it == g_allocs.end() || it->second.kind == Kind::kMapped) return kInvalidValue;
  giveVa(it->first, it->second.size);
  g_allocs.erase(it);
  g_frees.fetch_add(1);
  return kSuccess;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int gmd_fake_cuda_driver = 1;

__attribute__((visibility("default"))) void gmd_fake_cuda_set(const char* key, long value) {
  if (std::strcmp(key, "devices") == 0) g_devices = value;
  if (std::strcmp(key, "current_device") == 0) g_current_device = value;
  if (std::strcmp(key, "dmabuf_supported") == 0) g_dmabuf_supported = value;
  if (std::strcmp(key, "dmabuf_pcie") == 0) g_dmabuf_pcie = value;
  if (std::strcmp(key, "dmabuf_fail") == 0) g_dmabuf_fail = value;
}

__attribute__((visibility("default"))) long gmd_fake_cuda_get(const char* key) {
  if (std::strcmp(key, "live_allocations") == 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    return static_cast<long>(g_allocs.size());
  }
  if (std::strcmp(key, "pointer_queries") == 0) return g_pointer_queries.load();
  if (std::strcmp(key, "frees") == 0) return g_frees.load();
  if (std::strcmp(key, "last_dmabuf_fd") == 0) return g_last_dmabuf_fd.load();
  if (std::strcmp(key, "last_dmabuf_flags") == 0) return g_last_dmabuf_flags.load();
  if (std::strcmp(key, "dmabuf_exports") == 0) return g_dmabuf_exports.load();
  if (std::strcmp(key, "arena") == 0) return static_cast<long>(g_arena);
  if (std::strcmp(key, "handles") == 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    return static_cast<long>(g_handles.size());
  }
  return -1;
}

CUresult cuInit(unsigned flags) {
  if (flags != 0) return kInvalidValue;
  if (devices() <= 0) return kNoDevice;
  std::lock_guard<std::mutex> lock(g_mu);
  g_initialized = true;
  return ensureArena() ? kSuccess : kOutOfMemory;
}

CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  *version = 12080;
  return kSuccess;
}

CUresult cuDeviceGetCount(int* count) {
  if (count == nullptr) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  *count = static_cast<int>(devices());
  return kSuccess;
}

CUresult cuDeviceGet(int* device, int ordinal) {
  if (device == nullptr) return kInvalidValue;
  if (ordinal < 0 || ordinal >= devices()) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, int device) {
  if (value == nullptr) return kInvalidValue;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  const bool pci = pciAddress(device, &domain, &bus, &slot, &function);
  switch (attribute) {
    case 124:  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
      *value = static_cast<int>(g_dmabuf_supported.load());
      break;
    case 33:  // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
      *value = pci ? static_cast<int>(bus) : 0;
      break;
    case 34:  // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
      *value = pci ? static_cast<int>(slot) : 0;
      break;
    case 50:  // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID
      *value = pci ? static_cast<int>(domain) : 0;
      break;
    case 83:   // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
    case 102:  // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    case 110:  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    case 115:  // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
      *value = 1;
      break;
    default:
      *value = 0;
  }
  return kSuccess;
}

CUresult cuDeviceGetPCIBusId(char* out, int len, int device) {
  if (out == nullptr || len <= 0) return kInvalidValue;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  if (!pciAddress(device, &domain, &bus, &slot, &function)) return kInvalidValue;
  std::snprintf(out, static_cast<std::size_t>(len), "%04x:%02x:%02x.%x", domain, bus, slot, function);
  return kSuccess;
}

// Contexts are tokens (device + 1); making one current selects the device allocations land on.
CUresult cuDevicePrimaryCtxRetain(void** ctx, int device) {
  if (ctx == nullptr) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  *ctx = reinterpret_cast<void*>(static_cast<std::uintptr_t>(device) + 1);
  return kSuccess;
}
CUresult cuDevicePrimaryCtxRelease_v2(int device) {
  return device >= 0 && device < devices() ? kSuccess : kInvalidDevice;
}
CUresult cuCtxSetCurrent(void* ctx) {
  const auto token = reinterpret_cast<std::uintptr_t>(ctx);
  if (token == 0 || static_cast<long>(token) > devices()) return kInvalidValue;
  g_current_device = static_cast<long>(token) - 1;
  return kSuccess;
}
CUresult cuCtxGetCurrent(void** ctx) {
  if (ctx == nullptr) return kInvalidValue;
  *ctx = reinterpret_cast<void*>(static_cast<std::uintptr_t>(g_current_device.load()) + 1);
  return kSuccess;
}
CUresult cuCtxSynchronize() { return kSuccess; }  // every operation here completes at once
CUresult cuStreamSynchronize(void*) { return kSuccess; }
CUresult cuStreamSynchronize_ptsz(void*) { return kSuccess; }

CUresult cuMemAlloc_v2(CUdeviceptr* ptr, std::size_t size) {
  return allocate(ptr, size, Kind::kDevice);
}

CUresult cuMemAlloc(unsigned int* ptr, unsigned int size) {
  CUdeviceptr p = 0;
  if (ptr == nullptr) return kInvalidValue;
  CUresult r = allocate(&p, size, Kind::kDevice);
  if (r != kSuccess) return r;
  if (p > 0xffffffffu) {
    release(p);
    return kOutOfMemory;
  }
  *ptr = static_cast<unsigned int>(p);
  return kSuccess;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) { return release(ptr); }
CUresult cuMemFree(unsigned int ptr) { return release(ptr); }

CUresult cuMemAllocManaged(CUdeviceptr* ptr, std::size_t size, unsigned int) {
  return allocate(ptr, size, Kind::kManaged);
}

CUresult cuMemAllocAsync(CUdeviceptr* ptr, std::size_t size, void*) {
  return allocate(ptr, size, Kind::kDevice);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* ptr, std::size_t size, void*) {
  return allocate(ptr, size, Kind::kDevice);
}
CUresult cuMemFreeAsync(CUdeviceptr ptr, void*) { return release(ptr); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, void*) { return release(ptr); }

CUresult cuMemGetAllocationGranularity(std::size_t* granularity, const void*, int) {
  if (granularity == nullptr) return kInvalidValue;
  *granularity = kGranule;
  return kSuccess;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t, CUdeviceptr,
                             unsigned long long) {
  if (ptr == nullptr || size == 0 || size % kGranule != 0) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  const std::uintptr_t va = takeVa(size);
  if (va == 0) return kOutOfMemory;
  g_reserved[va] = size;
  *ptr = va;
  return kSuccess;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_reserved.find(ptr);
  if (it == g_reserved.end() || it->second != size) return kInvalidValue;
  for (const auto& a : g_allocs) {
    if (a.first >= ptr && a.first < ptr + size) return kInvalidValue;  // still mapped
  }
  giveVa(ptr, size);
  g_reserved.erase(it);
  return kSuccess;
}

CUresult cuMemCreate(CUhandle* handle, std::size_t size, const void* prop, unsigned long long) {
  if (handle == nullptr || size == 0 || size % kGranule != 0) return kInvalidValue;
  // CUmemAllocationProp starts {type, requestedHandleTypes, location {type, id}}: the device is
  // location.id, as on a real driver.
  const int device = prop != nullptr ? static_cast<const int*>(prop)[3]
                                     : static_cast<int>(g_current_device.load());
  if (device < 0 || device >= devices()) return kInvalidDevice;
  std::lock_guard<std::mutex> lock(g_mu);
  *handle = g_next_handle++;
  g_handles[*handle] = {size, 0, false, device};
  return kSuccess;
}

CUresult cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUhandle handle,
                  unsigned long long) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto h = g_handles.find(handle);
  if (h == g_handles.end() || h->second.released || offset + size > h->second.size) {
    return kInvalidValue;
  }
  auto r = g_reserved.upper_bound(ptr);
  if (r == g_reserved.begin()) return kInvalidValue;
  --r;
  if (ptr + size > r->first + r->second) return kInvalidValue;
  if (findAlloc(ptr) != g_allocs.end()) return kInvalidValue;
  g_allocs[ptr] = {size, g_next_id++, Kind::kMapped, handle, h->second.device};
  ++h->second.mappings;
  return kSuccess;
}

CUresult cuMemSetAccess(CUdeviceptr, std::size_t, const void*, std::size_t) { return kSuccess; }

CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_allocs.find(ptr);
  if (it == g_allocs.end() || it->second.kind != Kind::kMapped || it->second.size != size) {
    return kInvalidValue;
  }
  auto h = g_handles.find(it->second.handle);
  std::memset(reinterpret_cast<void*>(ptr), 0, size);
  g_allocs.erase(it);
  g_frees.fetch_add(1);
  if (h != g_handles.end() && --h->second.mappings == 0 && h->second.released) g_handles.erase(h);
  return kSuccess;
}

CUresult cuMemRelease(CUhandle handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto h = g_handles.find(handle);
  if (h == g_handles.end() || h->second.released) return kInvalidValue;
  h->second.released = true;
  if (h->second.mappings == 0) g_handles.erase(h);
  return kSuccess;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = findAlloc(ptr);
  if (it == g_allocs.end()) return kNotFound;
  if (base != nullptr) *base = it->first;
  if (size != nullptr) *size = it->second.size;
  return kSuccess;
}

CUresult cuPointerGetAttributes(unsigned count, int* attributes, void** data, CUdeviceptr ptr) {
  if (attributes == nullptr || data == nullptr) return kInvalidValue;
  g_pointer_queries.fetch_add(1);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = findAlloc(ptr);
  const bool found = it != g_allocs.end();
  for (unsigned i = 0; i < count; ++i) {
    void* d = data[i];
    if (d == nullptr) return kInvalidValue;
    switch (attributes[i]) {
      case 2:  // MEMORY_TYPE: CU_MEMORYTYPE_DEVICE for device, mapped and managed
        *static_cast<unsigned*>(d) = found ? 2u : 0u;
        break;
      case 7:  // BUFFER_ID
        *static_cast<unsigned long long*>(d) = found ? it->second.id : 0;
        break;
      case 8:  // IS_MANAGED
        *static_cast<unsigned*>(d) = found && it->second.kind == Kind::kManaged ? 1u : 0u;
        break;
      case 9:  // DEVICE_ORDINAL
        *static_cast<int*>(d) = found ? it->second.device : -2;
        break;
      case 11:  // RANGE_START_ADDR
        *static_cast<CUdeviceptr*>(d) = found ? it->first : 0;
        break;
      case 12:  // RANGE_SIZE
        *static_cast<std::size_t*>(d) = found ? it->second.size : 0;
        break;
      case 13:  // MAPPED
        *static_cast<unsigned*>(d) = found ? 1u : 0u;
        break;
      default:
        return kInvalidValue;
    }
  }
  return kSuccess;
}

CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (findAlloc(ptr) == g_allocs.end()) return kInvalidValue;  // not a CUDA pointer
  }
  void* d[] = {data};
  return cuPointerGetAttributes(1, &attribute, d, ptr);
}

CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr ptr, std::size_t size, int type,
                                       unsigned long long flags) {
  if (handle == nullptr || type != 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */) return kInvalidValue;
  if (!g_dmabuf_supported.load()) return kNotSupported;
  if ((flags & 1u) && !g_dmabuf_pcie.load()) return kInvalidValue;
  if (g_dmabuf_fail.load()) return kNotSupported;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (ptr % page != 0 || size % page != 0 || size == 0) return kInvalidValue;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = findAlloc(ptr);
    if (it == g_allocs.end() || it->second.kind == Kind::kManaged ||
        ptr + size > it->first + roundUp(it->second.size)) {
      return kInvalidValue;
    }
  }
  const int fd = memfd_create("gmd-fake-dmabuf", MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return kOutOfMemory;
  }
  *static_cast<int*>(handle) = fd;
  g_last_dmabuf_fd = fd;
  g_last_dmabuf_flags = static_cast<long>(flags);
  g_dmabuf_exports.fetch_add(1);
  return kSuccess;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int version, std::uint64_t flags,
                             int* status);

CUresult cuGetProcAddress(const char* symbol, void** fn, int version, std::uint64_t flags) {
  int status = 0;
  return cuGetProcAddress_v2(symbol, fn, version, flags, &status);
}

CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int version, std::uint64_t flags,
                             int* status) {
  if (symbol == nullptr || fn == nullptr) return kInvalidValue;
  const bool ptsz = (flags & 2u) != 0;  // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
  struct Entry {
    const char* name;
    void* fn;
  };
  const Entry table[] = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<void*>(&cuDriverGetVersion)},
      {"cuDeviceGetCount", reinterpret_cast<void*>(&cuDeviceGetCount)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cuDeviceGetAttribute)},
      {"cuDeviceGetPCIBusId", reinterpret_cast<void*>(&cuDeviceGetPCIBusId)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&cuDevicePrimaryCtxRetain)},
      {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&cuDevicePrimaryCtxRelease_v2)},
      {"cuCtxSetCurrent", reinterpret_cast<void*>(&cuCtxSetCurrent)},
      {"cuCtxGetCurrent", reinterpret_cast<void*>(&cuCtxGetCurrent)},
      {"cuCtxSynchronize", reinterpret_cast<void*>(&cuCtxSynchronize)},
      {"cuStreamSynchronize", ptsz ? reinterpret_cast<void*>(&cuStreamSynchronize_ptsz)
                                   : reinterpret_cast<void*>(&cuStreamSynchronize)},
      {"cuMemAlloc", version >= 3020 ? reinterpret_cast<void*>(&cuMemAlloc_v2)
                                     : reinterpret_cast<void*>(&cuMemAlloc)},
      {"cuMemFree", version >= 3020 ? reinterpret_cast<void*>(&cuMemFree_v2)
                                    : reinterpret_cast<void*>(&cuMemFree)},
      {"cuMemAllocManaged", reinterpret_cast<void*>(&cuMemAllocManaged)},
      {"cuMemAllocAsync", ptsz ? reinterpret_cast<void*>(&cuMemAllocAsync_ptsz)
                               : reinterpret_cast<void*>(&cuMemAllocAsync)},
      {"cuMemFreeAsync", ptsz ? reinterpret_cast<void*>(&cuMemFreeAsync_ptsz)
                              : reinterpret_cast<void*>(&cuMemFreeAsync)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemMap", reinterpret_cast<void*>(&cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
      {"cuMemGetAddressRange", reinterpret_cast<void*>(&cuMemGetAddressRange_v2)},
      {"cuPointerGetAttribute", reinterpret_cast<void*>(&cuPointerGetAttribute)},
      {"cuPointerGetAttributes", reinterpret_cast<void*>(&cuPointerGetAttributes)},
      {"cuMemGetHandleForAddressRange", reinterpret_cast<void*>(&cuMemGetHandleForAddressRange)},
      {"cuGetProcAddress", version >= 12000 ? reinterpret_cast<void*>(&cuGetProcAddress_v2)
                                            : reinterpret_cast<void*>(&cuGetProcAddress)},
  };
  for (const Entry& e : table) {
    if (std::strcmp(e.name, symbol) == 0) {
      *fn = e.fn;
      if (status != nullptr) *status = 0;  // CU_GET_PROC_ADDRESS_SUCCESS
      return kSuccess;
    }
  }
  *fn = nullptr;
  if (status != nullptr) *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
  return kNotFound;
}

}  // extern "C"
