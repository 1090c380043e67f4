// memtype/ and GPUDirect export against a real CUDA driver (label cuda). Skipped with a reason where
// there is no driver or no GPU, and where the fake test driver is what got loaded.
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>

#include "gtest/memtype/fake_driver.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace gmd::memtype {
namespace {

constexpr std::size_t kMiB = 1 << 20;

class RealCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Classifier::instance().cudaAvailable()) {
      GTEST_SKIP() << "no CUDA driver or no GPU on this machine";
    }
    api_ = detail::driver();
    if (api_->is_fake) {
      GTEST_SKIP() << "the fake test driver was loaded (LD_LIBRARY_PATH or GMD_CUDA_DRIVER_PATH); "
                      "the cuda label needs the real libcuda.so.1";
    }
    // Looked up after gmd installed its hooks, as an application initialising later would.
    sym(ctxRetain_, "cuDevicePrimaryCtxRetain");
    sym(ctxSetCurrent_, "cuCtxSetCurrent");
    sym(memAlloc_, "cuMemAlloc_v2");
    sym(memFree_, "cuMemFree_v2");
    sym(memAllocManaged_, "cuMemAllocManaged");
    sym(reserve_, "cuMemAddressReserve");
    sym(addressFree_, "cuMemAddressFree");
    sym(create_, "cuMemCreate");
    sym(map_, "cuMemMap");
    sym(setAccess_, "cuMemSetAccess");
    sym(unmap_, "cuMemUnmap");
    sym(release_, "cuMemRelease");
    sym(granularity_, "cuMemGetAllocationGranularity");
    CUcontext ctx = nullptr;
    ASSERT_EQ(ctxRetain_(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(ctxSetCurrent_(ctx), CUDA_SUCCESS);
    ASSERT_TRUE(rec_.subscribed());
  }
  template <typename F>
  void sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(api_->handle, name));
    ASSERT_NE(f, nullptr) << name;
  }
  Info classify(CUdeviceptr p) {
    return Classifier::instance().classify(reinterpret_cast<const void*>(p), 1);
  }

  const detail::DriverApi* api_ = nullptr;
  test::FreeRecorder rec_;
  CUresult (*ctxRetain_)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctxSetCurrent_)(CUcontext) = nullptr;
  CUresult (*memAlloc_)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*memFree_)(CUdeviceptr) = nullptr;
  CUresult (*memAllocManaged_)(CUdeviceptr*, size_t, unsigned) = nullptr;
  CUresult (*reserve_)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*addressFree_)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create_)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                      unsigned long long) = nullptr;
  CUresult (*map_)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                   unsigned long long) = nullptr;
  CUresult (*setAccess_)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*unmap_)(CUdeviceptr, size_t) = nullptr;
  CUresult (*release_)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*granularity_)(size_t*, const CUmemAllocationProp*,
                           CUmemAllocationGranularity_flags) = nullptr;
};

TEST_F(RealCudaTest, DeviceAllocationIsClassifiedAndItsFreeSeen) {
  CUdeviceptr p = 0;
  ASSERT_EQ(memAlloc_(&p, 4 * kMiB), CUDA_SUCCESS);
  const Info info = classify(p + 4096);
  EXPECT_EQ(info.type, MemType::kCuda);
  EXPECT_EQ(info.base, p);
  EXPECT_GE(info.size, 4 * kMiB);
  EXPECT_EQ(info.device, 0);
  EXPECT_NE(info.buffer_id, 0u);
  ASSERT_EQ(memFree_(p), CUDA_SUCCESS);
  EXPECT_EQ(rec_.count(info.base, info.size), 1u);
  EXPECT_EQ(classify(p).type, MemType::kHost);
}

TEST_F(RealCudaTest, ManagedAllocationIsManaged) {
  CUdeviceptr p = 0;
  ASSERT_EQ(memAllocManaged_(&p, 2 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(classify(p).type, MemType::kCudaManaged);
  ASSERT_EQ(memFree_(p), CUDA_SUCCESS);
  EXPECT_GE(rec_.size(), 1u);
}

TEST_F(RealCudaTest, VmmMappingIsClassifiedAndUnmapSeen) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  ASSERT_EQ(granularity_(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  const size_t size = ((4 * kMiB + gran - 1) / gran) * gran;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(reserve_(&va, size, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(create_(&h, size, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(map_(va, size, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(setAccess_(va, size, &access, 1), CUDA_SUCCESS);
  const Info info = classify(va + 4096);
  EXPECT_EQ(info.type, MemType::kCuda);
  ASSERT_EQ(unmap_(va, size), CUDA_SUCCESS);
  EXPECT_EQ(rec_.count(va, size), 1u);
  ASSERT_EQ(release_(h), CUDA_SUCCESS);
  ASSERT_EQ(addressFree_(va, size), CUDA_SUCCESS);
}

TEST_F(RealCudaTest, DmabufFdIsExported) {
  int supported = 0;
  ASSERT_EQ(api_->deviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0), 0);
  if (supported == 0 || api_->memGetHandleForAddressRange == nullptr) {
    GTEST_SKIP() << "this GPU/driver does not export dma-buf";
  }
  CUdeviceptr p = 0;
  ASSERT_EQ(memAlloc_(&p, 4 * kMiB), CUDA_SUCCESS);
  int fd = -1;
  int r = api_->memGetHandleForAddressRange(&fd, p, 2 * kMiB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                            CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
  if (r != 0) {
    r = api_->memGetHandleForAddressRange(&fd, p, 2 * kMiB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  }
  EXPECT_EQ(r, 0);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  ASSERT_EQ(memFree_(p), CUDA_SUCCESS);
}

TEST_F(RealCudaTest, DynamicRuntimeCudaFreeIsSeen) {
  void* rt = dlopen("libcudart.so", RTLD_NOW | RTLD_GLOBAL);
  if (rt == nullptr) rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (rt == nullptr) rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_GLOBAL);
  if (rt == nullptr) GTEST_SKIP() << "no libcudart.so on the library path";
  Classifier::instance().refreshHooks();  // the runtime was loaded after installation
  auto cuda_malloc = reinterpret_cast<int (*)(void**, size_t)>(dlsym(rt, "cudaMalloc"));
  auto cuda_free = reinterpret_cast<int (*)(void*)>(dlsym(rt, "cudaFree"));
  ASSERT_NE(cuda_malloc, nullptr);
  ASSERT_NE(cuda_free, nullptr);
  void* p = nullptr;
  ASSERT_EQ(cuda_malloc(&p, 4 * kMiB), 0);
  const Info info = classify(reinterpret_cast<CUdeviceptr>(p));
  ASSERT_EQ(info.type, MemType::kCuda);
  ASSERT_EQ(cuda_free(p), 0);
  EXPECT_EQ(rec_.count(info.base, info.size), 1u);
}

}  // namespace
}  // namespace gmd::memtype
