// memtype/ against the CUDA driver API (label cuda): classification of device, managed, VMM and
// stream-ordered allocations; host memory; every driver free path seen before the memory can be
// reused (checked by getting the same address back and classifying again); dma-buf export.
// Skipped with a reason where there is no driver or no GPU (see cuda_fixture.h for the fake).
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gtest/cuda/cuda_fixture.h"

namespace gmd::memtype::cudacheck {
namespace {

class DriverFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = whyNotRunnable();
    if (!why.empty()) GTEST_SKIP() << why;
    // Looked up after gmd installed its hooks, as an application initialising later would.
    sym(ctxRetain_, "cuDevicePrimaryCtxRetain");
    sym(ctxSetCurrent_, "cuCtxSetCurrent");
    sym(memAlloc_, "cuMemAlloc_v2");
    sym(memFree_, "cuMemFree_v2");
    sym(memAllocManaged_, "cuMemAllocManaged");
    sym(memAllocAsync_, "cuMemAllocAsync");
    sym(memFreeAsync_, "cuMemFreeAsync");
    sym(streamSync_, "cuStreamSynchronize");
    sym(reserve_, "cuMemAddressReserve");
    sym(addressFree_, "cuMemAddressFree");
    sym(create_, "cuMemCreate");
    sym(map_, "cuMemMap");
    sym(setAccess_, "cuMemSetAccess");
    sym(unmap_, "cuMemUnmap");
    sym(release_, "cuMemRelease");
    sym(granularity_, "cuMemGetAllocationGranularity");
    if (HasFatalFailure()) return;
    ASSERT_TRUE(Classifier::instance().hooksInstalled());
    ASSERT_TRUE(rec_.subscribed());
    setDevice(0);
  }
  template <typename F>
  void sym(F& f, const char* name) {
    f = driverSymbol<F>(name);
    ASSERT_NE(f, nullptr) << name;
  }
  void setDevice(int device) {
    CUcontext ctx = nullptr;
    ASSERT_EQ(ctxRetain_(&ctx, device), CUDA_SUCCESS);
    ASSERT_EQ(ctxSetCurrent_(ctx), CUDA_SUCCESS);
  }
  int attribute(CUdevice_attribute a, int device = 0) {
    int v = 0;
    return detail::driver()->deviceGetAttribute(&v, a, device) == 0 ? v : 0;
  }
  std::uintptr_t alloc(std::size_t size) {
    CUdeviceptr p = 0;
    return memAlloc_(&p, size) == CUDA_SUCCESS ? p : 0;
  }
  std::uintptr_t allocAsync(std::size_t size) {
    CUdeviceptr p = 0;
    return memAllocAsync_(&p, size, nullptr) == CUDA_SUCCESS ? p : 0;
  }

