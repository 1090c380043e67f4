// What /proc/self/maps shows for CUDA allocations (label cuda), and a CPU touch of device memory.
//
//   MapsScan.*         after cuMemAlloc, cuMemAllocManaged, cuMemCreate + cuMemMap and
//                      cuMemAllocAsync: prints the mappings over each range and checks that gmd's
//                      scan rule (memtype/maps_scan.h, used by md/ucm_events.cc when its libucm
//                      events start) covers it on the real driver. The runtime's cudaMalloc,
//                      cudaMallocManaged and cudaMallocAsync are in runtime_test.cc (MapsScan there).
//   CpuAccessFaults.*  a CPU read of cuMemAlloc memory dies with SIGSEGV on a discrete GPU. Skipped
//                      where the CPU may read device memory (a coherent link, e.g. Grace Hopper:
//                      CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES or
//                      DIRECT_MANAGED_MEM_ACCESS_FROM_HOST). PAGEABLE_MEMORY_ACCESS alone (HMM on
//                      x86) does not make cuMemAlloc memory CPU-readable, so it is only printed.
//
// Under the fake (GMD_CUDA_TEST_FAKE=1) this binary sets GMD_FAKE_CUDA_CPU_ACCESS=0 unless it is
// set already, before anything loads the driver: device memory is then PROT_NONE, as the fake's
// imitation of a discrete GPU.
#include <cuda.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "gtest/cuda/cuda_fixture.h"
#include "gtest/cuda/maps_scan.h"

namespace gmd::memtype::cudacheck {
namespace {

// Before the C++ static initialisers (gmd's classifier among them) and before any driver is loaded.
__attribute__((constructor(101))) void fakeDiscreteGpu() {
  const char* fake = std::getenv("GMD_CUDA_TEST_FAKE");
  if (fake != nullptr && std::strcmp(fake, "1") == 0) setenv("GMD_FAKE_CUDA_CPU_ACCESS", "0", 0);
}

class MapsFixture : public ::testing::Test {
 public:
  static int attribute(CUdevice_attribute a) {
    int v = 0;
    return detail::driver()->deviceGetAttribute(&v, a, 0) == 0 ? v : 0;
  }

 protected:
  void SetUp() override {
    const std::string why = whyNotRunnable();
    if (!why.empty()) GTEST_SKIP() << why;
    auto retain = driverSymbol<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain");
    auto set_current = driverSymbol<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
    ASSERT_TRUE(retain != nullptr && set_current != nullptr);
    CUcontext ctx = nullptr;
    ASSERT_EQ(retain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(set_current(ctx), CUDA_SUCCESS);
    alloc_ = driverSymbol<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc_v2");
    free_ = driverSymbol<CUresult (*)(CUdeviceptr)>("cuMemFree_v2");
    ASSERT_TRUE(alloc_ != nullptr && free_ != nullptr);
  }
  CUresult (*alloc_)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*free_)(CUdeviceptr) = nullptr;
};

using MapsScan = MapsFixture;

TEST_F(MapsScan, CuMemAlloc) {
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc_(&p, 4 * kMiB), CUDA_SUCCESS);
  expectCovered("cuMemAlloc", p, 4 * kMiB, false);
  EXPECT_EQ(free_(p), CUDA_SUCCESS);
}

TEST_F(MapsScan, CuMemAllocManaged) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == 0) GTEST_SKIP() << "no managed memory";
  auto alloc = driverSymbol<CUresult (*)(CUdeviceptr*, size_t, unsigned)>("cuMemAllocManaged");
  ASSERT_NE(alloc, nullptr);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 2 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  expectCovered("cuMemAllocManaged", p, 2 * kMiB, true);
  EXPECT_EQ(free_(p), CUDA_SUCCESS);
}

