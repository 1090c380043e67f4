// A fake NVML for gmd's unit tests, built as libnvidia-ml.so.1 beside the fake CUDA driver
// (fake_cuda.cc) and found through the same LD_LIBRARY_PATH entry. UCX's libuct_cuda (cuda_copy,
// cuda_ipc) is linked against libnvidia-ml.so.1, so without one UCX's CUDA transports cannot load
// next to the fake driver; NVML there answers NVLink and fabric questions only.
//
// It describes the fake driver's devices (their number and PCI addresses come from the fake driver,
// libcuda.so.1 as the dynamic linker finds it, so that GMD_FAKE_CUDA_DEVICES and
// GMD_FAKE_CUDA_PCI_BUS_IDS hold for both; no device where libcuda.so.1 is not the fake) as GPUs
// without NVLink and outside any NVLink fabric:
//   nvmlInit(_v2) / nvmlShutdown (counted: device calls answer NVML_ERROR_UNINITIALIZED outside),
//   nvmlErrorString, nvmlDeviceGetCount(_v2), nvmlDeviceGetHandleByIndex(_v2),
//   nvmlDeviceGetPciInfo(_v2, _v3), nvmlDeviceGetFieldValues (NVML_FI_DEV_NVLINK_LINK_COUNT is 0,
//   every other field NVML_ERROR_NOT_SUPPORTED), nvmlDeviceGetNvLinkRemotePciInfo(_v2):
//   NVML_ERROR_NOT_SUPPORTED, nvmlDeviceGetGpuFabricInfo: outside any fabric.
// Types are the ones nvml.h documents, declared here (the tests need no NVML headers).
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

using nvmlReturn_t = int;
constexpr nvmlReturn_t kSuccess = 0;          // NVML_SUCCESS
constexpr nvmlReturn_t kUninitialized = 1;    // NVML_ERROR_UNINITIALIZED
constexpr nvmlReturn_t kInvalidArgument = 2;  // NVML_ERROR_INVALID_ARGUMENT
constexpr nvmlReturn_t kNotSupported = 3;     // NVML_ERROR_NOT_SUPPORTED
constexpr nvmlReturn_t kNotFound = 6;         // NVML_ERROR_NOT_FOUND
constexpr nvmlReturn_t kUnknown = 999;        // NVML_ERROR_UNKNOWN

constexpr unsigned kFieldNvlinkLinkCount = 91;  // NVML_FI_DEV_NVLINK_LINK_COUNT
constexpr int kValueTypeUnsignedInt = 1;        // NVML_VALUE_TYPE_UNSIGNED_INT

struct PciInfo {  // nvmlPciInfo_t
  char busIdLegacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  char busId[32];
};
static_assert(sizeof(PciInfo) == 68);

struct FieldValue {  // nvmlFieldValue_t
  unsigned fieldId;
  unsigned scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  union {
    double dVal;
    unsigned uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
  } value;
};
static_assert(sizeof(FieldValue) == 40);

// A device handle points at its entry here.
constexpr unsigned kMaxDevices = 64;
struct Device {
  unsigned index;
};
Device g_devices[kMaxDevices];
std::atomic<int> g_init_count{0};

// The fake driver's entry points, looked up at nvmlInit (not linked: the fake driver's build does
// not wait for this library's).
using GetFn = long (*)(const char*);
using BusIdFn = int (*)(char*, int, int);
std::atomic<GetFn> g_fake_get{nullptr};
std::atomic<BusIdFn> g_bus_id{nullptr};

void findDriver() noexcept {
  if (g_fake_get.load() != nullptr) return;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // kept: the driver stays loaded
  if (h == nullptr) return;
  auto get = reinterpret_cast<GetFn>(dlsym(h, "gmd_fake_cuda_get"));
  auto bus_id = reinterpret_cast<BusIdFn>(dlsym(h, "cuDeviceGetPCIBusId"));
  if (get == nullptr || bus_id == nullptr) return;  // not the fake: no device
  g_bus_id = bus_id;
  g_fake_get = get;
}

unsigned deviceCount() noexcept {
  const GetFn get = g_fake_get.load();
  const long n = get != nullptr ? get("devices") : 0;
  return n <= 0 ? 0u : n > static_cast<long>(kMaxDevices) ? kMaxDevices : static_cast<unsigned>(n);
}