  // A VMM range: `chunks` physical allocations of `chunk` bytes each, mapped back to back in one
  // reservation on device 0.
  struct Vmm {
    CUdeviceptr va = 0;
    std::size_t chunk = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
  };
  CUmemAllocationProp vmmProp(int device = 0) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    if (attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device) != 0) {
      prop.allocFlags.gpuDirectRDMACapable = 1;  // so the range can also be exported as dma-buf
    }
    return prop;
  }
  void mapChunk(Vmm& v, std::size_t i, const CUmemAllocationProp& prop) {
    CUmemGenericAllocationHandle h = 0;
    ASSERT_EQ(create_(&h, v.chunk, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(map_(v.va + i * v.chunk, v.chunk, 0, h, 0), CUDA_SUCCESS);
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(setAccess_(v.va + i * v.chunk, v.chunk, &access, 1), CUDA_SUCCESS);
    v.handles[i] = h;
  }
  void vmmCreate(Vmm& v, std::size_t chunks) {
    if (attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0) {
      GTEST_SKIP() << "device 0 does not support the VMM API";
    }
    const CUmemAllocationProp prop = vmmProp();
    size_t gran = 0;
    ASSERT_EQ(granularity_(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    v.chunk = ((2 * kMiB + gran - 1) / gran) * gran;
    v.handles.assign(chunks, 0);
    ASSERT_EQ(reserve_(&v.va, chunks * v.chunk, 0, 0, 0), CUDA_SUCCESS);
    for (std::size_t i = 0; i < chunks; ++i) {
      mapChunk(v, i, prop);
      if (HasFatalFailure()) return;
    }
  }
  void vmmDestroy(Vmm& v) {
    for (std::size_t i = 0; i < v.handles.size(); ++i) {
      if (v.handles[i] == 0) continue;
      EXPECT_EQ(unmap_(v.va + i * v.chunk, v.chunk), CUDA_SUCCESS);
      EXPECT_EQ(release_(v.handles[i]), CUDA_SUCCESS);
    }
    if (v.va != 0) {
      EXPECT_EQ(addressFree_(v.va, v.handles.size() * v.chunk), CUDA_SUCCESS);
    }
  }

  LiveFreeRecorder rec_;
  CUresult (*ctxRetain_)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctxSetCurrent_)(CUcontext) = nullptr;
  CUresult (*memAlloc_)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*memFree_)(CUdeviceptr) = nullptr;
  CUresult (*memAllocManaged_)(CUdeviceptr*, size_t, unsigned) = nullptr;
  CUresult (*memAllocAsync_)(CUdeviceptr*, size_t, CUstream) = nullptr;
  CUresult (*memFreeAsync_)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*streamSync_)(CUstream) = nullptr;
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

// --- classification ---------------------------------------------------------------------------

class Classify : public DriverFixture {};

TEST_F(Classify, CuMemAllocIsDeviceWithItsBaseSizeAndDevice) {
  const std::uintptr_t p = alloc(4 * kMiB);
  ASSERT_NE(p, 0u);
  for (std::uintptr_t at : {p, p + 4096, p + 4 * kMiB - 1}) {
    expectAllocation(at, p, 4 * kMiB, 0, true);
  }
  EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
}

TEST_F(Classify, EveryDeviceReportsItsOwnOrdinal) {
  const int n = Classifier::instance().deviceCount();
  if (n < 2) GTEST_SKIP() << "one GPU: nothing to tell apart (" << n << " device)";
  for (int d = 0; d < n; ++d) {
    setDevice(d);
    const std::uintptr_t p = alloc(2 * kMiB);
    ASSERT_NE(p, 0u) << "device " << d;
    expectAllocation(p, p, 2 * kMiB, d, true);
    EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
  }
  setDevice(0);
}

TEST_F(Classify, CuMemAllocManagedIsManaged) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == 0) {
    GTEST_SKIP() << "device 0 cannot allocate managed memory";
  }
  CUdeviceptr p = 0;
  ASSERT_EQ(memAllocManaged_(&p, 2 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  expectAllocation(p + 4096, p, 2 * kMiB, 0, true, MemType::kCudaManaged);
  EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
  EXPECT_EQ(rec_.count(p), 1u);
}

// Several physical allocations mapped side by side in one reservation: each is its own range.
TEST_F(Classify, VmmChunksInOneReservationAreEachTheirOwnRange) {
  Vmm v;
  vmmCreate(v, 3);
  if (IsSkipped() || HasFatalFailure()) return vmmDestroy(v);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::uintptr_t at = v.va + i * v.chunk + 4096;
    const Info info = classify(at);
    EXPECT_EQ(info.type, MemType::kCuda) << "chunk " << i;
    EXPECT_EQ(info.base, v.va + i * v.chunk) << "chunk " << i;
    EXPECT_EQ(info.size, v.chunk) << "chunk " << i;
    EXPECT_EQ(info.device, 0);
    expectMatchesDriver(info, at);
  }
  vmmDestroy(v);
}

