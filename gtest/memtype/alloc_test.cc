// memtype/'s allocation hooks against the fake CUDA driver (label unit): every allocation entry
// point the fake has, reached through dlsym, cuGetProcAddress and a dynamic runtime's PLT (the fake
// runtime, gtest/memtype/fake_cuda/fake_cudart.cc), reports exactly one event with the exact start,
// length, type and device, while the allocation is live, before the call returns.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/memtype/fake_driver.h"
#include "memtype/memtype.h"

extern "C" {
// From the fake dynamic runtime, bound through this binary's PLT.
int cudaMalloc(void** ptr, std::size_t size);
int cudaMallocManaged(void** ptr, std::size_t size, unsigned flags);
int cudaMallocPitch(void** ptr, std::size_t* pitch, std::size_t width, std::size_t height);
int cudaMallocAsync(void** ptr, std::size_t size, void* stream);
int cudaMallocFromPoolAsync(void** ptr, std::size_t size, void* pool, void* stream);
int cudaFree(void* ptr);
}

namespace gmd::memtype {
namespace {

constexpr std::size_t kMiB = 1 << 20;

class AllocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Classifier::instance().cudaAvailable());
    ASSERT_TRUE(drv_.load()) << "the fake libcuda.so.1 must be first on LD_LIBRARY_PATH";
    ASSERT_TRUE(rec_.subscribed());
    ASSERT_TRUE(Classifier::instance().hooksInstalled());
  }
  void TearDown() override {
    drv_.set("current_device", 0);
    drv_.set("devices", -1);
    EXPECT_EQ(test::LogCapture::loud(), 0) << "memtype logged above debug level";
  }
  // Exactly one event for start, and it is {start, length, type, device}, seen while live.
  void expectOneEvent(std::uintptr_t start, std::size_t length, MemType type, int device = 0) {
    ASSERT_NE(start, 0u);
    EXPECT_EQ(rec_.count(start), 1u) << "one event per allocation";
    const test::AllocRecorder::Event e = rec_.first(start);
    EXPECT_EQ(e.event.start, start);
    EXPECT_EQ(e.event.length, length);
    EXPECT_EQ(e.event.type, type);
    EXPECT_EQ(e.event.device, device);
    EXPECT_TRUE(e.live) << "reported after the driver had the allocation";
  }
  template <typename F>
  F proc(const char* name, int version, std::uint64_t flags = 0) {
    void* fn = nullptr;
    int status = -1;
    EXPECT_EQ(drv_.getProcAddress(name, &fn, version, flags, &status), 0) << name;
    return reinterpret_cast<F>(fn);
  }
  test::LogCapture log_;
  test::FakeDriver drv_;
  test::AllocRecorder rec_;
};

// --- the driver, through dlsym (after installation: the redirected symbol table answers)
// ------------

TEST_F(AllocTest, CuMemAllocV2) {
  std::uint64_t p = 0;
  ASSERT_EQ(drv_.memAlloc(&p, 3 * kMiB + 123), 0);
  expectOneEvent(p, 3 * kMiB + 123, MemType::kCuda);
  EXPECT_EQ(rec_.size(), 1u);
  ASSERT_EQ(drv_.memFree(p), 0);
  EXPECT_EQ(rec_.size(), 1u) << "a free is no allocation event";
}

TEST_F(AllocTest, CuMemAllocV1ThirtyTwoBit) {
  unsigned p32 = 0;
  ASSERT_EQ(drv_.memAllocV1(&p32, 5 * kMiB), 0) << "the fake's arena must lie below 4 GiB";
  expectOneEvent(p32, 5 * kMiB, MemType::kCuda);
  ASSERT_EQ(drv_.memFree(p32), 0);
}