// The device behind a handle, or -1 (not initialized, not ours).
int deviceOf(const void* handle) noexcept {
  if (g_init_count.load() <= 0) return -1;
  const auto* d = static_cast<const Device*>(handle);
  if (d < g_devices || d >= g_devices + deviceCount()) return -1;
  return static_cast<int>(d->index);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvmlReturn_t nvmlInit_v2() noexcept {
  for (unsigned i = 0; i < kMaxDevices; ++i) g_devices[i].index = i;
  findDriver();
  g_init_count.fetch_add(1);
  return kSuccess;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlInit() noexcept { return nvmlInit_v2(); }

__attribute__((visibility("default"))) nvmlReturn_t nvmlShutdown() noexcept {
  int n = g_init_count.load();
  while (n > 0 && !g_init_count.compare_exchange_weak(n, n - 1)) {
  }
  return n > 0 ? kSuccess : kUninitialized;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(nvmlReturn_t result) noexcept {
  switch (result) {
    case kSuccess:
      return "Success";
    case kUninitialized:
      return "Uninitialized";
    case kInvalidArgument:
      return "Invalid Argument";
    case kNotSupported:
      return "Not Supported";
    case kNotFound:
      return "Not Found";
    default:
      return "Unknown Error";
  }
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCount_v2(
    unsigned* count) noexcept {
  if (count == nullptr) return kInvalidArgument;
  if (g_init_count.load() <= 0) return kUninitialized;
  *count = deviceCount();
  return kSuccess;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCount(unsigned* count) noexcept {
  return nvmlDeviceGetCount_v2(count);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(
    unsigned index, void** device) noexcept {
  if (device == nullptr) return kInvalidArgument;
  if (g_init_count.load() <= 0) return kUninitialized;
  if (index >= deviceCount()) return kInvalidArgument;
  *device = &g_devices[index];
  return kSuccess;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetHandleByIndex(
    unsigned index, void** device) noexcept {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPciInfo_v3(void* device,
                                                                            PciInfo* pci) noexcept {
  if (pci == nullptr) return kInvalidArgument;
  if (g_init_count.load() <= 0) return kUninitialized;
  const int d = deviceOf(device);
  if (d < 0) return kInvalidArgument;
  char id[32] = {};
  const BusIdFn bus_id = g_bus_id.load();
  if (bus_id == nullptr || bus_id(id, sizeof(id), d) != 0) return kUnknown;
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  if (std::sscanf(id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) return kUnknown;
  std::memset(pci, 0, sizeof(*pci));
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04x:%02x:%02x.%x", domain, bus, slot,
                function);
  std::snprintf(pci->busId, sizeof(pci->busId), "%08x:%02x:%02x.%x", domain, bus, slot, function);
  pci->domain = domain;
  pci->bus = bus;
  pci->device = slot;
  return kSuccess;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPciInfo_v2(void* device,
                                                                            PciInfo* pci) noexcept {
  return nvmlDeviceGetPciInfo_v3(device, pci);
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPciInfo(void* device,
                                                                         PciInfo* pci) noexcept {
  return nvmlDeviceGetPciInfo_v3(device, pci);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetFieldValues(
    void* device, int count, FieldValue* values) noexcept {
  if (values == nullptr || count < 0) return kInvalidArgument;
  if (g_init_count.load() <= 0) return kUninitialized;
  if (deviceOf(device) < 0) return kInvalidArgument;
  for (int i = 0; i < count; ++i) {
    FieldValue& v = values[i];
    v.timestamp = 0;
    v.latencyUsec = 0;
    if (v.fieldId == kFieldNvlinkLinkCount) {
      v.valueType = kValueTypeUnsignedInt;
      v.nvmlReturn = kSuccess;
      v.value.ullVal = 0;  // no NVLink (uiVal 0)
    } else {
      v.nvmlReturn = kNotSupported;
    }
  }
  return kSuccess;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(
    void* device, unsigned, PciInfo* pci) noexcept {
  if (pci == nullptr) return kInvalidArgument;
  if (g_init_count.load() <= 0) return kUninitialized;
  if (deviceOf(device) < 0) return kInvalidArgument;
  return kNotSupported;  // no links
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(
    void* device, unsigned link, PciInfo* pci) noexcept {
  return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

// Not part of an NVLink fabric: success, with the fabric state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
// (what a GPU outside any fabric answers). nvmlGpuFabricInfo_t: clusterUuid[16], status, state.
// The versioned nvmlDeviceGetGpuFabricInfoV is left out: UCX falls back to this one without it.
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetGpuFabricInfo(
    void* device, void* info) noexcept {
  if (info == nullptr) return kInvalidArgument;
  if (g_init_count.load() <= 0) return kUninitialized;
  if (deviceOf(device) < 0) return kInvalidArgument;
  struct FabricInfo {
    char clusterUuid[16];
    nvmlReturn_t status;
    unsigned char state;
  } fabric{};
  static_assert(sizeof(FabricInfo) == 24);
  fabric.status = kNotSupported;
  fabric.state = 0;  // NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
  std::memcpy(info, &fabric, sizeof(fabric));
  return kSuccess;
}

}  // extern "C"
