// What /proc/self/maps shows for a CUDA allocation, and whether gmd's scan rule
// (memtype/maps_scan.h: PROT_NONE or /dev/nvidia* mappings are marked as of unknown type when gmd's
// libucm events start, md/ucm_events.cc) covers it. Shared by maps_test.cc (driver API) and
// runtime_test.cc (runtime API). Each check prints the mappings it found, so the GPU run's log
// documents them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "gtest/cuda/cuda_fixture.h"
#include "memtype/maps_scan.h"

namespace gmd::memtype::cudacheck {

// Prints the mappings overlapping [p, p + size) and whether the rule covers the range.
inline bool mapsCover(const char* what, std::uintptr_t p, std::size_t size) {
  const auto maps = maps::readProcMaps();
  std::printf("[ MAPS     ] %s: [%#lx, %#lx) %zu bytes\n", what, static_cast<unsigned long>(p),
              static_cast<unsigned long>(p + size), size);
  for (const maps::Mapping& m : maps) {
    if (m.end <= p || m.start >= p + size) continue;
    std::printf("[ MAPS     ]   %#lx-%#lx %s %s%s\n", static_cast<unsigned long>(m.start),
                static_cast<unsigned long>(m.end), m.perms.c_str(),
                m.path.empty() ? "(anonymous)" : m.path.c_str(),
                m.candidate ? "  <- scan candidate" : "");
  }
  const bool covered = maps::coveredByCandidates(maps, p, size);
  std::printf("[ MAPS     ]   covered by the scan rule: %s\n", covered ? "yes" : "NO");
  std::fflush(stdout);
  return covered;
}

// On the real driver every allocation must be covered. The fake maps device memory PROT_NONE only
// with GMD_FAKE_CUDA_CPU_ACCESS=0 (maps_test.cc sets it under the fake), and managed memory always
// read-write from a memfd (it has no /dev/nvidia-uvm): there the fake's answer is printed, and
// only device memory under CPU_ACCESS=0 is checked.
inline void expectCovered(const char* what, std::uintptr_t p, std::size_t size, bool managed) {
  ASSERT_NE(p, 0u) << what;
  const bool covered = mapsCover(what, p, size);
  if (!fakeDriver()) {
    EXPECT_TRUE(covered) << what << ": gmd's maps scan would miss an allocation made before it "
                                    "started (see the mappings printed above)";
    return;
  }
  const char* access = std::getenv("GMD_FAKE_CUDA_CPU_ACCESS");
  const bool prot_none = access != nullptr && std::string(access) == "0";
  if (!managed && prot_none) {
    EXPECT_TRUE(covered) << what;
  }
}

}  // namespace gmd::memtype::cudacheck