TEST_F(AllocTest, CuMemAllocPitchIsPitchTimesHeightBothAbis) {
  auto pitch_v2 =
      reinterpret_cast<int (*)(std::uint64_t*, std::size_t*, std::size_t, std::size_t, unsigned)>(
          dlsym(drv_.handle, "cuMemAllocPitch_v2"));
  auto pitch_v1 = reinterpret_cast<int (*)(unsigned*, unsigned*, unsigned, unsigned, unsigned)>(
      dlsym(drv_.handle, "cuMemAllocPitch"));
  if (pitch_v2 == nullptr || pitch_v1 == nullptr) GTEST_SKIP() << "no cuMemAllocPitch in the fake";
  std::uint64_t p = 0;
  std::size_t pitch = 0;
  ASSERT_EQ(pitch_v2(&p, &pitch, 1000, 37, 4), 0);
  ASSERT_EQ(pitch, 1024u) << "the fake's pitch";
  expectOneEvent(p, 1024u * 37, MemType::kCuda);
  unsigned p32 = 0, pitch32 = 0;
  ASSERT_EQ(pitch_v1(&p32, &pitch32, 513, 3, 8), 0);
  ASSERT_EQ(pitch32, 1024u);
  expectOneEvent(p32, 1024u * 3, MemType::kCuda);
  // Through cuGetProcAddress, by base name, for each ABI.
  auto gpa_v2 = proc<int (*)(std::uint64_t*, std::size_t*, std::size_t, std::size_t, unsigned)>(
      "cuMemAllocPitch", 12000);
  auto gpa_v1 =
      proc<int (*)(unsigned*, unsigned*, unsigned, unsigned, unsigned)>("cuMemAllocPitch", 3010);
  ASSERT_TRUE(gpa_v2 && gpa_v1);
  std::uint64_t q = 0;
  unsigned q32 = 0;
  ASSERT_EQ(gpa_v2(&q, &pitch, 100, 10, 16), 0);
  ASSERT_EQ(gpa_v1(&q32, &pitch32, 100, 20, 16), 0);
  expectOneEvent(q, 512u * 10, MemType::kCuda);
  expectOneEvent(q32, 512u * 20, MemType::kCuda);
  EXPECT_EQ(rec_.size(), 4u);
  for (std::uint64_t a : {p, std::uint64_t{p32}, q, std::uint64_t{q32}}) {
    ASSERT_EQ(drv_.memFree(a), 0);
  }
}

TEST_F(AllocTest, CuMemAllocManagedIsManaged) {
  std::uint64_t p = 0;
  ASSERT_EQ(drv_.memAllocManaged(&p, kMiB + 1, 1), 0);
  expectOneEvent(p, kMiB + 1, MemType::kCudaManaged);
  ASSERT_EQ(drv_.memFree(p), 0);
}

TEST_F(AllocTest, CuMemAllocAsyncAndItsPerThreadStreamVariant) {
  std::uint64_t p = 0, q = 0;
  ASSERT_EQ(drv_.memAllocAsync(&p, 2 * kMiB, nullptr), 0);
  expectOneEvent(p, 2 * kMiB, MemType::kCuda);
  ASSERT_NE(drv_.memAllocAsyncPtsz, nullptr);
  ASSERT_EQ(drv_.memAllocAsyncPtsz(&q, 4096, nullptr), 0);
  expectOneEvent(q, 4096, MemType::kCuda);
  ASSERT_EQ(drv_.memFreeAsync(p, nullptr), 0);
  ASSERT_EQ(drv_.memFreeAsync(q, nullptr), 0);
}

TEST_F(AllocTest, AllocationOnTheCurrentContextsDeviceNamesThatDevice) {
  drv_.set("devices", 2);
  drv_.set("current_device", 1);
  std::uint64_t p = 0;
  ASSERT_EQ(drv_.memAlloc(&p, kMiB), 0);
  expectOneEvent(p, kMiB, MemType::kCuda, 1);
  ASSERT_EQ(drv_.memFree(p), 0);
}

