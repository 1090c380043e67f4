// gmd memory-type classification: host, CUDA device or CUDA managed. UCX-free.
//
// The CUDA driver is loaded at run time (dlopen libcuda.so.1, or GMD_CUDA_DRIVER_PATH for tests).
// Without a driver or a device, classify() answers kHost at near-zero cost and logs nothing.
//
// Thread safety: all methods may be called from any thread; classify() on a known range takes no
// exclusive lock. Free subscribers are called synchronously on the freeing thread, before the memory
// can be reused, and must be hook-safe (no allocation, no blocking lock).
#pragma once

#include <cstddef>
#include <cstdint>

#include "memtype/mem_type.h"

namespace gmd::memtype {

struct Info {
  MemType type = MemType::kHost;
  std::uintptr_t base = 0;     // allocation base (0 for host)
  std::size_t size = 0;        // allocation size (0 for host)
  int device = -1;             // CUDA device ordinal, -1 for host
  std::uint64_t buffer_id = 0; // CU_POINTER_ATTRIBUTE_BUFFER_ID, 0 when unknown
};

// How CUDA frees are noticed.
enum class FreeMode : std::uint8_t {
  kHooks,       // intercept the driver's free entry points (default)
  kValidate,    // check the buffer ID on each lookup instead of hooking
  kOff,         // neither (unsafe; for experiments)
};

using FreeCallback = void (*)(void* arg, std::uintptr_t start, std::size_t length);

// Process-wide classifier (one CUDA driver per process).
class Classifier {
 public:
  static Classifier& instance() noexcept;

  bool cudaAvailable() const noexcept;  // a driver was loaded and reports at least one device
  Info classify(const void* address, std::size_t length) noexcept;

  // Subscribe to CUDA frees; returns false when no room. Subscribers are called for every range freed.
  bool subscribe(FreeCallback cb, void* arg) noexcept;
  void unsubscribe(FreeCallback cb, void* arg) noexcept;
};

}  // namespace gmd::memtype
