// What the loaded CUDA driver itself says about an address, asked through memtype's unhooked
// table: the oracle the cuda-label tests check classify() against, and the query the benchmark
// times. No GoogleTest here (the benchmark includes it too).
//
// Thread safety: truth() may be called from any thread once the driver is loaded.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memtype/cuda_driver.h"

namespace gmd::memtype::cudacheck {

// What the driver itself says about an address (queried through gmd's unhooked table).
struct Truth {
  bool device = false;  // CU_MEMORYTYPE_DEVICE (device, managed or VMM-mapped memory)
  bool managed = false;
  std::uintptr_t base = 0;
  std::size_t size = 0;
  int device_ordinal = -1;
  std::uint64_t buffer_id = 0;
};

inline Truth truth(std::uintptr_t address) {
  const detail::DriverApi* api = detail::driver();
  unsigned type = 0;
  unsigned managed = 0;
  int ordinal = -1;
  std::uint64_t start = 0;
  std::size_t size = 0;
  unsigned long long id = 0;
  // MEMORY_TYPE, IS_MANAGED, DEVICE_ORDINAL, RANGE_START_ADDR, RANGE_SIZE, BUFFER_ID
  int attrs[] = {2, 8, 9, 11, 12, 7};
  void* data[] = {&type, &managed, &ordinal, &start, &size, &id};
  Truth t;
  if (api->pointerGetAttributes(6, attrs, data, address) != 0) return t;
  t.device = type == 2u;
  if (!t.device) return t;
  t.managed = managed != 0;
  t.base = start;
  t.size = size;
  t.device_ordinal = ordinal;
  t.buffer_id = id;
  return t;
}

}  // namespace gmd::memtype::cudacheck
