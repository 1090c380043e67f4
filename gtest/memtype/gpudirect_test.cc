// The GPUDirect backend's choice of method and its fallbacks. Verbs and sysfs are faked through the
// GpuDirectOps seam; the dma-buf export is the real code path against the fake CUDA driver (which
// hands out a memfd), so the fd handling is checked for real.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "gtest/memtype/fake_driver.h"
#include "memtype/gpudirect.h"

namespace gmd::memtype {
namespace {

constexpr std::size_t kMiB = 1 << 20;
constexpr unsigned kRw = rcache::kAccessLocalWrite | rcache::kAccessRemoteRead |
                         rcache::kAccessRemoteWrite;

// Verbs and sysfs as the test wants them; the driver export is inherited (real, on the fake).
class FakeOps : public SystemGpuDirectOps {
 public:
  struct DmabufCall {
    std::uint64_t offset;
    std::size_t length;
    std::uint64_t iova;
    int fd;
    bool fd_open;
    int access;
  };
  struct MrCall {
    std::uintptr_t addr;
    std::size_t length;
    int access;
  };

  ibv_mr* regMr(ibv_pd*, void* addr, std::size_t length, int access) noexcept override {
    mr_calls.push_back({reinterpret_cast<std::uintptr_t>(addr), length, access});
    if (mr_errno != 0) {
      errno = mr_errno;
      return nullptr;
    }
    return newMr();
  }
  ibv_mr* regDmabufMr(ibv_pd*, std::uint64_t offset, std::size_t length, std::uint64_t iova,
                      int fd, int access) noexcept override {
    dmabuf_calls.push_back({offset, length, iova, fd, fcntl(fd, F_GETFD) != -1, access});
    if (dmabuf_errno != 0) {
      errno = dmabuf_errno;
      return nullptr;
    }
    return newMr();
  }
  int deregMr(ibv_mr* mr) noexcept override {
    const bool known = live.erase(mr) == 1;
    delete mr;
    return known ? 0 : EINVAL;
  }
  bool pathExists(const char* path) noexcept override {
    ++path_checks;
    return paths.count(path) != 0;
  }
  bool verbsHasDmabuf() noexcept override { return verbs_dmabuf; }
  bool deviceHasDmabuf(int device) noexcept override {
    return device != no_dmabuf_device && SystemGpuDirectOps::deviceHasDmabuf(device);
  }
  void closeFd(int fd) noexcept override {
    closed.push_back(fd);
    SystemGpuDirectOps::closeFd(fd);
  }

  ibv_mr* newMr() {
    auto* mr = new ibv_mr{};
    mr->lkey = next_key;
    mr->rkey = next_key + 1;
    next_key += 2;
    live.insert(mr);
    return mr;
  }

  std::vector<DmabufCall> dmabuf_calls;
  std::vector<MrCall> mr_calls;
  std::vector<int> closed;
  std::set<ibv_mr*> live;
  std::set<std::string> paths;
  int mr_errno = 0;
  int dmabuf_errno = 0;
  bool verbs_dmabuf = true;
  int no_dmabuf_device = -1;
  int path_checks = 0;
  std::uint32_t next_key = 100;
};

class GpuDirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Classifier::instance().cudaAvailable()) << "the fake libcuda.so.1 is needed";
    ASSERT_TRUE(drv_.load());
    drv_.set("dmabuf_supported", 1);
    drv_.set("dmabuf_pcie", 1);
    drv_.set("dmabuf_fail", 0);
    drv_.set("current_device", 0);
    dev_ = drv_.alloc(4 * kMiB);
    ASSERT_NE(dev_, 0u);
  }
  void TearDown() override {
    if (dev_ != 0) {
      EXPECT_EQ(drv_.memFree(dev_), 0);
    }
    EXPECT_TRUE(ops_.live.empty()) << "registrations leaked";
    EXPECT_EQ(log_.loud(), 0);
  }
  void setPeerMem() { ops_.paths.insert("/sys/module/nvidia_peermem"); }

  test::LogCapture log_;
  test::FakeDriver drv_;
  FakeOps ops_;
  std::uint64_t dev_ = 0;
  ibv_pd* pd_ = reinterpret_cast<ibv_pd*>(0x1);  // never dereferenced by the fake verbs
};

