// Loading the CUDA driver at run time.
#include "memtype/cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if GMD_HAVE_CUDA
#include <cuda.h>
#endif

namespace gmd::memtype {

namespace detail {

#if GMD_HAVE_CUDA

static_assert(CUDA_SUCCESS == 0, "CuResult mirrors CUresult");
static_assert(sizeof(CUdeviceptr) == sizeof(CuDevicePtr), "CuDevicePtr mirrors CUdeviceptr");
static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(CuMemHandle), "CuMemHandle mirror");
static_assert(CUDA_ERROR_INVALID_VALUE == kCudaErrorInvalidValue &&
                  CUDA_ERROR_OUT_OF_MEMORY == kCudaErrorOutOfMemory &&
                  CUDA_ERROR_NOT_READY == kCudaErrorNotReady &&
                  CUDA_ERROR_NOT_SUPPORTED == kCudaErrorNotSupported,
              "CUresult values mirrored in cuda_driver.h");
static_assert(sizeof(CUmemAllocationProp) <= kAllocationPropSize &&
                  offsetof(CUmemAllocationProp, location) + offsetof(CUmemLocation, id) ==
                      kAllocationPropLocationIdOffset,
              "CUmemAllocationProp layout mirrored in cuda_driver.h");

namespace {

// The ABI version of each entry point we ask cuGetProcAddress for: CUDA 12.0's, the oldest
// signature every entry point below has kept since.
constexpr int kAbiVersion = 12000;

using GetProcV2 = CuResult (*)(const char*, void**, int, std::uint64_t, int*);
using GetProcV1 = CuResult (*)(const char*, void**, int, std::uint64_t);

struct Resolver {
  void* handle;
  GetProcV2 v2;
  GetProcV1 v1;
  int version;

