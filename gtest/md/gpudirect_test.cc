// The GPUDirect backend's choice of method and its fallbacks (the NIC's dma-buf probe, the GPU's
// attribute, peer memory, the policy), SYNC_MEMOPS before every device registration, the host path
// it shares with VerbsBackend (one ibv_reg_mr path, one access translation), and what the MD makes
// of it (reg_mem_types, mem_query's flags). Verbs and sysfs are faked through the GpuDirectOps
// seam; the dma-buf export is the real code path against the fake CUDA driver (which hands out a
// memfd), so the fd handling is checked for real.
#include "md/gpudirect.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "gtest/memtype/fake_driver.h"
#include "md/md.h"
#include "md/verbs_backend.h"
#include "memtype/copier.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace gmd::md {
namespace {

constexpr std::size_t kMiB = 1 << 20;
constexpr unsigned kRw =
    rcache::kAccessLocalWrite | rcache::kAccessRemoteRead | rcache::kAccessRemoteWrite;

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
    events.push_back("reg_mr");
    if (mr_errno != 0) {
      errno = mr_errno;
      return nullptr;
    }
    return newMr();
  }
  ibv_mr* regDmabufMr(ibv_pd*, std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd,
                      int access) noexcept override {
    if (fd == -1) {  // the NIC's probe: the driver answers before it looks at the fd, or EBADF
      nic_probes.push_back({offset, length, iova, fd, false, access});
      if (nic_errno != 0) {
        errno = nic_errno;
        return nullptr;
      }
      return newMr();
    }
    dmabuf_calls.push_back({offset, length, iova, fd, fcntl(fd, F_GETFD) != -1, access});
    events.push_back("reg_dmabuf_mr");
    if (fd == refuse_fd) {
      errno = EINVAL;
      return nullptr;
    }
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
  // Recorded, then the real call (into the fake driver) unless the test dictates the answer.
  int setSyncMemops(std::uintptr_t ptr) noexcept override {
    sync_memops.push_back(ptr);
    events.push_back("sync_memops");
    return sync_result != kReal ? sync_result : SystemGpuDirectOps::setSyncMemops(ptr);
  }

  ibv_mr* newMr() {
    auto* mr = new ibv_mr{};
    mr->lkey = next_key;
    mr->rkey = next_key + 1;
    next_key += 2;
    live.insert(mr);
    return mr;
  }

  static constexpr int kReal = -2;
  std::vector<DmabufCall> dmabuf_calls;
  std::vector<DmabufCall> nic_probes;
  std::vector<std::uintptr_t> sync_memops;
  std::vector<std::string> events;  // registrations and SYNC_MEMOPS requests, in order
  std::vector<MrCall> mr_calls;
  std::vector<int> closed;
  std::set<ibv_mr*> live;
  std::set<std::string> paths;
  int mr_errno = 0;
  int dmabuf_errno = 0;
  int refuse_fd = -2;  // a dma-buf the NIC refuses (EINVAL)
  int nic_errno = EBADF;  // the answer to the probe: EBADF is a NIC that imports dma-bufs
  int sync_result = kReal;
  bool verbs_dmabuf = true;
  int no_dmabuf_device = -1;
  int path_checks = 0;
  std::uint32_t next_key = 100;
};

class GpuDirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(memtype::Classifier::instance().cudaAvailable())
        << "the fake libcuda.so.1 is needed";
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
  memtype::test::FakeDriver drv_;
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