TEST_F(GpuDirectTest, DmabufIsPreferredWithPcieFlagIovaAndFdClosed) {
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_TRUE(b.cudaSupported());
  EXPECT_EQ(b.method(0), GpuDirectMethod::kDmabuf);
  rcache::Registration reg;
  const std::uintptr_t start = dev_ + 8192;
  ASSERT_EQ(b.reg(start, 3 * 4096, kRw, MemType::kCuda, &reg), rcache::Status::kOk);
  ASSERT_EQ(ops_.dmabuf_calls.size(), 1u);
  const auto& c = ops_.dmabuf_calls[0];
  EXPECT_EQ(c.offset, 0u);
  EXPECT_EQ(c.length, 3 * 4096u);
  EXPECT_EQ(c.iova, start);
  EXPECT_TRUE(c.fd_open) << "the fd is valid while registering";
  EXPECT_EQ(c.access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(drv_.get("last_dmabuf_flags"), 1) << "PCIe mapping flag first";
  ASSERT_EQ(ops_.closed.size(), 1u);
  EXPECT_EQ(ops_.closed[0], c.fd);
  EXPECT_EQ(fcntl(c.fd, F_GETFD), -1) << "fd closed right after registering";
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_NE(reg.handle, nullptr);
  EXPECT_NE(reg.lkey, reg.rkey);
  EXPECT_EQ(b.stats().dmabuf_regs, 1u);
  b.dereg(reg);
}

TEST_F(GpuDirectTest, UnalignedRangeExportsThePageAlignedRangeWithAnOffset) {
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration reg;
  const std::uintptr_t start = dev_ + 4096 + 100;
  ASSERT_EQ(b.reg(start, 5000, kRw, MemType::kCuda, &reg), rcache::Status::kOk);
  ASSERT_EQ(ops_.dmabuf_calls.size(), 1u);
  EXPECT_EQ(ops_.dmabuf_calls[0].offset, 100u);
  EXPECT_EQ(ops_.dmabuf_calls[0].length, 5000u);
  EXPECT_EQ(ops_.dmabuf_calls[0].iova, start);
  b.dereg(reg);
}

TEST_F(GpuDirectTest, PcieFlagRejectedFallsBackToPlainExportAndIsRemembered) {
  drv_.set("dmabuf_pcie", 0);
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r1, r2;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r1), rcache::Status::kOk);
  EXPECT_EQ(drv_.get("last_dmabuf_flags"), 0);
  const long exports = drv_.get("dmabuf_exports");
  ASSERT_EQ(b.reg(dev_ + 4096, 4096, kRw, MemType::kCuda, &r2), rcache::Status::kOk);
  EXPECT_EQ(drv_.get("dmabuf_exports"), exports + 1) << "no second PCIe attempt";
  b.dereg(r1);
  b.dereg(r2);
}

TEST_F(GpuDirectTest, DmabufRegistrationFailureDemotesToPeerMemoryForGood) {
  setPeerMem();
  ops_.dmabuf_errno = EINVAL;
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r1, r2;
  ASSERT_EQ(b.reg(dev_, 8192, kRw, MemType::kCuda, &r1), rcache::Status::kOk);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kPeerMem);
  ASSERT_EQ(ops_.mr_calls.size(), 1u);
  EXPECT_EQ(ops_.mr_calls[0].addr, dev_) << "peer memory registers the device pointer itself";
  EXPECT_EQ(ops_.closed.size(), ops_.dmabuf_calls.size()) << "every exported fd is closed";
  const auto dmabuf_tries = ops_.dmabuf_calls.size();
  ASSERT_EQ(b.reg(dev_ + 8192, 8192, kRw, MemType::kCuda, &r2), rcache::Status::kOk);
  EXPECT_EQ(ops_.dmabuf_calls.size(), dmabuf_tries) << "dma-buf is not tried again";
  EXPECT_EQ(b.stats().dmabuf_demotions, 1u);
  EXPECT_EQ(b.stats().peermem_regs, 2u);
  EXPECT_EQ(log_.loud(), 1) << "the demotion is logged once, at info level";
  test::LogCapture::reset();
  b.dereg(r1);
  b.dereg(r2);
}