TEST_F(Classify, CuMemAllocAsyncIsDevice) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) {
    GTEST_SKIP() << "device 0 has no memory pools (cuMemAllocAsync)";
  }
  const std::uintptr_t p = allocAsync(4 * kMiB);
  ASSERT_NE(p, 0u);
  ASSERT_EQ(streamSync_(nullptr), CUDA_SUCCESS);
  expectAllocation(p + 4096, p, 4 * kMiB, 0, false);
  EXPECT_EQ(memFreeAsync_(p, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(streamSync_(nullptr), CUDA_SUCCESS);
}

// --- host memory ------------------------------------------------------------------------------

class Host : public DriverFixture {};

TEST_F(Host, MallocMmapAndStackAreHost) {
  std::unique_ptr<char[]> heap(new char[kMiB]);
  void* map = mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  char stack[256] = {};
  for (const void* p : {static_cast<const void*>(heap.get()), static_cast<const void*>(map),
                        static_cast<const void*>(stack)}) {
    const Info info = Classifier::instance().classify(p, 1);
    EXPECT_EQ(info.type, MemType::kHost);
    EXPECT_EQ(info.base, 0u);
    EXPECT_EQ(info.device, -1);
  }
  munmap(map, 2 * kMiB);
}

TEST_F(Host, PinnedAndRegisteredHostMemoryIsHost) {
  if (fakeDriver()) GTEST_SKIP() << "the fake driver has no pinned host memory";
  auto host_alloc = driverSymbol<CUresult (*)(void**, size_t, unsigned)>("cuMemHostAlloc");
  auto host_free = driverSymbol<CUresult (*)(void*)>("cuMemFreeHost");
  auto host_register = driverSymbol<CUresult (*)(void*, size_t, unsigned)>("cuMemHostRegister_v2");
  auto host_unregister = driverSymbol<CUresult (*)(void*)>("cuMemHostUnregister");
  ASSERT_NE(host_alloc, nullptr);
  ASSERT_NE(host_free, nullptr);
  ASSERT_NE(host_register, nullptr);
  ASSERT_NE(host_unregister, nullptr);
  void* pinned = nullptr;
  ASSERT_EQ(host_alloc(&pinned, 2 * kMiB, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  EXPECT_EQ(Classifier::instance().classify(pinned, 1).type, MemType::kHost);
  EXPECT_EQ(host_free(pinned), CUDA_SUCCESS);
  void* map = mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(host_register(map, 2 * kMiB, 0), CUDA_SUCCESS);
  EXPECT_EQ(Classifier::instance().classify(map, 1).type, MemType::kHost);
  EXPECT_EQ(host_unregister(map), CUDA_SUCCESS);
  munmap(map, 2 * kMiB);
}

// --- driver free paths: reported while the memory is still allocated, then the same address is
// allocated again and classified afresh ---------------------------------------------------------

class DriverFree : public DriverFixture {};

TEST_F(DriverFree, CuMemFreeIsSeenBeforeTheAddressIsReused) {
  checkFreeSeenBeforeReuse(
      rec_, MemType::kCuda, [&] { return alloc(4 * kMiB); },
      [&](std::uintptr_t p) { return memFree_(p) == CUDA_SUCCESS; }, [] {});
}

TEST_F(DriverFree, CuMemFreeAsyncAndSyncIsSeenBeforeTheAddressIsReused) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) {
    GTEST_SKIP() << "device 0 has no memory pools (cuMemAllocAsync)";
  }
  checkFreeSeenBeforeReuse(
      rec_, MemType::kCuda, [&] { return allocAsync(4 * kMiB); },
      [&](std::uintptr_t p) { return memFreeAsync_(p, nullptr) == CUDA_SUCCESS; },
      [&] { EXPECT_EQ(streamSync_(nullptr), CUDA_SUCCESS); });
}

TEST_F(DriverFree, CuMemFreeOfManagedMemoryIsSeenBeforeTheAddressIsReused) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == 0) {
    GTEST_SKIP() << "device 0 cannot allocate managed memory";
  }
  checkFreeSeenBeforeReuse(
      rec_, MemType::kCudaManaged,
      [&]() -> std::uintptr_t {
        CUdeviceptr x = 0;
        return memAllocManaged_(&x, 2 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS ? x : 0;
      },
      [&](std::uintptr_t p) { return memFree_(p) == CUDA_SUCCESS; }, [] {});
}

// Unmapping the middle chunk of three: only it is reported; the neighbours stay device memory; a
// new allocation mapped at the same address (the reservation guarantees it) is classified afresh.
TEST_F(DriverFree, CuMemUnmapIsSeenAndANewMappingThereIsClassifiedAfresh) {
  Vmm v;
  vmmCreate(v, 3);
  if (IsSkipped() || HasFatalFailure()) return vmmDestroy(v);
  const std::uintptr_t mid = v.va + v.chunk;
  const Info before = classify(mid);
  ASSERT_EQ(before.type, MemType::kCuda);
  ASSERT_NE(classify(v.va).type, MemType::kHost);
  ASSERT_EQ(unmap_(mid, v.chunk), CUDA_SUCCESS);
  EXPECT_EQ(rec_.count(mid, v.chunk), 1u);
  EXPECT_EQ(rec_.liveIdAtFree(mid), before.buffer_id) << "reported after the unmap";
  EXPECT_EQ(classify(mid).type, MemType::kHost) << "an unmapped hole in a reservation";
  EXPECT_EQ(classify(v.va).type, MemType::kCuda);
  EXPECT_EQ(classify(v.va + 2 * v.chunk).type, MemType::kCuda);
  ASSERT_EQ(release_(v.handles[1]), CUDA_SUCCESS);
  v.handles[1] = 0;
  mapChunk(v, 1, vmmProp());
  ASSERT_FALSE(HasFatalFailure());
  expectReuseClassifiedAfresh(mid, before.buffer_id, MemType::kCuda);
  vmmDestroy(v);
}

