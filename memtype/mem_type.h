// Memory types gmd tells apart. Header-only and dependency-free so that rcache/ can tag its regions
// with it without depending on memtype/'s library.
#pragma once

#include <cstdint>

namespace gmd {

enum class MemType : std::uint8_t {
  kHost = 0,         // pageable or pinned host memory
  kCuda = 1,         // CUDA device memory (cuMemAlloc, cudaMalloc, VMM cuMemCreate+cuMemMap)
  kCudaManaged = 2,  // CUDA managed (unified) memory: migrates between host and device
};

constexpr const char* memTypeName(MemType t) noexcept {
  switch (t) {
    case MemType::kHost: return "host";
    case MemType::kCuda: return "cuda";
    case MemType::kCudaManaged: return "cuda-managed";
  }
  return "unknown";
}

}  // namespace gmd