// A dma-buf of `size` bytes, as UCX's cuda_copy would export for an allocation (a memfd, as the
// fake driver's exports are).
int callerDmabuf(std::size_t size) {
  const int fd = memfd_create("gmd-test-caller-dmabuf", MFD_CLOEXEC);
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// UCP passes the dma-buf cuda_copy exported (mem_reg's dmabuf_fd, UCT_MD_FLAG_REG_DMABUF): it is
// registered at the range's offset in it, no export of gmd's own, and it stays open (UCP closes it).
TEST_F(GpuDirectTest, CallersDmabufIsRegisteredAtTheRangesOffsetAndLeftOpen) {
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_TRUE(b.takesDmabuf());
  const int fd = callerDmabuf(4 * kMiB);  // the whole allocation, dev_ at its byte 0
  ASSERT_GE(fd, 0);
  const long exports = drv_.get("dmabuf_exports");
  const std::uintptr_t start = dev_ + 8192 + 100;
  rcache::Registration reg;
  {
    const DmabufOffer offer(fd, start, 8192 + 100);  // start is at byte 8292 of the dma-buf
    EXPECT_EQ(DmabufOffer::current(), &offer);
    ASSERT_EQ(b.reg(start, 5000, kRw, MemType::kCuda, &reg), rcache::Status::kOk);
  }
  EXPECT_EQ(DmabufOffer::current(), nullptr) << "the offer ends with its scope";
  ASSERT_EQ(ops_.dmabuf_calls.size(), 1u);
  EXPECT_EQ(ops_.dmabuf_calls[0].fd, fd);
  EXPECT_EQ(ops_.dmabuf_calls[0].offset, 8192u + 100);
  EXPECT_EQ(ops_.dmabuf_calls[0].length, 5000u);
  EXPECT_EQ(ops_.dmabuf_calls[0].iova, start);
  EXPECT_EQ(drv_.get("dmabuf_exports"), exports) << "gmd exported a dma-buf of its own";
  EXPECT_TRUE(ops_.closed.empty()) << "gmd closed a descriptor";
  EXPECT_NE(fcntl(fd, F_GETFD), -1) << "the caller's dma-buf was closed";
  EXPECT_EQ(b.stats().dmabuf_regs, 1u);
  EXPECT_EQ(b.stats().dmabuf_offered, 1u);
  b.dereg(reg);
  close(fd);
}

// A dma-buf that does not cover the range (or that the NIC refuses) leaves gmd to export its own.
TEST_F(GpuDirectTest, CallersDmabufNotCoveringTheRangeFallsBackToAnExport) {
  GpuDirectBackend b(pd_, {}, &ops_);
  const int fd = callerDmabuf(8192);  // the allocation's first two pages only
  ASSERT_GE(fd, 0);
  const long exports = drv_.get("dmabuf_exports");
  rcache::Registration reg;
  {
    const DmabufOffer offer(fd, dev_, 0);
    ASSERT_EQ(b.reg(dev_ + 4096, 3 * 4096, kRw, MemType::kCuda, &reg), rcache::Status::kOk);
  }
  ASSERT_EQ(ops_.dmabuf_calls.size(), 1u);
  EXPECT_NE(ops_.dmabuf_calls[0].fd, fd);
  EXPECT_EQ(drv_.get("dmabuf_exports"), exports + 1);
  EXPECT_EQ(ops_.closed.size(), 1u) << "gmd's own export is closed after registering";
  EXPECT_NE(fcntl(fd, F_GETFD), -1) << "the caller's dma-buf was closed";
  EXPECT_EQ(b.stats().dmabuf_offered, 0u);
  b.dereg(reg);
  // Covering the range but refused by the NIC: the same.
  const int whole = callerDmabuf(4 * kMiB);
  ASSERT_GE(whole, 0);
  ops_.refuse_fd = whole;
  ops_.dmabuf_calls.clear();
  ops_.closed.clear();
  {
    const DmabufOffer offer(whole, dev_, 0);
    ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &reg), rcache::Status::kOk);
  }
  ASSERT_EQ(ops_.dmabuf_calls.size(), 2u);
  EXPECT_EQ(ops_.dmabuf_calls[0].fd, whole) << "the caller's dma-buf is tried first";
  EXPECT_NE(ops_.dmabuf_calls[1].fd, whole);
  EXPECT_EQ(drv_.get("dmabuf_exports"), exports + 2);
  EXPECT_EQ(ops_.closed, std::vector<int>{ops_.dmabuf_calls[1].fd});
  EXPECT_EQ(b.stats().dmabuf_offered, 0u);
  b.dereg(reg);
  close(whole);
  close(fd);
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
  const long exports = drv_.get("dmabuf_exports");  // the fake counts over the whole process
  GpuDirectBackend b(pd_, {DmabufPolicy::kOff}, &ops_);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kPeerMem);
  EXPECT_FALSE(b.takesDmabuf()) << "no GPU registers by dma-buf: UCT_MD_FLAG_REG_DMABUF advertised";
  EXPECT_TRUE(ops_.nic_probes.empty()) << "the NIC was asked though no GPU could use the answer";
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_EQ(drv_.get("dmabuf_exports"), exports);
  b.dereg(r);
}

