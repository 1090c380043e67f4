// memtype/'s allocation hooks against the CUDA driver API (label cuda): cuMemAlloc (v2, and the
// ABI a cuGetProcAddress caller gets), cuMemAllocPitch (pitch * height), cuMemAllocManaged,
// cuMemAllocAsync, cuMemAllocFromPoolAsync on the device's default pool, and a VMM cuMemCreate +
// cuMemMap: exactly one event each, with the exact start, length, type and device, reported while
// the driver already had the allocation. Skipped with a reason where there is no driver or no GPU
// (see cuda_fixture.h for the fake) and per entry point the driver lacks (the fake has no pitch or
// pool allocations).
#include <cuda.h>

#include <cstdint>

#include "gtest/cuda/cuda_fixture.h"

namespace gmd::memtype::cudacheck {
namespace {

class AllocEvents : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = whyNotRunnable();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(rec_.subscribed());
    ASSERT_TRUE(Classifier::instance().hooksInstalled());
    auto retain = driverSymbol<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain");
    auto set_current = driverSymbol<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
    ASSERT_TRUE(retain != nullptr && set_current != nullptr);
    CUcontext ctx = nullptr;
    ASSERT_EQ(retain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(set_current(ctx), CUDA_SUCCESS);
    memFree_ = driverSymbol<CUresult (*)(CUdeviceptr)>("cuMemFree_v2");
    memFreeAsync_ = driverSymbol<CUresult (*)(CUdeviceptr, CUstream)>("cuMemFreeAsync");
    streamSync_ = driverSymbol<CUresult (*)(CUstream)>("cuStreamSynchronize");
    ASSERT_TRUE(memFree_ != nullptr && streamSync_ != nullptr);
  }
  int attribute(CUdevice_attribute a) {
    int v = 0;
    return detail::driver()->deviceGetAttribute(&v, a, 0) == 0 ? v : 0;
  }
  // Looked up after gmd's hooks, as an application initialising later does. Empty when found,
  // else the reason to skip.
  template <typename F>
  static std::string need(F& f, const char* name) {
    f = driverSymbol<F>(name);
    if (f != nullptr) return {};
    return std::string("the driver has no ") + name +
           (fakeDriver() ? " (the fake does not implement it)" : "");
  }

  AllocEventRecorder rec_;
  CUresult (*memFree_)(CUdeviceptr) = nullptr;
  CUresult (*memFreeAsync_)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*streamSync_)(CUstream) = nullptr;
};

TEST_F(AllocEvents, CuMemAlloc) {
  CUresult (*alloc)(CUdeviceptr*, size_t) = nullptr;
  if (const std::string why = need(alloc, "cuMemAlloc_v2"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 3 * kMiB + 5), CUDA_SUCCESS);
  expectAllocEvent(rec_, p, 3 * kMiB + 5, MemType::kCuda, 0);
  EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
  EXPECT_EQ(rec_.size(), 1u) << "a free is no allocation";
}

TEST_F(AllocEvents, CuMemAllocThroughCuGetProcAddress) {
  CUresult (*gpa)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*) = nullptr;
  if (const std::string why = need(gpa, "cuGetProcAddress_v2"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_EQ(gpa("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status), CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  CUdeviceptr p = 0;
  ASSERT_EQ(reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(fn)(&p, kMiB), CUDA_SUCCESS);
  expectAllocEvent(rec_, p, kMiB, MemType::kCuda, 0);
  EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
}

TEST_F(AllocEvents, CuMemAllocPitchIsPitchTimesHeight) {
  CUresult (*alloc)(CUdeviceptr*, size_t*, size_t, size_t, unsigned) = nullptr;
  if (const std::string why = need(alloc, "cuMemAllocPitch_v2"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  CUdeviceptr p = 0;
  size_t pitch = 0;
  ASSERT_EQ(alloc(&p, &pitch, 1000, 77, 4), CUDA_SUCCESS);
  EXPECT_GE(pitch, 1000u);
  expectAllocEvent(rec_, p, pitch * 77, MemType::kCuda, 0);
  EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
}

TEST_F(AllocEvents, CuMemAllocManaged) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == 0) GTEST_SKIP() << "no managed memory";
  CUresult (*alloc)(CUdeviceptr*, size_t, unsigned) = nullptr;
  if (const std::string why = need(alloc, "cuMemAllocManaged"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 2 * kMiB + 1, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  expectAllocEvent(rec_, p, 2 * kMiB + 1, MemType::kCudaManaged, 0);
  EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
}

TEST_F(AllocEvents, CuMemAllocAsync) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) GTEST_SKIP() << "no memory pools";
  CUresult (*alloc)(CUdeviceptr*, size_t, CUstream) = nullptr;
  if (const std::string why = need(alloc, "cuMemAllocAsync"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  ASSERT_NE(memFreeAsync_, nullptr);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 4 * kMiB, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(streamSync_(nullptr), CUDA_SUCCESS);
  expectAllocEvent(rec_, p, 4 * kMiB, MemType::kCuda, 0);
  EXPECT_EQ(memFreeAsync_(p, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(streamSync_(nullptr), CUDA_SUCCESS);
}

TEST_F(AllocEvents, CuMemAllocFromPoolAsyncOnTheDefaultPool) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) GTEST_SKIP() << "no memory pools";
  CUresult (*default_pool)(CUmemoryPool*, CUdevice) = nullptr;
  if (const std::string why = need(default_pool, "cuDeviceGetDefaultMemPool"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  CUresult (*alloc)(CUdeviceptr*, size_t, CUmemoryPool, CUstream) = nullptr;
  if (const std::string why = need(alloc, "cuMemAllocFromPoolAsync"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  CUmemoryPool pool = nullptr;
  ASSERT_EQ(default_pool(&pool, 0), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 2 * kMiB, pool, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(streamSync_(nullptr), CUDA_SUCCESS);
  expectAllocEvent(rec_, p, 2 * kMiB, MemType::kCuda, 0);
  EXPECT_EQ(memFreeAsync_(p, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(streamSync_(nullptr), CUDA_SUCCESS);
}

// VMM: reserving and creating are no allocation; mapping is, for the mapped range.
TEST_F(AllocEvents, VmmMapIsTheAllocation) {
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
  EXPECT_EQ(rec_.size(), 0u) << "reserving and creating are no allocation";
  ASSERT_EQ(map(va + size, size, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(set_access(va + size, size, &access, 1), CUDA_SUCCESS);
  expectAllocEvent(rec_, va + size, size, MemType::kCuda, 0);
  EXPECT_EQ(unmap(va + size, size), CUDA_SUCCESS);
  EXPECT_EQ(release(h), CUDA_SUCCESS);
  EXPECT_EQ(address_free(va, 2 * size), CUDA_SUCCESS);
  EXPECT_EQ(rec_.size(), 1u);
}

}  // namespace
}  // namespace gmd::memtype::cudacheck
