// Shared by the CUDA runtime tests: the dynamic one (runtime_test.cc, linked with libcudart.so) and
// the static one (static_runtime_test.cc, linked with libcudart_static.a). The same calls bind to
// whichever runtime the binary links.
//
// The runtime cannot run on the fake driver (it asks for the driver's private export tables), so
// with the fake these tests skip with that reason.
//
// Thread safety: used from the test's thread only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gtest/cuda/cuda_fixture.h"

namespace gmd::memtype::cudacheck {

inline constexpr const char* kNoRuntimeOnFake =
    "the CUDA runtime needs the real driver (it asks for the driver's private export tables); the "
    "fake stands in for libcuda.so.1 only";

class RuntimeFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = whyNotRunnable();
    if (!why.empty()) GTEST_SKIP() << why;
    if (fakeDriver()) GTEST_SKIP() << kNoRuntimeOnFake;
    ASSERT_TRUE(Classifier::instance().hooksInstalled());
    ASSERT_TRUE(rec_.subscribed());
    // The runtime initialises here, after gmd's hooks.
    const cudaError_t e = cudaSetDevice(0);
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  }
  static std::uintptr_t deviceAlloc(std::size_t size) {
    void* p = nullptr;
    return cudaMalloc(&p, size) == cudaSuccess ? reinterpret_cast<std::uintptr_t>(p) : 0;
  }
  static std::uintptr_t asyncAlloc(std::size_t size) {
    void* p = nullptr;
    return cudaMallocAsync(&p, size, nullptr) == cudaSuccess ? reinterpret_cast<std::uintptr_t>(p)
                                                             : 0;
  }
  static bool deviceFree(std::uintptr_t p) {
    return cudaFree(reinterpret_cast<void*>(p)) == cudaSuccess;
  }
  static bool asyncFree(std::uintptr_t p) {
    return cudaFreeAsync(reinterpret_cast<void*>(p), nullptr) == cudaSuccess;
  }
  static void sync() { EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess); }
  static int attribute(cudaDeviceAttr a) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, a, 0) == cudaSuccess ? v : 0;
  }
  // cudaFree, then cudaMalloc at the same address.
  void checkCudaFree() {
    checkFreeSeenBeforeReuse(
        rec_, MemType::kCuda, [] { return deviceAlloc(4 * kMiB); }, deviceFree, [] {});
  }
  // cudaFreeAsync + stream synchronisation, then cudaMallocAsync at the same address.
  void checkCudaFreeAsync() {
    if (attribute(cudaDevAttrMemoryPoolsSupported) == 0) {
      GTEST_SKIP() << "no memory pools on device 0";
    }
    checkFreeSeenBeforeReuse(
        rec_, MemType::kCuda, [] { return asyncAlloc(4 * kMiB); }, asyncFree, sync);
  }
  // cudaMallocManaged classified managed; its cudaFree seen before the address is reused.
  void checkManaged() {
    if (attribute(cudaDevAttrManagedMemory) == 0) GTEST_SKIP() << "no managed memory on device 0";
    checkFreeSeenBeforeReuse(
        rec_, MemType::kCudaManaged,
        []() -> std::uintptr_t {
          void* p = nullptr;
          return cudaMallocManaged(&p, 2 * kMiB, cudaMemAttachGlobal) == cudaSuccess
                     ? reinterpret_cast<std::uintptr_t>(p)
                     : 0;
        },
        deviceFree, [] {});
  }

  // Every runtime allocation entry point reports one event (the driver call inside the runtime is
  // not reported again): exact start, length (pitch * height for cudaMallocPitch), type, device.
  void checkAllocationEvents() {
    AllocEventRecorder rec;
    ASSERT_TRUE(rec.subscribed());
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, 3 * kMiB + 1), cudaSuccess);
    expectAllocEvent(rec, reinterpret_cast<std::uintptr_t>(p), 3 * kMiB + 1, MemType::kCuda, 0);
    EXPECT_EQ(cudaFree(p), cudaSuccess);

    std::size_t pitch = 0;
    ASSERT_EQ(cudaMallocPitch(&p, &pitch, 1000, 33), cudaSuccess);
    EXPECT_GE(pitch, 1000u);
    expectAllocEvent(rec, reinterpret_cast<std::uintptr_t>(p), pitch * 33, MemType::kCuda, 0);
    EXPECT_EQ(cudaFree(p), cudaSuccess);

    if (attribute(cudaDevAttrManagedMemory) != 0) {
      ASSERT_EQ(cudaMallocManaged(&p, 2 * kMiB, cudaMemAttachGlobal), cudaSuccess);
      expectAllocEvent(rec, reinterpret_cast<std::uintptr_t>(p), 2 * kMiB, MemType::kCudaManaged,
                       0);
      EXPECT_EQ(cudaFree(p), cudaSuccess);
    }
    if (attribute(cudaDevAttrMemoryPoolsSupported) != 0) {
      ASSERT_EQ(cudaMallocAsync(&p, 4 * kMiB, nullptr), cudaSuccess);
      sync();
      expectAllocEvent(rec, reinterpret_cast<std::uintptr_t>(p), 4 * kMiB, MemType::kCuda, 0);
      EXPECT_TRUE(asyncFree(reinterpret_cast<std::uintptr_t>(p)));
      sync();

      cudaMemPool_t pool = nullptr;
      cudaMemPoolProps props = {};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = 0;
      ASSERT_EQ(cudaMemPoolCreate(&pool, &props), cudaSuccess);
      ASSERT_EQ(cudaMallocFromPoolAsync(&p, kMiB + 3, pool, nullptr), cudaSuccess);
      sync();
      expectAllocEvent(rec, reinterpret_cast<std::uintptr_t>(p), kMiB + 3, MemType::kCuda, 0);
      EXPECT_TRUE(asyncFree(reinterpret_cast<std::uintptr_t>(p)));
      sync();
      EXPECT_EQ(cudaMemPoolDestroy(pool), cudaSuccess);
    }
  }

  LiveFreeRecorder rec_;
};

}  // namespace gmd::memtype::cudacheck