  void* get(const char* name, const char* exported) const noexcept {
    void* fn = nullptr;
    const int want = std::min(version, kAbiVersion);
    if (v2 != nullptr) {
      int status = 0;
      if (v2(name, &fn, want, CU_GET_PROC_ADDRESS_DEFAULT, &status) == 0 &&
          status == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr) {
        return fn;
      }
    } else if (v1 != nullptr) {
      if (v1(name, &fn, want, CU_GET_PROC_ADDRESS_DEFAULT) == 0 && fn != nullptr) return fn;
    }
    return dlsym(handle, exported);  // drivers older than 11.3
  }
};

template <typename F>
void resolve(const Resolver& res, F& field, const char* name, const char* exported) noexcept {
  field = reinterpret_cast<F>(res.get(name, exported));
}

DriverApi* load() noexcept {
  const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
  if (path == nullptr || path[0] == '\0') path = "libcuda.so.1";
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (h == nullptr) {
    log(LogLevel::kDebug, kLogModule, "no CUDA driver (%s): every buffer is host memory", path);
    return nullptr;
  }
  // From here on the library stays loaded (RTLD_NODELETE): hooks may point into it.
  auto init = reinterpret_cast<CuResult (*)(unsigned)>(dlsym(h, "cuInit"));
  auto get_version = reinterpret_cast<CuResult (*)(int*)>(dlsym(h, "cuDriverGetVersion"));
  auto get_count = reinterpret_cast<CuResult (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
  int version = 0;
  int count = 0;
  if (init == nullptr || get_version == nullptr || get_count == nullptr) {
    log(LogLevel::kDebug, kLogModule, "%s is not a usable CUDA driver", path);
    return nullptr;
  }
  CuResult r = init(0);
  if (r != 0) {
    log(LogLevel::kDebug, kLogModule,
        "cuInit failed (%d): no CUDA device; every buffer is host memory", r);
    return nullptr;
  }
  if (get_version(&version) != 0 || get_count(&count) != 0 || count <= 0) {
    log(LogLevel::kDebug, kLogModule, "no CUDA device: every buffer is host memory");
    return nullptr;
  }
  static DriverApi api;
  Resolver res{h, reinterpret_cast<GetProcV2>(dlsym(h, "cuGetProcAddress_v2")),
               reinterpret_cast<GetProcV1>(dlsym(h, "cuGetProcAddress")), version};
  api.handle = h;
  api.version = version;
  api.device_count = count;
  api.is_fake = dlsym(h, "gmd_fake_cuda_driver") != nullptr;
  api.deviceGetAttribute = reinterpret_cast<decltype(api.deviceGetAttribute)>(
      res.get("cuDeviceGetAttribute", "cuDeviceGetAttribute"));
  api.pointerGetAttribute = reinterpret_cast<decltype(api.pointerGetAttribute)>(
      res.get("cuPointerGetAttribute", "cuPointerGetAttribute"));
  api.pointerGetAttributes = reinterpret_cast<decltype(api.pointerGetAttributes)>(
      res.get("cuPointerGetAttributes", "cuPointerGetAttributes"));
  api.memGetAddressRange = reinterpret_cast<decltype(api.memGetAddressRange)>(
      res.get("cuMemGetAddressRange", "cuMemGetAddressRange_v2"));
  api.memGetHandleForAddressRange = reinterpret_cast<decltype(api.memGetHandleForAddressRange)>(
      res.get("cuMemGetHandleForAddressRange", "cuMemGetHandleForAddressRange"));
  api.memFree = reinterpret_cast<decltype(api.memFree)>(res.get("cuMemFree", "cuMemFree_v2"));
  api.deviceGet = reinterpret_cast<decltype(api.deviceGet)>(res.get("cuDeviceGet", "cuDeviceGet"));
  // Optional entry points (the Copier, SYNC_MEMOPS). Exported names are the ABI versions
  // cuGetProcAddress hands out for kAbiVersion.
  resolve(res, api.memGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle",
          "cuMemGetAllocationPropertiesFromHandle");
  resolve(res, api.memCopy, "cuMemcpy", "cuMemcpy");
  resolve(res, api.memCopyAsync, "cuMemcpyAsync", "cuMemcpyAsync");
  resolve(res, api.streamCreate, "cuStreamCreate", "cuStreamCreate");
  resolve(res, api.streamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2");
  resolve(res, api.streamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize");
  resolve(res, api.streamQuery, "cuStreamQuery", "cuStreamQuery");
  resolve(res, api.eventCreate, "cuEventCreate", "cuEventCreate");
  resolve(res, api.eventRecord, "cuEventRecord", "cuEventRecord");
  resolve(res, api.eventQuery, "cuEventQuery", "cuEventQuery");
  resolve(res, api.eventSynchronize, "cuEventSynchronize", "cuEventSynchronize");
  resolve(res, api.eventDestroy, "cuEventDestroy", "cuEventDestroy_v2");
  resolve(res, api.ctxGetCurrent, "cuCtxGetCurrent", "cuCtxGetCurrent");
  resolve(res, api.ctxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent");
  resolve(res, api.ctxPushCurrent, "cuCtxPushCurrent", "cuCtxPushCurrent_v2");
  resolve(res, api.ctxPopCurrent, "cuCtxPopCurrent", "cuCtxPopCurrent_v2");
  resolve(res, api.devicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
  resolve(res, api.devicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease",
          "cuDevicePrimaryCtxRelease_v2");
  api.deviceGetPCIBusId = reinterpret_cast<decltype(api.deviceGetPCIBusId)>(
      res.get("cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId"));
  api.pointerSetAttribute = reinterpret_cast<decltype(api.pointerSetAttribute)>(
      res.get("cuPointerSetAttribute", "cuPointerSetAttribute"));
  if (api.pointerGetAttribute == nullptr || api.pointerGetAttributes == nullptr ||
      api.memGetAddressRange == nullptr || api.deviceGetAttribute == nullptr) {
    log(LogLevel::kWarn, kLogModule,
        "CUDA driver %s (version %d) lacks pointer queries; CUDA support off", path, version);
    return nullptr;
  }
  log(LogLevel::kDebug, kLogModule, "CUDA driver %s version %d, %d device(s)%s", path, version,
      count, api.is_fake ? " (test driver)" : "");
  return &api;
}

}  // namespace

const DriverApi* driver() noexcept {
  static const DriverApi* api = load();
  return api;
}

#else  // !GMD_HAVE_CUDA

const DriverApi* driver() noexcept { return nullptr; }

#endif  // GMD_HAVE_CUDA

}  // namespace detail

bool cudaDevicePciBusId(int ordinal, char* buf, std::size_t len) noexcept {
  const detail::DriverApi* api = detail::driver();
  if (api == nullptr || buf == nullptr || len == 0 || ordinal < 0 || ordinal >= api->device_count ||
      api->deviceGet == nullptr) {
    return false;
  }
  int device = 0;
  if (api->deviceGet(&device, ordinal) != 0) return false;
  char id[32] = {};
  if (api->deviceGetPCIBusId != nullptr &&
      api->deviceGetPCIBusId(id, static_cast<int>(sizeof(id)), device) == 0 && id[0] != '\0') {
    id[sizeof(id) - 1] = '\0';
  } else {
    // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID (50), _BUS_ID (33), _DEVICE_ID (34)
    int domain = 0, bus = 0, slot = 0;
    if (api->deviceGetAttribute(&domain, 50, device) != 0 ||
        api->deviceGetAttribute(&bus, 33, device) != 0 ||
        api->deviceGetAttribute(&slot, 34, device) != 0) {
      return false;
    }
    std::snprintf(id, sizeof(id), "%04x:%02x:%02x.0", domain, bus, slot);
  }
  if (std::strlen(id) >= len) return false;
  std::memcpy(buf, id, std::strlen(id) + 1);
  return true;
}

}  // namespace gmd::memtype
