// memtype/ against the fake CUDA driver: classification, caching, every free path, validation mode,
// concurrency. Runs with the fake's folder first on LD_LIBRARY_PATH (label unit).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/memtype/fake_driver.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

extern "C" {
// From the fake dynamic runtime (gtest/memtype/fake_cuda/fake_cudart.cc), bound through our PLT.
int cudaMalloc(void** ptr, std::size_t size);
int cudaFree(void* ptr);
int cudaFreeAsync(void* ptr, void* stream);
int gmd_fake_cudart_driver_free(std::uint64_t ptr);
}

namespace gmd::memtype {
namespace {

constexpr std::size_t kMiB = 1 << 20;

class MemtypeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // gmd first, then the test's own lookups: dlsym then answers with the hooks, as it does for a
    // program whose runtime initialises after gmd (the other order is static_cudart_test's).
    Classifier::instance().setFreeMode(FreeMode::kHooks);
    ASSERT_TRUE(Classifier::instance().cudaAvailable());
    ASSERT_TRUE(drv_.load()) << "the fake libcuda.so.1 must be first on LD_LIBRARY_PATH";
    ASSERT_TRUE(rec_.subscribed());
  }
  void TearDown() override {
    Classifier::instance().setFreeMode(FreeMode::kHooks);
    EXPECT_EQ(test::LogCapture::loud(), 0) << "memtype logged above debug level";
  }
  Info classify(std::uint64_t p, std::size_t len = 1) {
    return Classifier::instance().classify(reinterpret_cast<const void*>(p), len);
  }
  // After a free has been reported: the range is gone from the cache (a new driver query answers).
  void expectForgotten(std::uint64_t p) {
    const long before = drv_.get("pointer_queries");
    EXPECT_EQ(classify(p).type, MemType::kHost);
    EXPECT_EQ(drv_.get("pointer_queries"), before + 1);
  }
  test::LogCapture log_;
  test::FakeDriver drv_;
  test::FreeRecorder rec_;
};

TEST_F(MemtypeTest, DriverLoadedAndHooksInstalled) {
  auto& c = Classifier::instance();
  EXPECT_EQ(c.deviceCount(), 1);
  EXPECT_TRUE(c.hooksInstalled());
  EXPECT_GT(c.stats().hook_slots, 0u);
  ASSERT_NE(detail::driver(), nullptr);
  EXPECT_TRUE(detail::driver()->is_fake);
}

TEST_F(MemtypeTest, ClassifiesDeviceAllocationWithBaseSizeDeviceAndBufferId) {
  const std::uint64_t p = drv_.alloc(3 * kMiB);
  ASSERT_NE(p, 0u);
  const Info info = classify(p + 12345, 100);
  EXPECT_EQ(info.type, MemType::kCuda);
  EXPECT_EQ(info.base, p);
  EXPECT_EQ(info.size, 3 * kMiB);
  EXPECT_EQ(info.device, 0);
  EXPECT_NE(info.buffer_id, 0u);
  ASSERT_EQ(drv_.memFree(p), 0);
}

TEST_F(MemtypeTest, KnownRangeIsAnsweredFromTheCache) {
  const std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_NE(p, 0u);
  const long q0 = drv_.get("pointer_queries");
  const auto hits0 = Classifier::instance().stats().cache_hits;
  EXPECT_EQ(classify(p).type, MemType::kCuda);
  EXPECT_EQ(drv_.get("pointer_queries"), q0 + 1);
  for (std::size_t off = 0; off < kMiB; off += 4096) EXPECT_EQ(classify(p + off).base, p);
  EXPECT_EQ(drv_.get("pointer_queries"), q0 + 1) << "a cached range must not reach the driver";
  // Hits on the per-thread memo are added to the shared counter in batches of 64.
  EXPECT_GE(Classifier::instance().stats().cache_hits, hits0 + kMiB / 4096 - 64);
  ASSERT_EQ(drv_.memFree(p), 0);
}

TEST_F(MemtypeTest, HostMemoryIsHostAndNotCached) {
  std::vector<char> buf(4096);
  const long q0 = drv_.get("pointer_queries");
  const Info a = Classifier::instance().classify(buf.data(), buf.size());
  const Info b = Classifier::instance().classify(buf.data(), buf.size());
  EXPECT_EQ(a.type, MemType::kHost);
  EXPECT_EQ(b.type, MemType::kHost);
  EXPECT_EQ(a.device, -1);
  EXPECT_EQ(drv_.get("pointer_queries"), q0 + 2);
}