TEST_F(MapsScan, CuMemAllocAsync) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) GTEST_SKIP() << "no memory pools";
  auto alloc = driverSymbol<CUresult (*)(CUdeviceptr*, size_t, CUstream)>("cuMemAllocAsync");
  auto free_async = driverSymbol<CUresult (*)(CUdeviceptr, CUstream)>("cuMemFreeAsync");
  auto sync = driverSymbol<CUresult (*)(CUstream)>("cuStreamSynchronize");
  ASSERT_TRUE(alloc != nullptr && free_async != nullptr && sync != nullptr);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 4 * kMiB, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(sync(nullptr), CUDA_SUCCESS);
  expectCovered("cuMemAllocAsync", p, 4 * kMiB, false);
  EXPECT_EQ(free_async(p, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(sync(nullptr), CUDA_SUCCESS);
}

TEST_F(MapsScan, CuMemCreateAndMap) {
  if (attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0) {
    GTEST_SKIP() << "device 0 does not support the VMM API";
  }
  auto reserve =
      driverSymbol<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
          "cuMemAddressReserve");
  auto address_free = driverSymbol<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  auto create =
      driverSymbol<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                                unsigned long long)>("cuMemCreate");
  auto map = driverSymbol<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                       unsigned long long)>("cuMemMap");
  auto set_access = driverSymbol<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>(
      "cuMemSetAccess");
  auto unmap = driverSymbol<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  auto release = driverSymbol<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  auto granularity =
      driverSymbol<CUresult (*)(size_t*, const CUmemAllocationProp*,
                                CUmemAllocationGranularity_flags)>("cuMemGetAllocationGranularity");
  ASSERT_TRUE(reserve && address_free && create && map && set_access && unmap && release &&
              granularity);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  ASSERT_EQ(granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  const size_t size = ((2 * kMiB + gran - 1) / gran) * gran;
  CUdeviceptr va = 0;
  ASSERT_EQ(reserve(&va, 2 * size, 0, 0, 0), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(create(&h, size, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(map(va, size, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(set_access(va, size, &access, 1), CUDA_SUCCESS);
  expectCovered("cuMemCreate + cuMemMap (mapped half)", va, size, false);
  (void)mapsCover("cuMemAddressReserve (unmapped half)", va + size, size);
  EXPECT_EQ(unmap(va, size), CUDA_SUCCESS);
  EXPECT_EQ(release(h), CUDA_SUCCESS);
  EXPECT_EQ(address_free(va, 2 * size), CUDA_SUCCESS);
}

using CpuAccessFaults = MapsFixture;

// Empty when a CPU read of cuMemAlloc memory should fault here, else why not.
std::string whyCpuMayRead() {
  const int ats =
      MapsFixture::attribute(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
  const int direct =
      MapsFixture::attribute(CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST);
  std::printf("[ ATTR     ] PAGEABLE_MEMORY_ACCESS=%d USES_HOST_PAGE_TABLES=%d "
              "DIRECT_MANAGED_MEM_ACCESS_FROM_HOST=%d\n",
              MapsFixture::attribute(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS), ats, direct);
  if (ats != 0 || direct != 0) {
    return "device 0 shares the CPU's page tables or lets the host access device memory "
           "directly (a coherent GPU, e.g. Grace Hopper): the CPU may read cuMemAlloc memory";
  }
  if (fakeDriver()) {
    const char* access = std::getenv("GMD_FAKE_CUDA_CPU_ACCESS");
    if (access == nullptr || std::strcmp(access, "0") != 0) {
      return "the fake driver lets the CPU read device memory (GMD_FAKE_CUDA_CPU_ACCESS is not 0)";
    }
  }
  return {};
}

TEST_F(CpuAccessFaults, CpuReadOfCuMemAllocDiesWithSigsegv) {
  if (const std::string why = whyCpuMayRead(); !why.empty()) GTEST_SKIP() << why;
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc_(&p, 2 * kMiB), CUDA_SUCCESS);
  (void)mapsCover("cuMemAlloc (CPU read target)", p, 2 * kMiB);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const volatile unsigned char* byte = reinterpret_cast<const volatile unsigned char*>(p + 4096);
  EXPECT_EXIT({ std::_Exit(*byte == 0xA5 ? 3 : 4); }, ::testing::KilledBySignal(SIGSEGV), "")
      << "a CPU read of device memory did not fault: is this GPU coherent with the CPU?";
  EXPECT_EQ(free_(p), CUDA_SUCCESS);
}

}  // namespace
}  // namespace gmd::memtype::cudacheck
