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
};

// The loaded driver, or nullptr when there is none (no library, no device, CUDA compiled out).
const DriverApi* driver() noexcept;

// Tests and benchmarks only: make the Classifier answer as a process without a driver does (true),
// or restore its real state (false). Not thread-safe against concurrent classify().
void simulateNoDriver(bool on) noexcept;

// The module name memtype/ logs under (common/log.h; hook-safe).
inline constexpr const char* kLogModule = "memtype";

}  // namespace gmd::memtype::detail