TEST_F(GpuDirectTest, ResourceShortageIsReportedWithoutDemotion) {
  setPeerMem();
  ops_.dmabuf_errno = ENOMEM;
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  EXPECT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kNoResource);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kDmabuf);
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_EQ(ops_.closed.size(), ops_.dmabuf_calls.size());
}

TEST_F(GpuDirectTest, DeviceWithoutDmabufUsesPeerMemory) {
  drv_.set("dmabuf_supported", 0);
  setPeerMem();
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kPeerMem);
  EXPECT_TRUE(b.cudaSupported());
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
  b.dereg(r);
}

TEST_F(GpuDirectTest, LibibverbsWithoutDmabufUsesPeerMemoryViaTheOtherSysfsPath) {
  ops_.verbs_dmabuf = false;
  ops_.paths.insert("/sys/kernel/mm/memory_peers/nv_mem");
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kPeerMem);
}

TEST_F(GpuDirectTest, NoMethodMeansUnsupportedAndCudaNotAdvertised) {
  drv_.set("dmabuf_supported", 0);
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_FALSE(b.cudaSupported());
  EXPECT_EQ(b.method(0), GpuDirectMethod::kUnsupported);
  rcache::Registration r;
  EXPECT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kUnsupported);
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
  EXPECT_EQ(r.handle, nullptr) << "output untouched on failure";
}

TEST_F(GpuDirectTest, PolicyOffNeverExports) {
  setPeerMem();
  GpuDirectBackend b(pd_, {DmabufPolicy::kOff, ManagedPolicy::kRefuse}, &ops_);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kPeerMem);
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_EQ(drv_.get("dmabuf_exports"), 0);
  b.dereg(r);
}

TEST_F(GpuDirectTest, PolicyOnNeverFallsBackToPeerMemory) {
  setPeerMem();
  ops_.dmabuf_errno = EINVAL;
  GpuDirectBackend b(pd_, {DmabufPolicy::kOn, ManagedPolicy::kRefuse}, &ops_);
  rcache::Registration r;
  EXPECT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kIoError);
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_EQ(b.method(0), GpuDirectMethod::kDmabuf);
  EXPECT_EQ(log_.loud(), 1) << "the failed registration is logged once";
  test::LogCapture::reset();  // TearDown checks for nothing further
}

TEST_F(GpuDirectTest, PolicyOnWithoutDmabufIsUnsupportedEvenWithPeerMemory) {
  setPeerMem();
  drv_.set("dmabuf_supported", 0);
  GpuDirectBackend b(pd_, {DmabufPolicy::kOn, ManagedPolicy::kRefuse}, &ops_);
  EXPECT_FALSE(b.cudaSupported());
}

TEST_F(GpuDirectTest, ProbeHappensOncePerDevice) {
  setPeerMem();
  drv_.set("dmabuf_supported", 0);
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_TRUE(b.cudaSupported());
  const int checks = ops_.path_checks;
  rcache::Registration r[3];
  for (auto& reg : r) ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &reg), rcache::Status::kOk);
  EXPECT_TRUE(b.cudaSupported());
  EXPECT_EQ(ops_.path_checks, checks);
  for (auto& reg : r) b.dereg(reg);
}

