// The GPUDirect backend where CUDA is absent: no driver library, a driver without devices, or a
// build with GMD_WITH_CUDA=OFF (built three times, as gtest/memtype/nodriver_test.cc). It does not
// advertise CUDA, refuses device requests as unsupported and logs nothing above debug level.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gtest/common/log_capture.h"
#include "md/gpudirect.h"

namespace gmd::md {
namespace {

TEST(GpuDirectNoCudaTest, GpuDirectDoesNotAdvertiseCudaAndRefusesDeviceRequests) {
  test::LogCapture log;
  GpuDirectBackend b(nullptr, {}, nullptr);  // no verbs call is reached
  EXPECT_FALSE(b.cudaSupported());
  EXPECT_EQ(b.method(0), GpuDirectMethod::kUnsupported);
  std::vector<char> buf(4096);
  rcache::Registration r;
  EXPECT_EQ(b.reg(reinterpret_cast<std::uintptr_t>(buf.data()), buf.size(),
                  rcache::kAccessLocalWrite, MemType::kCuda, &r),
            rcache::Status::kUnsupported);
  EXPECT_EQ(r.handle, nullptr);
  EXPECT_EQ(log.loud(), 0);
}

}  // namespace
}  // namespace gmd::md