TEST_F(MemtypeTest, ManagedMemoryIsReportedAsManaged) {
  std::uint64_t p = 0;
  ASSERT_EQ(drv_.memAllocManaged(&p, kMiB, 1), 0);
  const Info info = classify(p + 10);
  EXPECT_EQ(info.type, MemType::kCudaManaged);
  EXPECT_EQ(info.base, p);
  ASSERT_EQ(drv_.memFree(p), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);
}

// --- free paths -------------------------------------------------------------------------------------

TEST_F(MemtypeTest, CuMemFreeFromDlsymIsSeen) {
  // dlsym after installation: the driver's symbol table answers with the hook.
  const std::uint64_t p = drv_.alloc(2 * kMiB);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  ASSERT_EQ(drv_.memFree(p), 0);
  EXPECT_EQ(rec_.count(p, 2 * kMiB), 1u);
  expectForgotten(p);
}

TEST_F(MemtypeTest, CuMemFreeThroughALibrarysGotIsSeen) {
  // The fake runtime was bound to cuMemFree_v2 at program start, before the hooks existed.
  const std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  ASSERT_EQ(gmd_fake_cudart_driver_free(p), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);
  expectForgotten(p);
}

TEST_F(MemtypeTest, UncachedAllocationFreeIsStillReportedWithItsExtent) {
  const std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_EQ(drv_.memFree(p), 0);  // never classified: extent comes from cuMemGetAddressRange
  EXPECT_EQ(rec_.count(p, kMiB), 1u);
}

TEST_F(MemtypeTest, CudaFreeFromDynamicRuntimeIsSeenOnce) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kMiB), 0);
  const auto addr = reinterpret_cast<std::uint64_t>(p);
  ASSERT_EQ(classify(addr).type, MemType::kCuda);
  ASSERT_EQ(cudaFree(p), 0);
  EXPECT_EQ(rec_.count(addr, kMiB), 1u) << "cudaFree and the cuMemFree inside it are one free";
  expectForgotten(addr);
}

TEST_F(MemtypeTest, CudaFreeAsyncIsSeen) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kMiB), 0);
  const auto addr = reinterpret_cast<std::uint64_t>(p);
  ASSERT_EQ(classify(addr).type, MemType::kCuda);
  ASSERT_EQ(cudaFreeAsync(p, nullptr), 0);
  EXPECT_EQ(rec_.count(addr, kMiB), 1u);
  expectForgotten(addr);
}

TEST_F(MemtypeTest, CuMemFreeAsyncIsSeenIncludingPerThreadStreamVariant) {
  std::uint64_t p = 0;
  ASSERT_EQ(drv_.memAllocAsync(&p, kMiB, nullptr), 0);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  ASSERT_EQ(drv_.memFreeAsync(p, nullptr), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);

  void* fn = nullptr;
  int status = -1;
  ASSERT_EQ(drv_.getProcAddress("cuMemFreeAsync", &fn, 12000, 2 /* PER_THREAD */, &status), 0);
  auto free_ptsz = reinterpret_cast<int (*)(std::uint64_t, void*)>(fn);
  ASSERT_EQ(drv_.memAllocAsync(&p, kMiB, nullptr), 0);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  ASSERT_EQ(free_ptsz(p, nullptr), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 2u);
  expectForgotten(p);
}

TEST_F(MemtypeTest, FreesThroughCuGetProcAddressAreSeenForEveryAbiVersion) {
  void* fn = nullptr;
  int status = -1;
  ASSERT_EQ(drv_.getProcAddress("cuMemFree", &fn, 12000, 0, &status), 0);
  auto free_v2 = reinterpret_cast<int (*)(std::uint64_t)>(fn);
  std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  ASSERT_EQ(free_v2(p), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);

  // The 32-bit cuMemFree of CUDA < 3.2, as an old binary asking for version 3010 gets it.
  ASSERT_EQ(drv_.getProcAddress("cuMemFree", &fn, 3010, 0, &status), 0);
  auto free_v1 = reinterpret_cast<int (*)(unsigned)>(fn);
  unsigned p32 = 0;
  ASSERT_EQ(drv_.memAllocV1(&p32, 3 * kMiB), 0) << "the fake's arena must lie below 4 GiB";
  ASSERT_EQ(classify(p32).type, MemType::kCuda);
  ASSERT_EQ(free_v1(p32), 0);
  EXPECT_EQ(rec_.count(p32, 3 * kMiB), 1u);
  expectForgotten(p32);
}

