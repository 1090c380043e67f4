// The MD's registration path with fake backends and a fake classifier (no device, no UCX MD).
#include "md/registrar.h"

#include <gtest/gtest.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cstdarg>
#include <map>
#include <mutex>
#include <vector>

#include "gtest/common/fake_backend.h"

namespace gmd::md {
namespace {

const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

using gmd::test::FakeBackend;

// The fake classifier: addresses inside [g_dev_lo, g_dev_hi) are device memory, inside
// [g_managed_lo, g_managed_hi) managed.
std::uintptr_t g_dev_lo, g_dev_hi, g_managed_lo, g_managed_hi;
int g_classified = 0;
memtype::Info fakeClassify(const void* address, std::size_t) {
  ++g_classified;
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  memtype::Info info;
  if (a >= g_dev_lo && a < g_dev_hi) {
    info.type = MemType::kCuda;
    info.base = g_dev_lo;
    info.size = g_dev_hi - g_dev_lo;
    info.device = 0;
  } else if (a >= g_managed_lo && a < g_managed_hi) {
    info.type = MemType::kCudaManaged;
  }
  return info;
}

// The log-capture seam: every UCX log line (the registrar's own and gmd's logger, which md/ maps to
// UCX) is counted by level. The tests raise UCX's level to debug so that debug lines reach it too.
int g_error_logs = 0;
int g_debug_logs = 0;
ucs_log_func_rc_t countErrors(const char*, unsigned, const char*, ucs_log_level_t level,
                              const ucs_log_component_config_t*, const char*, va_list) {
  if (level <= UCS_LOG_LEVEL_ERROR) ++g_error_logs;
  if (level == UCS_LOG_LEVEL_DEBUG) ++g_debug_logs;
  return UCS_LOG_FUNC_RC_STOP;
}

class RegistrarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    buf_.resize(64 * kPage);
    base_ = (reinterpret_cast<std::uintptr_t>(buf_.data()) + kPage - 1) & ~(kPage - 1);
    // Pretend pages [32, 48) are device memory and [48, 56) managed.
    g_dev_lo = base_ + 32 * kPage;
    g_dev_hi = base_ + 48 * kPage;
    g_managed_lo = g_dev_hi;
    g_managed_hi = base_ + 56 * kPage;
    make(true);
    ucs_log_push_handler(countErrors);
    saved_level_ = ucs_global_opts.log_component.log_level;
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
    g_error_logs = 0;
    g_debug_logs = 0;
  }
  void TearDown() override {
    ucs_global_opts.log_component.log_level = saved_level_;
    ucs_log_pop_handler();
    reg_.reset();
    EXPECT_EQ(0, host_.live()) << "host registrations leaked";
    EXPECT_EQ(0, cuda_.live()) << "device registrations leaked";
  }
  void make(bool with_cuda) {
    reg_.reset();
    std::unique_ptr<rcache::Cache> cache;
    ASSERT_EQ(rcache::Status::kOk, rcache::Cache::create(rcache::Config{}, &cache));
    reg_ = std::make_unique<Registrar>("fake0", std::move(cache), &host_,
                                       with_cuda ? &cuda_ : nullptr, fakeClassify);
  }
  void* at(std::size_t page, std::size_t off = 0) {
    return reinterpret_cast<void*>(base_ + page * kPage + off);
  }
  ucs_status_t dereg(uct_mem_h memh, unsigned flags = 0, uct_completion_t* comp = nullptr) {
    ucx::DeregParams p{};
    p.field_mask = ucx::kDeregFieldMemh | ucx::kDeregFieldFlags |
                   (comp ? std::uint64_t{ucx::kDeregFieldCompletion} : std::uint64_t{0});
    p.memh = memh;
    p.flags = flags;
    p.comp = comp;
    return reg_->dereg(&p);
  }

  ucs_log_level_t saved_level_ = UCS_LOG_LEVEL_WARN;
  std::vector<char> buf_;
  std::uintptr_t base_ = 0;
  FakeBackend host_{"host"}, cuda_{"cuda"};
  std::unique_ptr<Registrar> reg_;
};

TEST_F(RegistrarTest, HostMemoryGoesToTheHostBackend) {
  uct_mem_h memh = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(1, 10), 100, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(1, host_.registered());
  EXPECT_EQ(0, cuda_.registered());
  const auto* r = static_cast<rcache::Region*>(memh);
  EXPECT_EQ(MemType::kHost, r->memType());
  EXPECT_EQ(base_ + kPage, r->start());
  EXPECT_EQ(0u, r->length() % kPage);
  EXPECT_EQ(UCS_OK, dereg(memh));
}

TEST_F(RegistrarTest, DeviceMemoryGoesToTheGpuDirectBackend) {
  uct_mem_h memh = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(33), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(0, host_.registered());
  EXPECT_EQ(1, cuda_.registered());
  EXPECT_EQ(MemType::kCuda, cuda_.firstLive()->type);
  EXPECT_EQ(UCS_OK, dereg(memh));
}

