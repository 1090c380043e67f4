// Buffer-ID validation against the CUDA driver (label cuda): a free through a function pointer
// taken before gmd loaded bypasses the hooks (the documented limit); FreeMode::kHooksAndValidate
// catches it when the address is classified again, and tells the subscribers. Each case needs its
// own process (ctest and run-on-gpu run each case alone): the pointers must predate gmd.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>

#include "gtest/cuda/cuda_fixture.h"

namespace gmd::memtype::cudacheck {
namespace {

bool g_gmd_touched = false;

// What a runtime initialised before gmd keeps: driver pointers from cuGetProcAddress.
struct EarlyPointers {
  CUresult (*memAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*memFree)(CUdeviceptr) = nullptr;

  // Empty on success, else why not.
  std::string take() {
    const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
    void* h = dlopen(path != nullptr && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW);
    if (h == nullptr) return "no CUDA driver on this machine";
    auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(h, "cuInit"));
    getProc_ = reinterpret_cast<decltype(getProc_)>(dlsym(h, "cuGetProcAddress_v2"));
    if (init == nullptr || getProc_ == nullptr) return "the driver has no cuGetProcAddress_v2";
    if (init(0) != CUDA_SUCCESS) return "cuInit failed: no GPU on this machine";
    CUresult (*retain)(CUcontext*, CUdevice) = nullptr;
    CUresult (*set_current)(CUcontext) = nullptr;
    if (!get("cuMemAlloc", memAlloc) || !get("cuMemFree", memFree) ||
        !get("cuDevicePrimaryCtxRetain", retain) || !get("cuCtxSetCurrent", set_current)) {
      return "cuGetProcAddress lacks an entry point";
    }
    CUcontext ctx = nullptr;
    if (retain(&ctx, 0) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS) {
      return "no context on device 0";
    }
    return {};
  }

 private:
  template <typename F>
  bool get(const char* name, F& f) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (getProc_(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) {
      return false;
    }
    f = reinterpret_cast<F>(fn);
    return true;
  }
  CUresult (*getProc_)(const char*, void**, int, cuuint64_t,
                       CUdriverProcAddressQueryResult*) = nullptr;
};

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_gmd_touched) {
      GTEST_SKIP() << "needs its own process (ctest and run-on-gpu run each case alone)";
    }
    g_gmd_touched = true;
    const std::string early = rt_.take();  // before gmd looks at the driver
    const std::string why = whyNotRunnable();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(early.empty()) << early;
  }
  // Allocates, classifies (cached), frees through the early pointer and gets the same address back.
  // Returns the first classification; *again is the address re-allocated (0 when it did not come
  // back).
  Info freeBehindTheHooks(LiveFreeRecorder& rec, std::uintptr_t* again) {
    CUdeviceptr p = 0;
    EXPECT_EQ(rt_.memAlloc(&p, 2 * kMiB), CUDA_SUCCESS);
    const Info first = classify(p);
    EXPECT_EQ(first.type, MemType::kCuda);
    EXPECT_EQ(classify(p).buffer_id, first.buffer_id);  // a cache hit
    EXPECT_EQ(rt_.memFree(p), CUDA_SUCCESS);
    EXPECT_EQ(rec.count(p), 0u) << "this free went through a pointer taken before the hooks";
    *again = allocateAt(
        p,
        [&]() -> std::uintptr_t {
          CUdeviceptr x = 0;
          return rt_.memAlloc(&x, 2 * kMiB) == CUDA_SUCCESS ? x : 0;
        },
        [&](std::uintptr_t x) { rt_.memFree(x); });
    return first;
  }
  EarlyPointers rt_;
};

TEST_F(Validation, BothModeCatchesAFreeThroughAPointerTakenBeforeGmd) {
  auto& c = Classifier::instance();
  c.setFreeMode(FreeMode::kHooksAndValidate);
  ASSERT_TRUE(c.hooksInstalled());
  LiveFreeRecorder rec;
  const std::uint64_t stale_before = c.stats().stale_hits;
  std::uintptr_t q = 0;
  const Info first = freeBehindTheHooks(rec, &q);
  ASSERT_NE(q, 0u) << "the driver did not hand the freed address back";
  const Info second = classify(q);
  EXPECT_EQ(second.type, MemType::kCuda);
  EXPECT_NE(second.buffer_id, first.buffer_id) << "the stale range was answered";
  expectMatchesDriver(second, q);
  EXPECT_EQ(c.stats().stale_hits, stale_before + 1);
  EXPECT_EQ(rec.count(first.base, first.size), 1u) << "validation reports the stale range";
  EXPECT_EQ(rt_.memFree(q), CUDA_SUCCESS);
  c.setFreeMode(FreeMode::kHooks);
}

TEST_F(Validation, ValidateModeCatchesItToo) {
  auto& c = Classifier::instance();
  c.setFreeMode(FreeMode::kValidate);
  LiveFreeRecorder rec;
  std::uintptr_t q = 0;
  const Info first = freeBehindTheHooks(rec, &q);
  ASSERT_NE(q, 0u) << "the driver did not hand the freed address back";
  const Info second = classify(q);
  EXPECT_NE(second.buffer_id, first.buffer_id) << "the stale range was answered";
  expectMatchesDriver(second, q);
  EXPECT_EQ(rec.count(first.base, first.size), 1u);
  EXPECT_EQ(rt_.memFree(q), CUDA_SUCCESS);
}

// Why validation exists: with hooks alone the cache still answers the freed allocation.
TEST_F(Validation, HooksAloneAnswerTheFreedAllocation) {
  auto& c = Classifier::instance();
  ASSERT_EQ(c.freeMode(), FreeMode::kHooks);
  LiveFreeRecorder rec;
  std::uintptr_t q = 0;
  const Info first = freeBehindTheHooks(rec, &q);
  ASSERT_NE(q, 0u) << "the driver did not hand the freed address back";
  EXPECT_EQ(classify(q).buffer_id, first.buffer_id) << "expected the documented limit";
  EXPECT_NE(truth(q).buffer_id, first.buffer_id);
  EXPECT_EQ(rt_.memFree(q), CUDA_SUCCESS);
}

}  // namespace
}  // namespace gmd::memtype::cudacheck