TEST_F(MemtypeTest, CuGetProcAddressObtainedThroughItselfStillHooks) {
  void* fn = nullptr;
  int status = -1;
  ASSERT_EQ(drv_.getProcAddress("cuGetProcAddress", &fn, 12000, 0, &status), 0);
  auto gpa = reinterpret_cast<int (*)(const char*, void**, int, std::uint64_t, int*)>(fn);
  ASSERT_EQ(gpa("cuMemFree", &fn, 12080, 0, &status), 0);
  const std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  ASSERT_EQ(reinterpret_cast<int (*)(std::uint64_t)>(fn)(p), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);
}

TEST_F(MemtypeTest, VmmUnmapIsSeen) {
  const std::size_t size = 4 * kMiB;
  std::uint64_t va = 0, handle = 0;
  ASSERT_EQ(drv_.addressReserve(&va, size, 0, 0, 0), 0);
  ASSERT_EQ(drv_.memCreate(&handle, size, nullptr, 0), 0);
  ASSERT_EQ(drv_.memMap(va, size, 0, handle, 0), 0);
  const Info info = classify(va + kMiB);
  EXPECT_EQ(info.type, MemType::kCuda);
  EXPECT_EQ(info.base, va);
  EXPECT_EQ(info.size, size);
  ASSERT_EQ(drv_.memUnmap(va, size), 0);
  EXPECT_EQ(rec_.count(va, size), 1u);
  expectForgotten(va);
  ASSERT_EQ(drv_.memRelease(handle), 0);
  EXPECT_EQ(rec_.count(va, size), 1u) << "an unmapped handle's release reports nothing more";
  ASSERT_EQ(drv_.addressFree(va, size), 0);
}

TEST_F(MemtypeTest, VmmReleaseOfAStillMappedHandleIsReported) {
  const std::size_t size = 2 * kMiB;
  std::uint64_t va = 0, handle = 0;
  ASSERT_EQ(drv_.addressReserve(&va, size, 0, 0, 0), 0);
  ASSERT_EQ(drv_.memCreate(&handle, size, nullptr, 0), 0);
  ASSERT_EQ(drv_.memMap(va, size, 0, handle, 0), 0);
  ASSERT_EQ(classify(va).type, MemType::kCuda);
  ASSERT_EQ(drv_.memRelease(handle), 0);
  EXPECT_EQ(rec_.count(va, size), 1u);
  ASSERT_EQ(drv_.memUnmap(va, size), 0);
  EXPECT_EQ(rec_.count(va, size), 2u);
  ASSERT_EQ(drv_.addressFree(va, size), 0);
}

TEST_F(MemtypeTest, LibraryLoadedAfterInstallationIsHooked) {
  void* lib = dlopen("libgmd_fake_late.so", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto late_free = reinterpret_cast<int (*)(std::uint64_t)>(dlsym(lib, "gmd_fake_late_free"));
  ASSERT_NE(late_free, nullptr);
  const std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  ASSERT_EQ(late_free(p), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);
  dlclose(lib);
}

TEST_F(MemtypeTest, InvalidFreeReportsNothingAndPassesTheDriverError) {
  const std::size_t before = rec_.size();
  EXPECT_NE(drv_.memFree(0x10), 0);
  EXPECT_EQ(drv_.memFree(0), 1);  // CUDA_ERROR_INVALID_VALUE from the driver
  EXPECT_EQ(rec_.size(), before);
}

TEST_F(MemtypeTest, NotifyFreeFromAnExternalSourceForgetsTheRange) {
  const std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_EQ(classify(p).type, MemType::kCuda);
  Classifier::instance().notifyFree(p, kMiB);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);
  const long q0 = drv_.get("pointer_queries");
  EXPECT_EQ(classify(p).type, MemType::kCuda);  // still allocated: asked again, cached again
  EXPECT_EQ(drv_.get("pointer_queries"), q0 + 1);
  ASSERT_EQ(drv_.memFree(p), 0);
}

