// memtype/ against the dynamic CUDA runtime (libcudart.so, linked by this binary; label cuda):
// cudaMalloc, cudaMallocManaged, cudaMallocAsync classified right; cudaHostAlloc and malloc host;
// cudaFree (through this binary's GOT and through dlsym) and cudaFreeAsync + sync seen before the
// address can be reused, checked by getting the same address back and classifying again.
//
// Skips on the fake driver (see runtime_fixture.h). Each case is meant to run in its own process
// (ctest and run-on-gpu do so): one of them needs the runtime initialised before gmd.
#include <dlfcn.h>

#include <cstdint>
#include <memory>

#include "gtest/cuda/maps_scan.h"
#include "gtest/cuda/runtime_fixture.h"

namespace gmd::memtype::cudacheck {
namespace {

bool g_gmd_touched = false;

class Runtime : public RuntimeFixture {
 protected:
  void SetUp() override {
    g_gmd_touched = true;
    RuntimeFixture::SetUp();
  }
};

TEST_F(Runtime, CudaMallocIsDeviceWithItsBaseSizeAndDevice) {
  const std::uintptr_t p = deviceAlloc(4 * kMiB);
  ASSERT_NE(p, 0u);
  expectAllocation(p + 4096, p, 4 * kMiB, 0, true);
  EXPECT_TRUE(deviceFree(p));
}

TEST_F(Runtime, CudaMallocAsyncIsDevice) {
  if (attribute(cudaDevAttrMemoryPoolsSupported) == 0)
    GTEST_SKIP() << "no memory pools on device 0";
  const std::uintptr_t p = asyncAlloc(4 * kMiB);
  ASSERT_NE(p, 0u);
  sync();
  expectAllocation(p + 4096, p, 4 * kMiB, 0, false);
  EXPECT_TRUE(asyncFree(p));
  sync();
}

TEST_F(Runtime, CudaHostAllocAndMallocAreHost) {
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 2 * kMiB, cudaHostAllocDefault), cudaSuccess);
  EXPECT_EQ(Classifier::instance().classify(pinned, 1).type, MemType::kHost);
  void* mapped = nullptr;
  ASSERT_EQ(cudaHostAlloc(&mapped, 2 * kMiB, cudaHostAllocMapped), cudaSuccess);
  EXPECT_EQ(Classifier::instance().classify(mapped, 1).type, MemType::kHost);
  std::unique_ptr<char[]> heap(new char[kMiB]);
  EXPECT_EQ(Classifier::instance().classify(heap.get(), 1).type, MemType::kHost);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(mapped), cudaSuccess);
}

class RuntimeAlloc : public Runtime {};

TEST_F(RuntimeAlloc, EveryAllocationIsOneEvent) { checkAllocationEvents(); }

class RuntimeFree : public Runtime {};

TEST_F(RuntimeFree, CudaFreeThroughThisBinarysGotIsSeenBeforeReuse) { checkCudaFree(); }

TEST_F(RuntimeFree, CudaFreeThroughDlsymIsSeenBeforeReuse) {
  auto dl_free = reinterpret_cast<cudaError_t (*)(void*)>(dlsym(RTLD_DEFAULT, "cudaFree"));
  ASSERT_NE(dl_free, nullptr);
  checkFreeSeenBeforeReuse(
      rec_, MemType::kCuda, [] { return deviceAlloc(4 * kMiB); },
      [dl_free](std::uintptr_t p) { return dl_free(reinterpret_cast<void*>(p)) == cudaSuccess; },
      [] {});
}

TEST_F(RuntimeFree, CudaFreeAsyncAndSyncIsSeenBeforeReuse) { checkCudaFreeAsync(); }

TEST_F(RuntimeFree, CudaMallocManagedIsManagedAndItsFreeSeenBeforeReuse) { checkManaged(); }

// The common order in applications: CUDA is initialised (and memory allocated) before the MPI/UCX
// library that loads gmd. cudaFree is still a bound symbol, so the hooks see it.
TEST(RuntimeFreeLate, RuntimeInitialisedBeforeGmdStillHasItsCudaFreeSeen) {
  if (g_gmd_touched)
    GTEST_SKIP() << "needs its own process (ctest and run-on-gpu run each case alone)";
  void* early = nullptr;
  const cudaError_t e = cudaMalloc(&early, 4 * kMiB);  // before gmd loads the driver
  auto& c = Classifier::instance();
  const std::string why = whyNotRunnable();
  if (!why.empty()) GTEST_SKIP() << why;
  if (fakeDriver()) GTEST_SKIP() << kNoRuntimeOnFake;
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  ASSERT_TRUE(c.hooksInstalled());
  LiveFreeRecorder rec;
  const auto p = reinterpret_cast<std::uintptr_t>(early);
  const Info before = classify(p);
  ASSERT_EQ(before.type, MemType::kCuda);
  ASSERT_EQ(cudaFree(early), cudaSuccess);
  EXPECT_EQ(rec.count(before.base, before.size), 1u);
  EXPECT_EQ(rec.liveIdAtFree(p), before.buffer_id);
  EXPECT_EQ(classify(p).type, MemType::kHost);
}

// What /proc/self/maps shows for the runtime's allocations, and whether gmd's scan rule covers
// them (maps_scan.h; the driver API's are in maps_test.cc).
using RuntimeMapsScan = RuntimeFixture;

TEST_F(RuntimeMapsScan, CudaMalloc) {
  const std::uintptr_t p = deviceAlloc(4 * kMiB);
  expectCovered("cudaMalloc", p, 4 * kMiB, false);
  EXPECT_TRUE(deviceFree(p));
}

TEST_F(RuntimeMapsScan, CudaMallocManaged) {
  if (attribute(cudaDevAttrManagedMemory) == 0) GTEST_SKIP() << "no managed memory on device 0";
  void* p = nullptr;
  ASSERT_EQ(cudaMallocManaged(&p, 2 * kMiB, cudaMemAttachGlobal), cudaSuccess);
  expectCovered("cudaMallocManaged", reinterpret_cast<std::uintptr_t>(p), 2 * kMiB, true);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(RuntimeMapsScan, CudaMallocAsync) {
  if (attribute(cudaDevAttrMemoryPoolsSupported) == 0)
    GTEST_SKIP() << "no memory pools on device 0";
  const std::uintptr_t p = asyncAlloc(4 * kMiB);
  sync();
  expectCovered("cudaMallocAsync", p, 4 * kMiB, false);
  EXPECT_TRUE(asyncFree(p));
  sync();
}

}  // namespace
}  // namespace gmd::memtype::cudacheck