TEST_F(GpuDirectTest, MethodIsPerDevice) {
  setPeerMem();
  ops_.no_dmabuf_device = 1;
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kDmabuf);
  EXPECT_EQ(b.method(1), GpuDirectMethod::kPeerMem);
  drv_.set("current_device", 1);
  const std::uint64_t d1 = drv_.alloc(kMiB);
  rcache::Registration r;
  ASSERT_EQ(b.reg(d1, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_EQ(ops_.mr_calls.size(), 1u);
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
  b.dereg(r);
  EXPECT_EQ(drv_.memFree(d1), 0);
}

TEST_F(GpuDirectTest, ManagedMemoryIsRefusedByDefaultAndHostPagesOnRequest) {
  std::uint64_t m = 0;
  ASSERT_EQ(drv_.memAllocManaged(&m, kMiB, 1), 0);
  GpuDirectBackend refuse(pd_, {}, &ops_);
  EXPECT_FALSE(refuse.managedSupported());
  rcache::Registration r;
  EXPECT_EQ(refuse.reg(m, 4096, kRw, MemType::kCudaManaged, &r), rcache::Status::kUnsupported);
  EXPECT_TRUE(ops_.mr_calls.empty());

  GpuDirectBackend host_pages(pd_, {DmabufPolicy::kTry, ManagedPolicy::kHostPages}, &ops_);
  EXPECT_TRUE(host_pages.managedSupported());
  ASSERT_EQ(host_pages.reg(m, 4096, kRw, MemType::kCudaManaged, &r), rcache::Status::kOk);
  EXPECT_EQ(ops_.mr_calls.size(), 1u);
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
  host_pages.dereg(r);
  EXPECT_EQ(drv_.memFree(m), 0);
}

TEST_F(GpuDirectTest, HostMemoryUsesIbvRegMrWithVerbsAccessRules) {
  GpuDirectBackend b(pd_, {}, &ops_);
  std::vector<char> buf(8192);
  rcache::Registration r;
  ASSERT_EQ(b.reg(reinterpret_cast<std::uintptr_t>(buf.data()), buf.size(),
                  rcache::kAccessRemoteWrite, MemType::kHost, &r),
            rcache::Status::kOk);
  ASSERT_EQ(ops_.mr_calls.size(), 1u);
  EXPECT_EQ(ops_.mr_calls[0].access, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE)
      << "verbs requires local write with remote write";
  b.dereg(r);
  EXPECT_EQ(b.stats().host_regs, 1u);
}

TEST_F(GpuDirectTest, BadInputIsRejectedWithoutCallingVerbs) {
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  EXPECT_EQ(b.reg(dev_, 0, kRw, MemType::kCuda, &r), rcache::Status::kInvalidParam);
  EXPECT_EQ(b.reg(~std::uintptr_t{0} - 10, 100, kRw, MemType::kHost, &r),
            rcache::Status::kInvalidParam);
  EXPECT_EQ(b.reg(dev_, 4096, 1u << 20, MemType::kCuda, &r), rcache::Status::kInvalidParam);
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
}

TEST_F(GpuDirectTest, HostPointerClaimedAsCudaIsUnsupported) {
  GpuDirectBackend b(pd_, {}, &ops_);
  std::vector<char> buf(4096);
  rcache::Registration r;
  EXPECT_EQ(b.reg(reinterpret_cast<std::uintptr_t>(buf.data()), buf.size(), kRw, MemType::kCuda,
                  &r),
            rcache::Status::kUnsupported);
}

TEST_F(GpuDirectTest, PolicyNamesRoundTrip) {
  for (DmabufPolicy p : {DmabufPolicy::kTry, DmabufPolicy::kOn, DmabufPolicy::kOff}) {
    DmabufPolicy parsed = DmabufPolicy::kOff;
    ASSERT_TRUE(parseDmabufPolicy(dmabufPolicyName(p), &parsed));
    EXPECT_EQ(parsed, p);
  }
  DmabufPolicy untouched = DmabufPolicy::kOn;
  EXPECT_FALSE(parseDmabufPolicy("maybe", &untouched));
  EXPECT_EQ(untouched, DmabufPolicy::kOn);
}

}  // namespace
}  // namespace gmd::memtype
