// The memory types gmd tells apart, and where a buffer lives. Header-only and dependency-free:
// rcache/ tags its regions with it, memtype/ classifies into it, md/ maps it onto UCX's types.
//
// Thread safety: plain values and pure functions.
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
    case MemType::kHost:
      return "host";
    case MemType::kCuda:
      return "cuda";
    case MemType::kCudaManaged:
      return "cuda-managed";
  }
  return "unknown";
}

// What a registration backend needs to know about the memory it registers: its type and, for
// device memory, the CUDA device ordinal (-1: host memory, or not known to the caller). Implicit
// from a MemType, so `reg(..., MemType::kHost, ...)` reads as before.
struct MemoryKind {
  MemType type = MemType::kHost;
  int device = -1;
  constexpr MemoryKind(MemType t = MemType::kHost, int d = -1) noexcept : type(t), device(d) {}
};

}  // namespace gmd