TEST_F(AllocTest, VmmMapIsAnAllocationOnTheHandlesDevice) {
  drv_.set("devices", 2);
  const std::size_t size = 4 * kMiB;
  std::uint64_t va = 0, handle = 0;
  ASSERT_EQ(drv_.addressReserve(&va, 2 * size, 0, 0, 0), 0);
  EXPECT_EQ(rec_.size(), 0u) << "a reservation is no allocation";
  // CUmemAllocationProp's leading ints: type, requestedHandleTypes, location.type, location.id.
  const int prop[8] = {1, 0, 1, 1};
  ASSERT_EQ(drv_.memCreate(&handle, size, prop, 0), 0);
  EXPECT_EQ(rec_.size(), 0u) << "physical memory is no mapping yet";
  ASSERT_EQ(drv_.memMap(va + size, size, 0, handle, 0), 0);
  expectOneEvent(va + size, size, MemType::kCuda, 1);
  ASSERT_EQ(drv_.memUnmap(va + size, size), 0);
  ASSERT_EQ(drv_.memRelease(handle), 0);
  ASSERT_EQ(drv_.addressFree(va, 2 * size), 0);
  EXPECT_EQ(rec_.size(), 1u);
}

TEST_F(AllocTest, FailedAllocationReportsNothing) {
  std::uint64_t p = 0;
  EXPECT_NE(drv_.memAlloc(&p, 0), 0);
  EXPECT_NE(drv_.memAlloc(&p, std::size_t{1} << 40), 0);
  void* q = nullptr;
  EXPECT_NE(cudaMalloc(&q, 0), 0);
  EXPECT_EQ(rec_.size(), 0u);
}

// --- the driver through cuGetProcAddress (how a static cudart reaches it)
// ---------------------------

TEST_F(AllocTest, AllocationsThroughCuGetProcAddressForEveryAbiVersion) {
  auto alloc_v2 = proc<int (*)(std::uint64_t*, std::size_t)>("cuMemAlloc", 12000);
  auto alloc_v1 = proc<int (*)(unsigned*, unsigned)>("cuMemAlloc", 3010);
  auto managed = proc<int (*)(std::uint64_t*, std::size_t, unsigned)>("cuMemAllocManaged", 12000);
  auto async_ptsz =
      proc<int (*)(std::uint64_t*, std::size_t, void*)>("cuMemAllocAsync", 12000, 2 /* PTSZ */);
  ASSERT_TRUE(alloc_v2 && alloc_v1 && managed && async_ptsz);
  std::uint64_t a = 0, c = 0, d = 0;
  unsigned b = 0;
  ASSERT_EQ(alloc_v2(&a, kMiB), 0);
  ASSERT_EQ(alloc_v1(&b, 2 * kMiB), 0);
  ASSERT_EQ(managed(&c, 3 * kMiB, 1), 0);
  ASSERT_EQ(async_ptsz(&d, 64 * 1024, nullptr), 0);
  expectOneEvent(a, kMiB, MemType::kCuda);
  expectOneEvent(b, 2 * kMiB, MemType::kCuda);
  expectOneEvent(c, 3 * kMiB, MemType::kCudaManaged);
  expectOneEvent(d, 64 * 1024, MemType::kCuda);
  EXPECT_EQ(rec_.size(), 4u);
  for (std::uint64_t p : {a, std::uint64_t{b}, c, d}) ASSERT_EQ(drv_.memFree(p), 0);
}

// --- a dynamic runtime: its wrapper reports, the driver call inside it does not again
// --------------

TEST_F(AllocTest, CudaMallocIsOneEvent) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 6 * kMiB + 7), 0);
  expectOneEvent(reinterpret_cast<std::uintptr_t>(p), 6 * kMiB + 7, MemType::kCuda);
  EXPECT_EQ(rec_.size(), 1u) << "cudaMalloc and the cuMemAlloc inside it are one allocation";
  ASSERT_EQ(cudaFree(p), 0);
}

TEST_F(AllocTest, CudaMallocManagedIsOneManagedEvent) {
  void* p = nullptr;
  ASSERT_EQ(cudaMallocManaged(&p, kMiB, 1), 0);
  expectOneEvent(reinterpret_cast<std::uintptr_t>(p), kMiB, MemType::kCudaManaged);
  EXPECT_EQ(rec_.size(), 1u);
  ASSERT_EQ(cudaFree(p), 0);
}