TEST_F(GpuDirectTest, PolicyOnNeverFallsBackToPeerMemory) {
  setPeerMem();
  ops_.dmabuf_errno = EINVAL;
  GpuDirectBackend b(pd_, {DmabufPolicy::kOn}, &ops_);
  rcache::Registration r;
  const Result res = b.reg(dev_, 4096, kRw, MemType::kCuda, &r);
  EXPECT_EQ(res.status, rcache::Status::kIoError);
  EXPECT_EQ(res.error, EINVAL) << "the errno travels in the result";
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_EQ(b.method(0), GpuDirectMethod::kDmabuf);
  // Logged once, by the registrar (which knows UCT_MD_MEM_FLAG_HIDE_ERRORS), not by the backend.
  EXPECT_EQ(log_.loud(), 0);
}

TEST_F(GpuDirectTest, PolicyOnWithoutDmabufIsUnsupportedEvenWithPeerMemory) {
  setPeerMem();
  drv_.set("dmabuf_supported", 0);
  GpuDirectBackend b(pd_, {DmabufPolicy::kOn}, &ops_);
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

// Managed memory is not GPUDirect's: refused here whatever the MD's policy (under
// UCX_GMD_CUDA_MANAGED=host-pages the registrar sends it to VerbsBackend: registrar_test.cc).
TEST_F(GpuDirectTest, ManagedMemoryIsRefused) {
  std::uint64_t m = 0;
  ASSERT_EQ(drv_.memAllocManaged(&m, kMiB, 1), 0);
  GpuDirectBackend refuse(pd_, {}, &ops_);
  rcache::Registration r;
  EXPECT_EQ(refuse.reg(m, 4096, kRw, MemType::kCudaManaged, &r), rcache::Status::kUnsupported);
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
  EXPECT_EQ(drv_.memFree(m), 0);
}

TEST_F(GpuDirectTest, HostMemoryUsesIbvRegMrWithVerbsAccessRules) {
  VerbsBackend b(pd_, &ops_);  // host pages: the MD's one ibv_reg_mr path
  std::vector<char> buf(8192);
  rcache::Registration r;
  ASSERT_EQ(b.reg(reinterpret_cast<std::uintptr_t>(buf.data()), buf.size(),
                  rcache::kAccessRemoteWrite, MemType::kHost, &r),
            rcache::Status::kOk);
  ASSERT_EQ(ops_.mr_calls.size(), 1u);
  EXPECT_EQ(ops_.mr_calls[0].access, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE)
      << "verbs requires local write with remote write";
  b.dereg(r);
  EXPECT_EQ(b.registrations(), 1u);
  EXPECT_TRUE(ops_.live.empty());
}

TEST_F(GpuDirectTest, BadInputIsRejectedWithoutCallingVerbs) {
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  EXPECT_EQ(b.reg(dev_, 0, kRw, MemType::kCuda, &r), rcache::Status::kInvalidParam);
  EXPECT_EQ(b.reg(~std::uintptr_t{0} - 10, 100, kRw, MemType::kCuda, &r),
            rcache::Status::kInvalidParam);
  VerbsBackend host(pd_, &ops_);
  EXPECT_EQ(host.reg(~std::uintptr_t{0} - 10, 100, kRw, MemType::kHost, &r),
            rcache::Status::kInvalidParam);
  EXPECT_EQ(host.reg(0x10000, 0, kRw, MemType::kHost, &r), rcache::Status::kInvalidParam);
  EXPECT_EQ(host.reg(0x10000, 4096, 1u << 20, MemType::kHost, &r), rcache::Status::kInvalidParam);
  EXPECT_EQ(b.reg(dev_, 4096, 1u << 20, MemType::kCuda, &r), rcache::Status::kInvalidParam);
  EXPECT_TRUE(ops_.mr_calls.empty());
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
}

TEST_F(GpuDirectTest, HostPointerClaimedAsCudaIsUnsupported) {
  GpuDirectBackend b(pd_, {}, &ops_);
  std::vector<char> buf(4096);
  rcache::Registration r;
  EXPECT_EQ(
      b.reg(reinterpret_cast<std::uintptr_t>(buf.data()), buf.size(), kRw, MemType::kCuda, &r),
      rcache::Status::kUnsupported);
}

// UCX's parser stores the index of the name (gtest/md/config_test.cc parses them): the policies'
// values index the table.
TEST_F(GpuDirectTest, PolicyNamesAreIndexedByThePolicies) {
  EXPECT_STREQ(kDmabufPolicyNames[static_cast<unsigned>(DmabufPolicy::kTry)], "try");
  EXPECT_STREQ(kDmabufPolicyNames[static_cast<unsigned>(DmabufPolicy::kOn)], "on");
  EXPECT_STREQ(kDmabufPolicyNames[static_cast<unsigned>(DmabufPolicy::kOff)], "off");
  EXPECT_EQ(kDmabufPolicyNames[3], nullptr);
}

// The registrar's classification hands the device on: a registration with a known device asks the
// classifier nothing (one classification per miss, not two).
TEST_F(GpuDirectTest, AKnownDeviceIsNotClassifiedAgain) {
  GpuDirectBackend b(pd_, {}, &ops_);
  ASSERT_EQ(b.method(0), GpuDirectMethod::kDmabuf);
  auto& classifier = memtype::Classifier::instance();
  classifier.flushCache();  // so that a classification of dev_ is a driver query
  const std::uint64_t queries = classifier.stats().driver_queries;
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemoryKind(MemType::kCuda, 0), &r), rcache::Status::kOk);
  EXPECT_EQ(classifier.stats().driver_queries, queries);
  b.dereg(r);
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_EQ(classifier.stats().driver_queries, queries + 1)
      << "without a device the backend classifies";
  b.dereg(r);
}

