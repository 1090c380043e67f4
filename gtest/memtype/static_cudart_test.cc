// A program shaped like one linked with the static CUDA runtime: it does not link libcuda, it
// dlopen()s libcuda.so.1, looks up cuGetProcAddress once and reaches every driver entry point through
// it. Each test is its own process under ctest, so the order "runtime initialised before/after gmd's
// hooks" is under the test's control.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <tuple>

#include "gtest/memtype/fake_driver.h"
#include "memtype/memtype.h"

namespace gmd::memtype {
namespace {

constexpr std::size_t kMiB = 1 << 20;

// What a static cudart keeps after its initialisation: function pointers into the driver.
struct StaticRuntime {
  int (*getProc)(const char*, void**, int, std::uint64_t, int*) = nullptr;
  int (*memAlloc)(std::uint64_t*, std::size_t) = nullptr;
  int (*memFree)(std::uint64_t) = nullptr;
  int (*memAllocAsync)(std::uint64_t*, std::size_t, void*) = nullptr;
  int (*memFreeAsync)(std::uint64_t, void*) = nullptr;

  bool init() {
    const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
    void* h = dlopen(path != nullptr && path[0] != '\0' ? path : "libcuda.so.1",
                     RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return false;
    getProc = reinterpret_cast<decltype(getProc)>(dlsym(h, "cuGetProcAddress_v2"));
    auto init_fn = reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit"));
    if (getProc == nullptr || init_fn == nullptr || init_fn(0) != 0) return false;
    return get("cuMemAlloc", memAlloc, 0) && get("cuMemFree", memFree, 0) &&
           get("cuMemAllocAsync", memAllocAsync, 2) && get("cuMemFreeAsync", memFreeAsync, 2);
  }
  template <typename F>
  bool get(const char* name, F& f, std::uint64_t flags) {
    void* fn = nullptr;
    int status = -1;
    if (getProc(name, &fn, 12080, flags, &status) != 0 || status != 0) return false;
    f = reinterpret_cast<F>(fn);
    return true;
  }
};

bool isFake() {
  const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
  void* h = dlopen(path != nullptr && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW);
  return h != nullptr && dlsym(h, "gmd_fake_cuda_driver") != nullptr;
}

TEST(StaticCudartTest, RuntimeInitialisedAfterTheHooksHasItsFreesSeen) {
  ASSERT_TRUE(isFake()) << "the fake libcuda.so.1 must be first on LD_LIBRARY_PATH";
  test::LogCapture log;
  auto& c = Classifier::instance();
  ASSERT_TRUE(c.cudaAvailable());
  ASSERT_TRUE(c.hooksInstalled());
  test::FreeRecorder rec;
  StaticRuntime rt;
  ASSERT_TRUE(rt.init());

  std::uint64_t p = 0;
  ASSERT_EQ(rt.memAlloc(&p, 2 * kMiB), 0);
  ASSERT_EQ(c.classify(reinterpret_cast<void*>(p), 1).type, MemType::kCuda);
  ASSERT_EQ(rt.memFree(p), 0);
  EXPECT_EQ(rec.count(p, 2 * kMiB), 1u);

  ASSERT_EQ(rt.memAllocAsync(&p, kMiB, nullptr), 0);
  ASSERT_EQ(c.classify(reinterpret_cast<void*>(p), 1).type, MemType::kCuda);
  ASSERT_EQ(rt.memFreeAsync(p, nullptr), 0);
  EXPECT_EQ(rec.count(p, kMiB), 1u);
  EXPECT_EQ(c.classify(reinterpret_cast<void*>(p), 1).type, MemType::kHost);
  EXPECT_EQ(log.loud(), 0);
}

// Allocations a static runtime makes through the pointers cuGetProcAddress handed it after the hooks
// were installed: one event each, with the exact range and type.
TEST(StaticCudartTest, RuntimeInitialisedAfterTheHooksHasItsAllocationsSeen) {
  ASSERT_TRUE(isFake()) << "the fake libcuda.so.1 must be first on LD_LIBRARY_PATH";
  auto& c = Classifier::instance();
  ASSERT_TRUE(c.cudaAvailable());
  test::AllocRecorder rec;
  ASSERT_TRUE(rec.subscribed());
  StaticRuntime rt;
  ASSERT_TRUE(rt.init());
  int (*managed)(std::uint64_t*, std::size_t, unsigned) = nullptr;
  ASSERT_TRUE(rt.get("cuMemAllocManaged", managed, 0));

  std::uint64_t p = 0, q = 0, m = 0;
  ASSERT_EQ(rt.memAlloc(&p, 2 * kMiB + 1), 0);
  ASSERT_EQ(rt.memAllocAsync(&q, kMiB, nullptr), 0);
  ASSERT_EQ(managed(&m, 3 * kMiB, 1), 0);
  EXPECT_EQ(rec.size(), 3u);
  for (auto [ptr, len, type] : {std::make_tuple(p, 2 * kMiB + 1, MemType::kCuda),
                                std::make_tuple(q, kMiB, MemType::kCuda),
                                std::make_tuple(m, 3 * kMiB, MemType::kCudaManaged)}) {
    EXPECT_EQ(rec.count(ptr), 1u);
    const test::AllocRecorder::Event e = rec.first(ptr);
    EXPECT_EQ(e.event.length, len);
    EXPECT_EQ(e.event.type, type);
    EXPECT_EQ(e.event.device, 0);
    EXPECT_TRUE(e.live);
  }
  ASSERT_EQ(rt.memFree(p), 0);
  ASSERT_EQ(rt.memFreeAsync(q, nullptr), 0);
  ASSERT_EQ(rt.memFree(m), 0);
  EXPECT_EQ(rec.size(), 3u);
}

// The documented limit: pointers a runtime obtained before gmd was loaded bypass the hooks. The
// buffer-ID check (FreeMode::kHooksAndValidate or kValidate) catches the re-use instead.
TEST(StaticCudartTest, RuntimeInitialisedBeforeTheHooksIsCaughtByValidation) {
  ASSERT_TRUE(isFake()) << "the fake libcuda.so.1 must be first on LD_LIBRARY_PATH";
  StaticRuntime rt;
  ASSERT_TRUE(rt.init());  // before gmd touches the driver

  auto& c = Classifier::instance();
  c.setFreeMode(FreeMode::kHooksAndValidate);
  ASSERT_TRUE(c.cudaAvailable());
  test::FreeRecorder rec;
  std::uint64_t p = 0;
  ASSERT_EQ(rt.memAlloc(&p, kMiB), 0);
  const Info first = c.classify(reinterpret_cast<void*>(p), 1);
  ASSERT_EQ(first.type, MemType::kCuda);
  ASSERT_EQ(rt.memFree(p), 0);
  EXPECT_EQ(rec.count(p, kMiB), 0u) << "this free went through a pointer taken before the hooks";

  std::uint64_t q = 0;
  ASSERT_EQ(rt.memAlloc(&q, kMiB), 0);
  ASSERT_EQ(q, p);
  const Info second = c.classify(reinterpret_cast<void*>(q), 1);
  EXPECT_NE(second.buffer_id, first.buffer_id);
  EXPECT_EQ(rec.count(p, kMiB), 1u) << "validation reports the stale range";
  ASSERT_EQ(rt.memFree(q), 0);
}

}  // namespace
}  // namespace gmd::memtype