TEST_F(AllocTest, CudaMallocPitchReportsPitchTimesHeight) {
  void* p = nullptr;
  std::size_t pitch = 0;
  ASSERT_EQ(cudaMallocPitch(&p, &pitch, 1000, 37), 0);
  ASSERT_EQ(pitch, 1024u) << "the fake driver's pitch";
  expectOneEvent(reinterpret_cast<std::uintptr_t>(p), 1024u * 37, MemType::kCuda);
  EXPECT_EQ(rec_.size(), 1u);
  ASSERT_EQ(cudaFree(p), 0);
}

TEST_F(AllocTest, CudaMallocAsyncAndFromPoolAreOneEventEach) {
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 3 * kMiB, nullptr), 0);
  ASSERT_EQ(cudaMallocFromPoolAsync(&q, kMiB, reinterpret_cast<void*>(0x1), nullptr), 0);
  expectOneEvent(reinterpret_cast<std::uintptr_t>(p), 3 * kMiB, MemType::kCuda);
  expectOneEvent(reinterpret_cast<std::uintptr_t>(q), kMiB, MemType::kCuda);
  EXPECT_EQ(rec_.size(), 2u);
  ASSERT_EQ(cudaFree(p), 0);
  ASSERT_EQ(cudaFree(q), 0);
}

// --- subscriptions
// ----------------------------------------------------------------------------------

TEST_F(AllocTest, EverySubscriberSeesEachAllocationAndUnsubscribeStopsIt) {
  auto* other = new test::AllocRecorder();
  ASSERT_TRUE(other->subscribed());
  std::uint64_t p = 0;
  ASSERT_EQ(drv_.memAlloc(&p, kMiB), 0);
  EXPECT_EQ(rec_.count(p), 1u);
  EXPECT_EQ(other->count(p), 1u);
  ASSERT_EQ(drv_.memFree(p), 0);

  other->unsubscribe();
  ASSERT_EQ(drv_.memAlloc(&p, kMiB), 0);
  EXPECT_EQ(rec_.count(p), 2u);
  EXPECT_EQ(other->count(p), 1u) << "an unsubscribed callback is not called";
  ASSERT_EQ(drv_.memFree(p), 0);
  delete other;

  rec_.unsubscribe();
  ASSERT_EQ(drv_.memAlloc(&p, kMiB), 0);
  EXPECT_EQ(rec_.count(p), 2u);
  ASSERT_EQ(drv_.memFree(p), 0);
}

// Allocations on several threads at once: each one event, on its own thread, none lost.
TEST_F(AllocTest, ConcurrentAllocationsAreEachOneEvent) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 100;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        void* p = nullptr;
        const std::size_t size = 4096 * (1 + (i + t) % 8);
        if ((i & 1 ? cudaMalloc(&p, size) : cudaMallocManaged(&p, size, 1)) != 0) {
          ++errors;
          continue;
        }
        if (cudaFree(p) != 0) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(rec_.size(), static_cast<std::size_t>(kThreads * kRounds));
}

TEST_F(AllocTest, NullCallbackIsRefused) {
  EXPECT_FALSE(Classifier::instance().subscribeAllocations(nullptr, nullptr));
}

// The allocation hooks do not cost a classify() its cache: the next classify of the range asks the
// driver once, as before, and then hits.
TEST_F(AllocTest, AllocatedRangeClassifiesAsBefore) {
  std::uint64_t p = 0;
  ASSERT_EQ(drv_.memAlloc(&p, kMiB), 0);
  const Info info = Classifier::instance().classify(reinterpret_cast<void*>(p + 10), 1);
  EXPECT_EQ(info.type, MemType::kCuda);
  EXPECT_EQ(info.base, p);
  EXPECT_EQ(info.size, kMiB);
  ASSERT_EQ(drv_.memFree(p), 0);
}

}  // namespace
}  // namespace gmd::memtype