TEST_F(RegistrarTest, DeviceMemoryWithoutGpuDirectIsUnsupported) {
  make(false);
  uct_mem_h memh = nullptr;
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, reg_->reg(at(33), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(nullptr, memh);
  EXPECT_EQ(0, host_.registered() + cuda_.registered());
}

TEST_F(RegistrarTest, ManagedMemoryIsRefusedNotRegisteredAsHost) {
  uct_mem_h memh = nullptr;
  EXPECT_EQ(UCS_ERR_UNSUPPORTED,
            reg_->reg(at(50), kPage, UCT_MD_MEM_ACCESS_RMA | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh));
  EXPECT_EQ(0, host_.registered() + cuda_.registered());
}

TEST_F(RegistrarTest, AccessFlagsReachTheBackendNarrowly) {
  uct_mem_h memh = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(2), kPage, UCT_MD_MEM_ACCESS_REMOTE_GET, &memh));
  EXPECT_EQ(static_cast<unsigned>(rcache::kAccessRemoteRead), host_.firstLive()->access);
  EXPECT_EQ(UCS_OK, dereg(memh));
}

// Caller mistakes are returned with a debug line, as UCX's own MDs do: never at error level,
// HIDE_ERRORS or not. (Before, each was logged at error level: this test failed with 5 errors.)
TEST_F(RegistrarTest, BadInputIsRefusedAtDebugLevelNotAsAnError) {
  uct_mem_h memh = nullptr;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, reg_->reg(at(1), 0, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, reg_->reg(nullptr, 10, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            reg_->reg(reinterpret_cast<void*>(~std::uintptr_t{0} - 10), 100,
                      UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, reg_->reg(at(1), 10, 1u << 4 | UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, reg_->reg(at(1), 10, UCT_MD_MEM_FLAG_NONBLOCK, &memh))
      << "no access flag at all";
  EXPECT_EQ(0, g_error_logs) << "caller mistakes are not errors of the MD";
  EXPECT_EQ(5, g_debug_logs) << "one debug line each";
  g_debug_logs = 0;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            reg_->reg(at(1), 0, UCT_MD_MEM_ACCESS_RMA | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh));
  EXPECT_EQ(0, g_error_logs);
  EXPECT_EQ(1, g_debug_logs);
  EXPECT_EQ(nullptr, memh);
  EXPECT_EQ(0, host_.registered());
}

// Memory of a type this MD does not advertise is the caller's mistake too.
TEST_F(RegistrarTest, UnsupportedMemoryIsRefusedAtDebugLevel) {
  make(false);
  uct_mem_h memh = nullptr;
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, reg_->reg(at(33), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, reg_->reg(at(50), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(0, g_error_logs);
  EXPECT_EQ(2, g_debug_logs);
}

// A failure of the system (here the backend's) is an error, logged once where the registrar
// decides it, with the backend's errno; diag level under HIDE_ERRORS.
TEST_F(RegistrarTest, BackendFailureIsLoggedOnceAsAnErrorWithItsErrno) {
  uct_mem_h memh = nullptr;
  host_.failNext(rcache::Status::kIoError);
  EXPECT_EQ(UCS_ERR_IO_ERROR, reg_->reg(at(3), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(1, g_error_logs);
  g_error_logs = 0;
  host_.failNext(rcache::Status::kIoError);
  EXPECT_EQ(UCS_ERR_IO_ERROR,
            reg_->reg(at(3), kPage, UCT_MD_MEM_ACCESS_RMA | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh));
  EXPECT_EQ(0, g_error_logs) << "HIDE_ERRORS must keep errors out of the error log";
}

TEST_F(RegistrarTest, BackendFailureIsMappedAndLeavesNothing) {
  uct_mem_h memh = nullptr;
  host_.failNext(rcache::Status::kIoError);
  EXPECT_EQ(UCS_ERR_IO_ERROR,
            reg_->reg(at(3), kPage, UCT_MD_MEM_ACCESS_RMA | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh));
  EXPECT_EQ(0u, reg_->cache().stats().regions);
  ASSERT_EQ(UCS_OK, reg_->reg(at(3), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(UCS_OK, dereg(memh));
}

TEST_F(RegistrarTest, InvalidateCompletesOnceTheRegistrationIsGone) {
  uct_mem_h a = nullptr, b = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(4), 2 * kPage, UCT_MD_MEM_ACCESS_RMA, &a));
  ASSERT_EQ(UCS_OK, reg_->reg(at(4), kPage, UCT_MD_MEM_ACCESS_RMA, &b));
  ASSERT_EQ(a, b);
  struct Comp {
    uct_completion_t c;
    int calls;
  } comp{{[](uct_completion_t* c) { reinterpret_cast<Comp*>(c)->calls++; }, 1, UCS_OK}, 0};
  ASSERT_EQ(UCS_OK, dereg(a, ucx::kDeregFlagInvalidate, &comp.c));
  EXPECT_EQ(0, comp.calls);
  EXPECT_EQ(1, host_.live()) << "deregistered while a holder remains";
  uct_mem_h c = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(4), kPage, UCT_MD_MEM_ACCESS_RMA, &c));
  EXPECT_NE(b, c);
  EXPECT_EQ(UCS_OK, dereg(b));
  EXPECT_EQ(1, comp.calls);
  EXPECT_EQ(UCS_OK, dereg(c));
  EXPECT_EQ(1, comp.calls);
}

TEST_F(RegistrarTest, DeregParamsAreChecked) {
  ucx::DeregParams p{};
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, reg_->dereg(&p));
  uct_mem_h memh = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(5), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, dereg(memh, ucx::kDeregFlagInvalidate, nullptr));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, dereg(memh, 0x80));
  EXPECT_EQ(UCS_OK, dereg(memh));
  // Caller mistakes: one debug line each, no error (before: three errors, the test failed).
  EXPECT_EQ(0, g_error_logs);
  EXPECT_EQ(3, g_debug_logs);
}

TEST_F(RegistrarTest, ManagedMemoryUnderHostPagesGoesToTheHostBackend) {
  reg_->setManagedPolicy(ManagedPolicy::kHostPages);
  uct_mem_h memh = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(50), kPage, UCT_MD_MEM_ACCESS_RMA, &memh));
  EXPECT_EQ(1, host_.registered());
  EXPECT_EQ(0, cuda_.registered());
  EXPECT_EQ(MemType::kCudaManaged, host_.firstLive()->type);
  EXPECT_EQ(MemType::kCudaManaged, static_cast<rcache::Region*>(memh)->memType());
  EXPECT_EQ(UCS_OK, dereg(memh));
}

