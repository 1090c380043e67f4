// A program linked with the static CUDA runtime (libcudart_static.a): cudaFree reaches the driver
// only through pointers from cuGetProcAddress. gmd must still see the free (label cuda; skipped
// without a GPU, and when the fake test driver is what got loaded).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "gtest/memtype/fake_driver.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace gmd::memtype {
namespace {

TEST(StaticRuntimeTest, CudaFreeFromTheStaticRuntimeIsSeen) {
  auto& c = Classifier::instance();
  if (!c.cudaAvailable()) GTEST_SKIP() << "no CUDA driver or no GPU on this machine";
  if (detail::driver()->is_fake) GTEST_SKIP() << "the fake test driver was loaded";
  ASSERT_TRUE(c.hooksInstalled());
  test::FreeRecorder rec;
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4 << 20), cudaSuccess);  // the runtime initialises here, after gmd
  const Info info = c.classify(p, 1);
  ASSERT_EQ(info.type, MemType::kCuda);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(rec.count(info.base, info.size), 1u);
  EXPECT_EQ(c.classify(p, 1).type, MemType::kHost);
}

}  // namespace
}  // namespace gmd::memtype
