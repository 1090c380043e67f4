// Internal to memtype/: the CUDA driver entry points gmd calls, loaded at run time.
//
// The table holds the driver's own functions (resolved before any hook is installed), so calls made
// through it never re-enter gmd's hooks. Outside memtype/, only md/gpudirect.cc (the dma-buf
// export) and the tests include it.
//
// Thread safety: driver() loads once (first caller does the work, others wait) and then returns the
// same immutable table.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/log.h"
#include "memtype/memtype.h"

namespace gmd::memtype::detail {

// Plain mirrors of the driver's types, so that this header compiles without cuda.h.
using CuResult = int;              // CUresult; 0 is CUDA_SUCCESS
using CuDevicePtr = std::uint64_t;  // CUdeviceptr
using CuMemHandle = std::uint64_t;  // CUmemGenericAllocationHandle
using CuStream = void*;            // CUstream
using CuEvent = void*;             // CUevent
using CuContext = void*;           // CUcontext

struct DriverApi {
  void* handle = nullptr;  // dlopen handle of the driver library (never closed)
  int version = 0;         // cuDriverGetVersion
  int device_count = 0;
  bool is_fake = false;    // the test driver (exports gmd_fake_cuda_driver)

  CuResult (*deviceGetAttribute)(int* value, int attribute, int device) = nullptr;
  CuResult (*pointerGetAttribute)(void* data, int attribute, CuDevicePtr ptr) = nullptr;
  CuResult (*pointerGetAttributes)(unsigned count, int* attributes, void** data,
                                   CuDevicePtr ptr) = nullptr;
  CuResult (*memGetAddressRange)(CuDevicePtr* base, std::size_t* size, CuDevicePtr ptr) = nullptr;
  // Optional (CUDA >= 11.7 drivers); nullptr when absent.
  CuResult (*memGetHandleForAddressRange)(void* handle, CuDevicePtr ptr, std::size_t size, int type,
                                          unsigned long long flags) = nullptr;
  CuResult (*deviceGet)(int* device, int ordinal) = nullptr;
  // Optional; nullptr when absent (then the PCI attributes answer, function 0).
  CuResult (*deviceGetPCIBusId)(char* bus_id, int len, int device) = nullptr;
  // The driver's own free entry points, for tests that need to free behind the hooks' back.
  CuResult (*memFree)(CuDevicePtr ptr) = nullptr;
  // Optional; nullptr when absent (then setSyncMemops() answers -1, memtype/copier.h).
  CuResult (*pointerSetAttribute)(const void* value, int attribute, CuDevicePtr ptr) = nullptr;
  // Optional: the CUmemAllocationProp of a VMM handle (into a buffer of kAllocationPropSize bytes),
  // for the device a cuMemMap maps.
  CuResult (*memGetAllocationPropertiesFromHandle)(void* prop, CuMemHandle handle) = nullptr;

  // Optional: copies, streams, events and contexts (the Copier, memtype/copier.h). A driver lacking
  // any of them still classifies; hasCopyApi() says whether the Copier can run on it.
  CuResult (*memCopy)(CuDevicePtr dst, CuDevicePtr src, std::size_t bytes) = nullptr;
  CuResult (*memCopyAsync)(CuDevicePtr dst, CuDevicePtr src, std::size_t bytes,
                          CuStream stream) = nullptr;
  CuResult (*streamCreate)(CuStream* stream, unsigned flags) = nullptr;
  CuResult (*streamDestroy)(CuStream stream) = nullptr;
  CuResult (*streamSynchronize)(CuStream stream) = nullptr;
  CuResult (*streamQuery)(CuStream stream) = nullptr;
  CuResult (*eventCreate)(CuEvent* event, unsigned flags) = nullptr;
  CuResult (*eventRecord)(CuEvent event, CuStream stream) = nullptr;
  CuResult (*eventQuery)(CuEvent event) = nullptr;
  CuResult (*eventSynchronize)(CuEvent event) = nullptr;
  CuResult (*eventDestroy)(CuEvent event) = nullptr;
  CuResult (*ctxGetCurrent)(CuContext* ctx) = nullptr;
  CuResult (*ctxSetCurrent)(CuContext ctx) = nullptr;
  CuResult (*ctxPushCurrent)(CuContext ctx) = nullptr;
  CuResult (*ctxPopCurrent)(CuContext* ctx) = nullptr;
  CuResult (*devicePrimaryCtxRetain)(CuContext* ctx, int device) = nullptr;
  CuResult (*devicePrimaryCtxRelease)(int device) = nullptr;

  bool hasCopyApi() const noexcept {
    return memCopyAsync != nullptr && streamCreate != nullptr && streamDestroy != nullptr &&
           streamSynchronize != nullptr && eventCreate != nullptr && eventRecord != nullptr &&
           eventQuery != nullptr && eventSynchronize != nullptr && eventDestroy != nullptr &&
           ctxGetCurrent != nullptr && ctxPushCurrent != nullptr && ctxPopCurrent != nullptr &&
           devicePrimaryCtxRetain != nullptr && devicePrimaryCtxRelease != nullptr &&
           deviceGet != nullptr;
  }
};

// CUmemAllocationProp: at most this many bytes; its location.id (the device ordinal for a device
// location) is an int at this offset (checked against cuda.h where it is available).
inline constexpr std::size_t kAllocationPropSize = 64;
inline constexpr std::size_t kAllocationPropLocationIdOffset = 12;

// CUresult values memtype/ decides on (cuda.h's, checked against it where cuda.h is available).
inline constexpr CuResult kCudaSuccess = 0;
inline constexpr CuResult kCudaErrorInvalidValue = 1;
inline constexpr CuResult kCudaErrorOutOfMemory = 2;
inline constexpr CuResult kCudaErrorNotReady = 600;
inline constexpr CuResult kCudaErrorNotSupported = 801;

// The loaded driver, or nullptr when there is none (no library, no device, CUDA compiled out).
const DriverApi* driver() noexcept;

// Tests and benchmarks only: make the Classifier answer as a process without a driver does (true),
// or restore its real state (false). Not thread-safe against concurrent classify().
void simulateNoDriver(bool on) noexcept;

// The module name memtype/ logs under (common/log.h; hook-safe).
inline constexpr const char* kLogModule = "memtype";

}  // namespace gmd::memtype::detail