TEST_F(RegistrarTest, HitsSkipClassificationUnlessDeviceHitsAreValidated) {
  uct_mem_h a = nullptr, b = nullptr, d = nullptr, e = nullptr;
  g_classified = 0;
  ASSERT_EQ(UCS_OK, reg_->reg(at(7), 2 * kPage, UCT_MD_MEM_ACCESS_RMA, &a));
  ASSERT_EQ(UCS_OK, reg_->reg(at(7, 100), kPage, UCT_MD_MEM_ACCESS_RMA, &b));
  EXPECT_EQ(a, b);
  EXPECT_EQ(1, g_classified) << "a host hit was classified";
  ASSERT_EQ(UCS_OK, reg_->reg(at(34), kPage, UCT_MD_MEM_ACCESS_RMA, &d));
  ASSERT_EQ(UCS_OK, reg_->reg(at(34), kPage, UCT_MD_MEM_ACCESS_RMA, &e));
  EXPECT_EQ(d, e);
  EXPECT_EQ(2, g_classified) << "hooks mode: a device hit needs no classification";
  EXPECT_EQ(UCS_OK, dereg(e));
  reg_->setValidateDeviceHits(true);
  ASSERT_EQ(UCS_OK, reg_->reg(at(34), kPage, UCT_MD_MEM_ACCESS_RMA, &e));
  EXPECT_EQ(d, e);
  EXPECT_EQ(3, g_classified) << "validate mode: a device hit is classified (buffer-ID check)";
  ASSERT_EQ(UCS_OK, reg_->reg(at(7), kPage, UCT_MD_MEM_ACCESS_RMA, &b));
  EXPECT_EQ(3, g_classified) << "validate mode: host hits are still not classified";
  // A hit never widens access: a write request on a read-only region is a miss (merged).
  uct_mem_h ro = nullptr, rw = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(20), kPage, UCT_MD_MEM_ACCESS_REMOTE_GET, &ro));
  ASSERT_EQ(UCS_OK, reg_->reg(at(20), kPage, UCT_MD_MEM_ACCESS_REMOTE_PUT, &rw));
  EXPECT_NE(ro, rw);
  for (uct_mem_h m : {a, b, d, e, ro, rw}) EXPECT_EQ(UCS_OK, dereg(m));
}

TEST_F(RegistrarTest, StatsLineHasTheDocumentedFields) {
  uct_mem_h a = nullptr, b = nullptr;
  ASSERT_EQ(UCS_OK, reg_->reg(at(6), kPage, UCT_MD_MEM_ACCESS_RMA, &a));
  ASSERT_EQ(UCS_OK, reg_->reg(at(6), kPage, UCT_MD_MEM_ACCESS_RMA, &b));
  const std::string line = reg_->statsLine();
  EXPECT_EQ("gmd fake0: reg_hits=1 reg_misses=1 merges=0 evictions=0 invalidations=0 regions=1 "
            "pinned_bytes=" + std::to_string(kPage),
            line);
  EXPECT_EQ(UCS_OK, dereg(a));
  EXPECT_EQ(UCS_OK, dereg(b));
}

}  // namespace
}  // namespace gmd::md
