// memtype/maps_scan.h: the /proc/self/maps rule gmd's libucm events use for allocations made before
// they started (md/ucm_events.cc), on fixed lines and on this process's own mappings.
#include "memtype/maps_scan.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>

namespace gmd::memtype::maps {
namespace {

TEST(MapsScanRule, ProtNoneAndDevNvidiaAreCandidates) {
  EXPECT_TRUE(isCandidate("---p", ""));
  EXPECT_TRUE(isCandidate("---s", "/memfd:x (deleted)"));
  EXPECT_TRUE(isCandidate("rw-s", "/dev/nvidia-uvm"));
  EXPECT_TRUE(isCandidate("rw-s", "/dev/nvidiactl"));
  EXPECT_TRUE(isCandidate("rw-s", "/dev/nvidia0"));
  EXPECT_FALSE(isCandidate("rw-p", ""));
  EXPECT_FALSE(isCandidate("r--p", "/usr/lib/libc.so.6"));
  EXPECT_FALSE(isCandidate("rw-s", "/dev/shm/nvidia"));
}

TEST(MapsScanRule, ParsesALine) {
  Mapping m;
  ASSERT_TRUE(parseLine("7f0000000000-7f0000200000 rw-s 00000000 00:05 123   /dev/nvidia-uvm", &m));
  EXPECT_EQ(m.start, 0x7f0000000000u);
  EXPECT_EQ(m.end, 0x7f0000200000u);
  EXPECT_EQ(m.perms, "rw-s");
  EXPECT_EQ(m.path, "/dev/nvidia-uvm");
  EXPECT_TRUE(m.candidate);
  ASSERT_TRUE(parseLine("10000-20000 ---p 00000000 00:00 0 ", &m));
  EXPECT_TRUE(m.path.empty());
  EXPECT_TRUE(m.candidate);
  EXPECT_FALSE(parseLine("garbage", &m));
  EXPECT_FALSE(parseLine("20000-10000 rw-p 00000000 00:00 0", &m));
}

TEST(MapsScanRule, CoverageNeedsAdjacentCandidates) {
  std::vector<Mapping> maps(3);
  maps[0] = {0x1000, 0x3000, "---p", "", true};
  maps[1] = {0x3000, 0x5000, "rw-s", "/dev/nvidia0", true};
  maps[2] = {0x6000, 0x8000, "---p", "", true};
  EXPECT_TRUE(coveredByCandidates(maps, 0x1000, 0x4000));
  EXPECT_TRUE(coveredByCandidates(maps, 0x2000, 0x1000));
  EXPECT_FALSE(coveredByCandidates(maps, 0x4000, 0x3000)) << "gap at 0x5000";
  EXPECT_FALSE(coveredByCandidates(maps, 0x0, 0x2000));
  maps[1].candidate = false;
  EXPECT_FALSE(coveredByCandidates(maps, 0x1000, 0x4000));
}

TEST(MapsScanRule, SeesThisProcessesProtNoneMapping) {
  const std::size_t len = 1 << 20;
  void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  EXPECT_TRUE(coveredByCandidates(readProcMaps(), at, len));
  ASSERT_EQ(mprotect(p, len, PROT_READ), 0);
  EXPECT_FALSE(coveredByCandidates(readProcMaps(), at, len));
  munmap(p, len);
}

}  // namespace
}  // namespace gmd::memtype::maps