// --- The NIC's dma-buf probe ------------------------------------------------------------------

// One page at offset 0, iova 0, fd -1, every access (what UCX's IB MD asks), once per backend.
TEST_F(GpuDirectTest, NicProbeRegistersOnePageWithABadFdOnce) {
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_TRUE(b.nicImportsDmabuf());
  EXPECT_EQ(b.method(0), GpuDirectMethod::kDmabuf);
  EXPECT_TRUE(b.cudaSupported());
  ASSERT_EQ(ops_.nic_probes.size(), 1u) << "one probe per NIC, whatever the number of GPUs";
  const auto& p = ops_.nic_probes[0];
  EXPECT_EQ(p.offset, 0u);
  EXPECT_EQ(p.length, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(p.iova, 0u);
  EXPECT_EQ(p.access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_TRUE(ops_.dmabuf_calls.empty()) << "the probe exports nothing";
}

// A provider that registers even with fd -1 certainly imports: the MR is released at once.
TEST_F(GpuDirectTest, NicProbeThatRegistersCountsAsImportAndIsReleased) {
  ops_.nic_errno = 0;
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_TRUE(b.nicImportsDmabuf());
  EXPECT_TRUE(ops_.live.empty()) << "the probe's MR is deregistered";
}

// rxe (rdma-core's provider has no reg_dmabuf_mr: libibverbs answers EOPNOTSUPP) with a GPU that
// exports dma-bufs and no peer memory: nothing registers CUDA memory, so the MD must not claim it.
// Before the NIC probe, gmd chose dma-buf here and failed every registration.
TEST_F(GpuDirectTest, NicWithoutDmabufImportAndNoPeerMemoryMeansNoCuda) {
  ops_.nic_errno = EOPNOTSUPP;
  const long exports = drv_.get("dmabuf_exports");  // the fake counts over the whole process
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_FALSE(b.nicImportsDmabuf());
  EXPECT_EQ(b.method(0), GpuDirectMethod::kUnsupported);
  EXPECT_FALSE(b.cudaSupported());
  rcache::Registration r;
  EXPECT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kUnsupported);
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
  EXPECT_EQ(drv_.get("dmabuf_exports"), exports)
      << "no dma-buf exported for a NIC that cannot import";
}

TEST_F(GpuDirectTest, NicWithoutDmabufImportUsesPeerMemoryWhenLoaded) {
  ops_.nic_errno = EOPNOTSUPP;
  setPeerMem();
  GpuDirectBackend b(pd_, {}, &ops_);
  EXPECT_EQ(b.method(0), GpuDirectMethod::kPeerMem);
  EXPECT_TRUE(b.cudaSupported());
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_TRUE(ops_.dmabuf_calls.empty());
  EXPECT_EQ(ops_.mr_calls.size(), 1u);
  b.dereg(r);
}

// Where nothing could use the answer, the NIC is not asked.
TEST_F(GpuDirectTest, NicIsNotProbedWithoutAGpuThatExportsOrUnderPolicyOff) {
  drv_.set("dmabuf_supported", 0);
  setPeerMem();
  GpuDirectBackend no_gpu(pd_, {}, &ops_);
  EXPECT_EQ(no_gpu.method(0), GpuDirectMethod::kPeerMem);
  drv_.set("dmabuf_supported", 1);
  GpuDirectBackend off(pd_, {DmabufPolicy::kOff}, &ops_);
  EXPECT_EQ(off.method(0), GpuDirectMethod::kPeerMem);
  ops_.verbs_dmabuf = false;
  GpuDirectBackend no_verb(pd_, {}, &ops_);
  EXPECT_FALSE(no_verb.nicImportsDmabuf());
  EXPECT_TRUE(ops_.nic_probes.empty());
}

// Each backend is one MD, one NIC: two backends probe their own NICs and may answer differently.
TEST_F(GpuDirectTest, TheProbeIsPerNic) {
  GpuDirectBackend mlx(pd_, {}, &ops_);
  EXPECT_EQ(mlx.method(0), GpuDirectMethod::kDmabuf);
  ops_.nic_errno = EOPNOTSUPP;
  GpuDirectBackend rxe(reinterpret_cast<ibv_pd*>(0x2), {}, &ops_);
  EXPECT_EQ(rxe.method(0), GpuDirectMethod::kUnsupported);
  EXPECT_EQ(mlx.method(0), GpuDirectMethod::kDmabuf) << "remembered per backend";
  EXPECT_EQ(ops_.nic_probes.size(), 2u);
}

// The whole decision: NIC import answer × GPU attribute × peer memory × policy.
struct ProbeCase {
  int nic;  // the probe's errno; -1: libibverbs without ibv_reg_dmabuf_mr
  bool gpu_dmabuf;
  bool peermem;
  DmabufPolicy policy;
};

std::string probeCaseName(const ProbeCase& c) {
  std::string nic = c.nic == -1           ? "NoVerb"
                    : c.nic == EBADF      ? "NicImports"
                    : c.nic == EOPNOTSUPP ? "NicEopnotsupp"
                                          : "NicEnosys";
  return nic + (c.gpu_dmabuf ? "_GpuDmabuf" : "_GpuNoDmabuf") +
         (c.peermem ? "_PeerMem" : "_NoPeerMem") + "_Policy" +
         kDmabufPolicyNames[static_cast<unsigned>(c.policy)];
}

std::string probeTestName(const ::testing::TestParamInfo<ProbeCase>& info) {
  return probeCaseName(info.param);
}

// Printed by name (the struct's padding would otherwise show in the test list).
void PrintTo(const ProbeCase& c, std::ostream* os) { *os << probeCaseName(c); }

class GpuDirectProbeTest : public GpuDirectTest, public ::testing::WithParamInterface<ProbeCase> {};

TEST_P(GpuDirectProbeTest, MethodAndCudaRegistration) {
  const ProbeCase& c = GetParam();
  ops_.verbs_dmabuf = c.nic != -1;
  if (c.nic != -1) ops_.nic_errno = c.nic;
  drv_.set("dmabuf_supported", c.gpu_dmabuf ? 1 : 0);
  if (c.peermem) setPeerMem();
  GpuDirectBackend b(pd_, {c.policy}, &ops_);

  const bool nic = c.nic == EBADF;
  const bool dmabuf = c.policy != DmabufPolicy::kOff && c.gpu_dmabuf && nic;
  const bool peer = c.policy != DmabufPolicy::kOn && c.peermem;
  const GpuDirectMethod want = dmabuf ? GpuDirectMethod::kDmabuf
                               : peer ? GpuDirectMethod::kPeerMem
                                      : GpuDirectMethod::kUnsupported;
  EXPECT_EQ(b.method(0), want) << gpuDirectMethodName(b.method(0));
  EXPECT_EQ(b.cudaSupported(), want != GpuDirectMethod::kUnsupported);

  // What the MD advertises with this backend (md.cc keeps it only when cudaSupported()).
  std::unique_ptr<rcache::Cache> cache;
  ASSERT_EQ(rcache::Cache::create(rcache::Config{}, &cache), rcache::Status::kOk);
  VerbsBackend host(pd_, &ops_);
  Registrar md("nic0", std::move(cache), &host, b.cudaSupported() ? &b : nullptr, nullptr);
  const std::uint64_t types = regMemTypes(md);
  EXPECT_TRUE(types & UCS_BIT(UCS_MEMORY_TYPE_HOST));
  EXPECT_EQ((types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0, want != GpuDirectMethod::kUnsupported);
  EXPECT_EQ(memFlags(types, UCS_MEMORY_TYPE_CUDA),
            want != GpuDirectMethod::kUnsupported ? kMemFlagRegistrable : 0);

  // A registration goes the chosen way, or nowhere.
  rcache::Registration r;
  const Result res = b.reg(dev_, 4096, kRw, MemType::kCuda, &r);
  EXPECT_EQ(res.status, want == GpuDirectMethod::kUnsupported ? rcache::Status::kUnsupported
                                                              : rcache::Status::kOk);
  EXPECT_EQ(ops_.dmabuf_calls.size(), want == GpuDirectMethod::kDmabuf ? 1u : 0u);
  EXPECT_EQ(ops_.mr_calls.size(), want == GpuDirectMethod::kPeerMem ? 1u : 0u);
  if (res.ok()) b.dereg(r);
}

std::vector<ProbeCase> allProbeCases() {
  std::vector<ProbeCase> cases;
  for (int nic : {EBADF, EOPNOTSUPP, ENOSYS, -1}) {
    for (bool gpu : {true, false}) {
      for (bool peer : {true, false}) {
        for (DmabufPolicy p : {DmabufPolicy::kTry, DmabufPolicy::kOn, DmabufPolicy::kOff}) {
          cases.push_back({nic, gpu, peer, p});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Matrix, GpuDirectProbeTest, ::testing::ValuesIn(allProbeCases()),
                         probeTestName);

// --- SYNC_MEMOPS -------------------------------------------------------------------------------

TEST_F(GpuDirectTest, SyncMemopsIsRequestedBeforeADmabufRegistration) {
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  const std::uintptr_t start = dev_ + 4096 + 8;
  ASSERT_EQ(b.reg(start, 100, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_EQ(ops_.events, (std::vector<std::string>{"sync_memops", "reg_dmabuf_mr"}));
  ASSERT_EQ(ops_.sync_memops.size(), 1u);
  EXPECT_EQ(ops_.sync_memops[0], start) << "on the registered buffer's allocation";
  b.dereg(r);
}

TEST_F(GpuDirectTest, SyncMemopsIsRequestedBeforeAPeerMemoryRegistration) {
  setPeerMem();
  GpuDirectBackend b(pd_, {DmabufPolicy::kOff}, &ops_);
  rcache::Registration r1, r2;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r1), rcache::Status::kOk);
  ASSERT_EQ(b.reg(dev_ + 8192, 4096, kRw, MemType::kCuda, &r2), rcache::Status::kOk);
  EXPECT_EQ(ops_.events,
            (std::vector<std::string>{"sync_memops", "reg_mr", "sync_memops", "reg_mr"}))
      << "every registration, not only the allocation's first";
  EXPECT_EQ(ops_.sync_memops, (std::vector<std::uintptr_t>{dev_, dev_ + 8192}));
  b.dereg(r1);
  b.dereg(r2);
}

TEST_F(GpuDirectTest, SyncMemopsPrecedesTheDemotionToPeerMemoryOnce) {
  setPeerMem();
  ops_.dmabuf_errno = EINVAL;
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  ASSERT_FALSE(ops_.events.empty());
  EXPECT_EQ(ops_.events.front(), "sync_memops");
  EXPECT_EQ(ops_.events.back(), "reg_mr");
  EXPECT_EQ(ops_.sync_memops.size(), 1u);
  test::LogCapture::reset();  // the demotion's info line
  b.dereg(r);
}

TEST_F(GpuDirectTest, NoSyncMemopsWithoutADeviceRegistration) {
  ops_.nic_errno = EOPNOTSUPP;  // no method
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  EXPECT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kUnsupported);
  std::vector<char> host(4096);
  EXPECT_EQ(
      b.reg(reinterpret_cast<std::uintptr_t>(host.data()), host.size(), kRw, MemType::kHost, &r),
      rcache::Status::kUnsupported);
  EXPECT_TRUE(ops_.sync_memops.empty());
}

// A driver error: warned once per backend, and the registration goes on (as in UCX).
TEST_F(GpuDirectTest, SyncMemopsFailureIsWarnedOnceAndTheRegistrationGoesOn) {
  ops_.sync_result = 1;  // CUDA_ERROR_INVALID_VALUE
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r1, r2;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r1), rcache::Status::kOk);
  ASSERT_EQ(b.reg(dev_ + 4096, 4096, kRw, MemType::kCuda, &r2), rcache::Status::kOk);
  EXPECT_EQ(b.stats().sync_memops_failures, 2u);
  EXPECT_EQ(b.stats().dmabuf_regs, 2u);
  EXPECT_EQ(log_.at(LogLevel::kWarn), 1) << "warned once";
  EXPECT_EQ(log_.loud(), 1);
  test::LogCapture::reset();
  b.dereg(r1);
  b.dereg(r2);
}

// A driver without cuPointerSetAttribute: a missing optional entry point, debug level only.
TEST_F(GpuDirectTest, SyncMemopsUnavailableIsDebugOnly) {
  ops_.sync_result = -1;
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  EXPECT_EQ(b.stats().sync_memops_failures, 1u);
  EXPECT_EQ(log_.loud(), 0);
  b.dereg(r);
}

// The real entry point against the fake driver, which has cuPointerSetAttribute: 0.
TEST_F(GpuDirectTest, SystemSyncMemopsReachesTheDriver) {
  const memtype::detail::DriverApi* api = memtype::detail::driver();
  ASSERT_NE(api, nullptr);
  ASSERT_NE(api->pointerSetAttribute, nullptr) << "resolved from the fake driver";
  EXPECT_EQ(memtype::setSyncMemops(reinterpret_cast<const void*>(dev_)), 0);
}

// End to end on the fake driver: a registration leaves SYNC_MEMOPS set on the allocation (read back
// with cuPointerGetAttribute), before the registration as the order test above shows.
TEST_F(GpuDirectTest, RegistrationLeavesSyncMemopsSetOnTheAllocation) {
  const memtype::detail::DriverApi* api = memtype::detail::driver();
  ASSERT_NE(api, nullptr);
  ASSERT_NE(api->pointerSetAttribute, nullptr) << "the fake driver has cuPointerSetAttribute";
  constexpr int kAttrSyncMemops = 6;  // CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
  const long sets = drv_.get("sync_memops_set");
  unsigned int value = 0;
  ASSERT_EQ(api->pointerGetAttribute(&value, kAttrSyncMemops, dev_ + 4096), 0);
  EXPECT_EQ(value, 0u) << "a fresh allocation";
  GpuDirectBackend b(pd_, {}, &ops_);
  rcache::Registration r;
  ASSERT_EQ(b.reg(dev_ + 4096, 4096, kRw, MemType::kCuda, &r), rcache::Status::kOk);
  ASSERT_EQ(api->pointerGetAttribute(&value, kAttrSyncMemops, dev_), 0);
  EXPECT_EQ(value, 1u) << "set on the whole allocation";
  EXPECT_EQ(drv_.get("sync_memops_set"), sets + 1);
  EXPECT_EQ(b.stats().sync_memops_failures, 0u);
  b.dereg(r);
}

// --- What the MD advertises --------------------------------------------------------------------

TEST_F(GpuDirectTest, MemFlagsAreRegistrableExactlyForRegisteredTypes) {
  const std::uint64_t host_only = UCS_BIT(UCS_MEMORY_TYPE_HOST);
  const std::uint64_t host_cuda = host_only | UCS_BIT(UCS_MEMORY_TYPE_CUDA);
  EXPECT_EQ(memFlags(host_only, UCS_MEMORY_TYPE_HOST), kMemFlagRegistrable);
  EXPECT_EQ(memFlags(host_only, UCS_MEMORY_TYPE_CUDA), 0);
  EXPECT_EQ(memFlags(host_cuda, UCS_MEMORY_TYPE_CUDA), kMemFlagRegistrable);
  EXPECT_EQ(memFlags(host_cuda, UCS_MEMORY_TYPE_CUDA_MANAGED), 0);
  EXPECT_EQ(memFlags(~std::uint64_t{0}, UCS_MEMORY_TYPE_UNKNOWN), 0);
  EXPECT_EQ(kMemFlagRegistrable, 1) << "UCS_MEM_FLAG_REGISTRABLE = UCS_BIT(0) (UCX 1.22)";
}

TEST_F(GpuDirectTest, RegMemTypesFollowTheBackendAndTheManagedPolicy) {
  VerbsBackend host(pd_, &ops_);
  GpuDirectBackend cuda(pd_, {}, &ops_);
  auto make = [&](rcache::Backend* c) {
    std::unique_ptr<rcache::Cache> cache;
    EXPECT_EQ(rcache::Cache::create(rcache::Config{}, &cache), rcache::Status::kOk);
    return std::make_unique<Registrar>("nic0", std::move(cache), &host, c, nullptr);
  };
  auto without = make(nullptr);
  EXPECT_EQ(regMemTypes(*without), UCS_BIT(UCS_MEMORY_TYPE_HOST));
  auto with = make(&cuda);
  EXPECT_EQ(regMemTypes(*with), UCS_BIT(UCS_MEMORY_TYPE_HOST) | UCS_BIT(UCS_MEMORY_TYPE_CUDA));
  with->setManagedPolicy(ManagedPolicy::kHostPages);
  EXPECT_EQ(regMemTypes(*with), UCS_BIT(UCS_MEMORY_TYPE_HOST) | UCS_BIT(UCS_MEMORY_TYPE_CUDA) |
                                    UCS_BIT(UCS_MEMORY_TYPE_CUDA_MANAGED));
  EXPECT_EQ(memFlags(regMemTypes(*with), UCS_MEMORY_TYPE_CUDA_MANAGED), kMemFlagRegistrable);
}

}  // namespace
}  // namespace gmd::md