// cuMemRelease of a handle that is still mapped: reported at the release (conservative), and again
// at the unmap that really frees it.
TEST_F(DriverFree, CuMemReleaseOfAMappedHandleIsSeen) {
  Vmm v;
  vmmCreate(v, 2);
  if (IsSkipped() || HasFatalFailure()) return vmmDestroy(v);
  const std::uintptr_t second = v.va + v.chunk;
  const Info before = classify(second);
  ASSERT_EQ(before.type, MemType::kCuda);
  ASSERT_EQ(release_(v.handles[1]), CUDA_SUCCESS);
  EXPECT_EQ(rec_.count(second, v.chunk), 1u) << "release of a still-mapped handle";
  EXPECT_EQ(rec_.count(v.va, v.chunk), 0u) << "the other handle's mapping was reported";
  ASSERT_EQ(unmap_(second, v.chunk), CUDA_SUCCESS);
  v.handles[1] = 0;
  EXPECT_EQ(rec_.count(second, v.chunk), 2u) << "the unmap that frees it";
  mapChunk(v, 1, vmmProp());
  ASSERT_FALSE(HasFatalFailure());
  expectReuseClassifiedAfresh(second, before.buffer_id, MemType::kCuda);
  vmmDestroy(v);
}

// --- dma-buf export ---------------------------------------------------------------------------

class Dmabuf : public DriverFixture {
 protected:
  // Exports [p, p + size) as dma-buf (PCIe mapping first, as memtype's GPUDirect path does); -1
  // when the driver refuses both.
  int exportRange(std::uintptr_t p, std::size_t size) {
    const detail::DriverApi* api = detail::driver();
    int fd = -1;
    if (api->memGetHandleForAddressRange(&fd, p, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                         CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) == 0) {
      return fd;
    }
    fd = -1;
    return api->memGetHandleForAddressRange(&fd, p, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ==
                   0
               ? fd
               : -1;
  }
  void SetUp() override {
    DriverFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) == 0 ||
        detail::driver()->memGetHandleForAddressRange == nullptr) {
      GTEST_SKIP() << "this GPU/driver does not export dma-buf";
    }
  }
  // The fd names a dma-buf (the fake: a memfd), and is gone once closed.
  static void expectDmabufThenClose(int fd) {
    ASSERT_GE(fd, 0);
    char link[128] = {};
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    ASSERT_GT(readlink(path.c_str(), link, sizeof(link) - 1), 0);
    EXPECT_NE(std::string(link).find(fakeDriver() ? "memfd:" : "dmabuf"), std::string::npos)
        << link;
    EXPECT_EQ(close(fd), 0);
    errno = 0;
    EXPECT_EQ(fcntl(fd, F_GETFD), -1);
    EXPECT_EQ(errno, EBADF);
  }
};

TEST_F(Dmabuf, CuMemAllocRangeExportsAnFdThatIsClosedAfterUse) {
  const std::uintptr_t p = alloc(4 * kMiB);
  ASSERT_NE(p, 0u);
  const int fd = exportRange(p, 2 * kMiB);
  EXPECT_GE(fd, 0) << "cuMemGetHandleForAddressRange refused a cuMemAlloc range";
  if (fd >= 0) expectDmabufThenClose(fd);
  EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
}

TEST_F(Dmabuf, VmmRangeExportsAnFdThatIsClosedAfterUse) {
  if (attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) == 0) {
    GTEST_SKIP() << "device 0 cannot create GPUDirect RDMA-capable VMM allocations";
  }
  Vmm v;
  vmmCreate(v, 1);
  if (IsSkipped() || HasFatalFailure()) return vmmDestroy(v);
  const int fd = exportRange(v.va, v.chunk);
  EXPECT_GE(fd, 0) << "cuMemGetHandleForAddressRange refused a VMM mapping";
  if (fd >= 0) expectDmabufThenClose(fd);
  vmmDestroy(v);
}

}  // namespace
}  // namespace gmd::memtype::cudacheck