TEST_F(MemtypeTest, UnsubscribedCallbackIsNotCalled) {
  test::FreeRecorder* other = new test::FreeRecorder();
  ASSERT_TRUE(other->subscribed());
  delete other;  // unsubscribes
  const std::uint64_t p = drv_.alloc(kMiB);
  ASSERT_EQ(drv_.memFree(p), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 1u);
}

// --- validation mode --------------------------------------------------------------------------------

// Frees behind the hooks' back (through the driver's own entry point) and re-allocates the same
// address, as a program whose free path could not be hooked would.
TEST_F(MemtypeTest, ValidateModeCatchesAFreeTheHooksMissed) {
  Classifier::instance().setFreeMode(FreeMode::kValidate);
  const std::uint64_t p = drv_.alloc(kMiB);
  const Info first = classify(p);
  ASSERT_EQ(first.type, MemType::kCuda);
  ASSERT_EQ(detail::driver()->memFree(p), 0);
  EXPECT_EQ(rec_.count(p, kMiB), 0u) << "the driver's own entry point is not hooked";
  const std::uint64_t q = drv_.alloc(kMiB);
  ASSERT_EQ(q, p) << "the fake re-uses the lowest free address";
  const auto stale0 = Classifier::instance().stats().stale_hits;
  const Info second = classify(q);
  EXPECT_EQ(second.type, MemType::kCuda);
  EXPECT_NE(second.buffer_id, first.buffer_id);
  EXPECT_EQ(Classifier::instance().stats().stale_hits, stale0 + 1);
  EXPECT_EQ(rec_.count(p, kMiB), 1u) << "the stale range is reported to subscribers";
  ASSERT_EQ(drv_.memFree(q), 0);
}

TEST_F(MemtypeTest, HooksModeTrustsTheCacheWhichIsWhyValidateExists) {
  const std::uint64_t p = drv_.alloc(kMiB);
  const Info first = classify(p);
  ASSERT_EQ(detail::driver()->memFree(p), 0);
  const std::uint64_t q = drv_.alloc(kMiB);
  ASSERT_EQ(q, p);
  EXPECT_EQ(classify(q).buffer_id, first.buffer_id) << "hooks mode answers from the cache";
  Classifier::instance().notifyFree(q, kMiB);
  ASSERT_EQ(drv_.memFree(q), 0);
}

// The name table is the one md/'s UCX_GMD_CUDA_FREE_MODE parser uses (gtest/md/config_test.cc
// checks the parse); each mode's value indexes its name.
TEST_F(MemtypeTest, FreeModeNamesAreIndexedByTheModes) {
  EXPECT_STREQ(kFreeModeNames[static_cast<unsigned>(FreeMode::kHooks)], "hooks");
  EXPECT_STREQ(kFreeModeNames[static_cast<unsigned>(FreeMode::kValidate)], "validate");
  EXPECT_STREQ(kFreeModeNames[static_cast<unsigned>(FreeMode::kOff)], "off");
  EXPECT_STREQ(kFreeModeNames[static_cast<unsigned>(FreeMode::kHooksAndValidate)], "both");
  EXPECT_EQ(kFreeModeNames[4], nullptr);
  for (FreeMode m : {FreeMode::kHooks, FreeMode::kValidate, FreeMode::kOff,
                     FreeMode::kHooksAndValidate}) {
    EXPECT_STREQ(freeModeName(m), kFreeModeNames[static_cast<unsigned>(m)]);
  }
}

// --- concurrency ------------------------------------------------------------------------------------

// Each thread allocates, classifies, frees and classifies again; after its free returns, no thread
// may see the freed buffer ID at that address any more.
TEST_F(MemtypeTest, ConcurrentClassifyAndFreeNeverAnswerAFreedBuffer) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const std::size_t size = (1 + (i + t) % 4) * 64 * 1024;
        const std::uint64_t p = drv_.alloc(size);
        if (p == 0) {
          ++errors;
          return;
        }
        const Info a = classify(p + size / 2);
        if (a.type != MemType::kCuda || a.base != p || a.size != size) ++errors;
        for (int k = 0; k < 8; ++k) {
          if (classify(p + k).buffer_id != a.buffer_id) ++errors;
        }
        if (drv_.memFree(p) != 0) ++errors;
        const Info b = classify(p);
        if (b.type == MemType::kCuda && b.buffer_id == a.buffer_id) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(drv_.get("live_allocations"), 0);
}

}  // namespace
}  // namespace gmd::memtype
