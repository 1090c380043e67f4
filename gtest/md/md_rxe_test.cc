// The gmd MD through the public UCT API, on real RDMA devices (soft-RoCE in the VM): the component is
// loaded the way UCX 1.13 users load it (the module is dlopen'ed before UCX is used, as LD_PRELOAD
// would), listed, opened per device, and its registrations are proven real with RDMA WRITE/READ.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "md/mapping.h"
#include "md/md.h"
#include "md/ucx_abi.h"

namespace gmd::test {
namespace {

const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
constexpr unsigned kRma = UCT_MD_MEM_ACCESS_RMA;

const bool kPluginLoaded = loadGmdPluginFirst();

uct_component_h findGmd(std::vector<std::string>* md_names) {
  return findComponent("gmd", md_names);
}

const rcache::Region* regionOf(uct_mem_h memh) { return static_cast<const rcache::Region*>(memh); }

class GmdMd : public ::testing::Test {
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    comp_ = findGmd(&md_names_);
    ASSERT_NE(nullptr, comp_) << "component gmd is not listed by uct_query_components";
    ASSERT_FALSE(md_names_.empty());
    ucs_status_t st;
    md_ = openMd(comp_, md_names_[0], &st);
    ASSERT_EQ(UCS_OK, st) << ucs_status_string(st);
  }
  void TearDown() override {
    if (md_ != nullptr) uct_md_close(md_);
  }

  uct_mem_h reg(void* addr, std::size_t len, unsigned flags = kRma) {
    uct_mem_h memh = nullptr;
    const ucs_status_t st = uct_md_mem_reg(md_, addr, len, flags, &memh);
    EXPECT_EQ(UCS_OK, st) << ucs_status_string(st) << " addr=" << addr << " len=" << len;
    return st == UCS_OK ? memh : nullptr;
  }
  void dereg(uct_mem_h memh) { ASSERT_EQ(UCS_OK, uct_md_mem_dereg(md_, memh)); }
  rcache::Stats stats() { return md::Md::from(md_)->registrar().cache().stats(); }

  uct_component_h comp_ = nullptr;
  std::vector<std::string> md_names_;
  uct_md_h md_ = nullptr;
};

TEST_F(GmdMd, ComponentListsOneMdPerDevice) {
  EXPECT_EQ(rdmaDeviceNames(), md_names_);
  uct_md_attr_t attr{};
  ASSERT_EQ(UCS_OK, uct_md_query(md_, &attr));
  EXPECT_STREQ("gmd", attr.component_name);
  EXPECT_TRUE(attr.cap.flags & UCT_MD_FLAG_REG);
  EXPECT_TRUE(attr.cap.flags & UCT_MD_FLAG_NEED_RKEY);
  EXPECT_TRUE(attr.cap.flags & UCT_MD_FLAG_NEED_MEMH);
  EXPECT_TRUE(attr.cap.flags & UCT_MD_FLAG_INVALIDATE);
  EXPECT_FALSE(attr.cap.flags & UCT_MD_FLAG_ALLOC);
  EXPECT_TRUE(attr.cap.reg_mem_types & UCS_BIT(UCS_MEMORY_TYPE_HOST));
  EXPECT_EQ(md::kPackedRkeySize, attr.rkey_packed_size);
  EXPECT_GT(attr.cap.max_reg, 0u);
  EXPECT_GT(attr.reg_cost.c, 0.0);
}

TEST_F(GmdMd, OpensEveryDeviceAndRefusesUnknownOne) {
  for (const auto& name : md_names_) {
    ucs_status_t st;
    uct_md_h md = openMd(comp_, name, &st);
    ASSERT_EQ(UCS_OK, st) << name;
    uct_md_close(md);
  }
  ucs_status_t st;
  EXPECT_EQ(nullptr, openMd(comp_, "no_such_device0", &st));
  EXPECT_EQ(UCS_ERR_NO_DEVICE, st);
}

TEST_F(GmdMd, InvalidConfigRejectedAtOpen) {
  setenv("UCX_GMD_RCACHE_ADDR_ALIGN", "3000", 1);
  ucs_status_t st;
  uct_md_h md = openMd(comp_, md_names_[0], &st);
  unsetenv("UCX_GMD_RCACHE_ADDR_ALIGN");
  EXPECT_EQ(nullptr, md);
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, st);
}

TEST_F(GmdMd, RegistersManySizesAndAlignmentsMallocAndMmap) {
  const std::size_t sizes[] = {1, 7, 4096, 4097, 65536, 1u << 20, 8u << 20};
  const std::size_t offsets[] = {0, 1, 64, 4095};
  for (std::size_t size : sizes) {
    for (std::size_t off : offsets) {
      std::vector<std::uint8_t> heap(size + off);
      uct_mem_h a = reg(heap.data() + off, size);
      Mapping map(size + off);
      ASSERT_NE(nullptr, map.addr);
      uct_mem_h b = reg(map.addr + off, size);
      ASSERT_NE(nullptr, a);
      ASSERT_NE(nullptr, b);
      for (uct_mem_h m : {a, b}) {
        const auto* r = regionOf(m);
        EXPECT_EQ(0u, r->start() % kPage);
        EXPECT_LE(r->start(), reinterpret_cast<std::uintptr_t>(m == a ? heap.data() + off
                                                                      : map.addr + off));
        std::uint8_t packed[md::kPackedRkeySize];
        ASSERT_EQ(UCS_OK, uct_md_mkey_pack(md_, m, packed));
        uct_rkey_bundle_t bundle{};
        ASSERT_EQ(UCS_OK, uct_rkey_unpack(comp_, packed, &bundle));
        EXPECT_EQ(r->registration().rkey, static_cast<std::uint32_t>(bundle.rkey));
        EXPECT_EQ(UCS_OK, uct_rkey_release(comp_, &bundle));
        dereg(m);
      }
    }
  }
}

TEST_F(GmdMd, BadInputsAreRefusedWithAStatus) {
  uct_mem_h memh = nullptr;
  char byte = 0;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_md_mem_reg(md_, &byte, 0, kRma, &memh));
  // Wrap-around.
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_md_mem_reg(md_, reinterpret_cast<void*>(~std::uintptr_t{0} - 4095), 8192,
                           kRma | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh));
  // Unknown flag bit (bit 4 is unused in UCX 1.13).
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_md_mem_reg(md_, &byte, 1, kRma | (1u << 4), &memh));
  // Unmapped range.
  void* hole = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, hole);
  ASSERT_EQ(0, munmap(hole, 4 * kPage));
  EXPECT_NE(UCS_OK, uct_md_mem_reg(md_, hole, 4 * kPage, kRma | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh));
  // PROT_NONE range.
  Mapping none(4 * kPage);
  ASSERT_EQ(0, mprotect(none.addr, 4 * kPage, PROT_NONE));
  EXPECT_NE(UCS_OK,
            uct_md_mem_reg(md_, none.addr, 4 * kPage, kRma | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh));
  // Failures left nothing behind, and the MD still works.
  EXPECT_EQ(0u, stats().regions);
  Mapping ok(kPage);
  uct_mem_h good = reg(ok.addr, kPage);
  ASSERT_NE(nullptr, good);
  dereg(good);
}

// The seed thread's scenario: register pages 0-2, register page 1 (a hit), release 0-2, page 2 is
// unmapped and a new page mapped there; registering 0-2 again must be a new registration, while
// page 1's holder keeps the old one until it releases it.
TEST_F(GmdMd, SeedScenarioReRegistrationAfterPartialRemapIsNew) {
  Mapping m(3 * kPage);
  ASSERT_NE(nullptr, m.addr);
  uct_mem_h whole = reg(m.addr, 3 * kPage);
  uct_mem_h page1 = reg(m.addr + kPage, kPage);
  ASSERT_NE(nullptr, whole);
  ASSERT_NE(nullptr, page1);
  EXPECT_EQ(whole, page1) << "page 1 must hit the registration of pages 0-2";
  const std::uint32_t old_rkey = regionOf(whole)->registration().rkey;
  dereg(whole);
  ASSERT_EQ(0, munmap(m.addr + 2 * kPage, kPage));
  void* again = mmap(m.addr + 2 * kPage, kPage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(m.addr + 2 * kPage, again);
  uct_mem_h fresh = reg(m.addr, 3 * kPage);
  ASSERT_NE(nullptr, fresh);
  EXPECT_NE(page1, fresh);
  EXPECT_NE(old_rkey, regionOf(fresh)->registration().rkey);
  EXPECT_EQ(old_rkey, regionOf(page1)->registration().rkey) << "page 1's holder keeps its key";
  dereg(page1);
  dereg(fresh);
}

TEST_F(GmdMd, InvalidateCompletesAfterLastHolderReleases) {
  Mapping m(4 * kPage);
  uct_mem_h a = reg(m.addr, 4 * kPage);
  uct_mem_h b = reg(m.addr, 4 * kPage);
  ASSERT_EQ(a, b);
  struct Comp {
    uct_completion_t c;
    int calls = 0;
  } comp{};
  comp.c.func = [](uct_completion_t* c) { reinterpret_cast<Comp*>(c)->calls++; };
  comp.c.count = 1;
  comp.c.status = UCS_OK;
  ucx::DeregParams p{};
  p.field_mask = ucx::kDeregFieldMemh | ucx::kDeregFieldFlags | ucx::kDeregFieldCompletion;
  p.flags = ucx::kDeregFlagInvalidate;
  p.memh = a;
  p.comp = &comp.c;
  ASSERT_EQ(UCS_OK, uct_md_mem_dereg_v2(md_, &p));
  EXPECT_EQ(0, comp.calls) << "another holder still uses the registration";
  uct_mem_h c = reg(m.addr, 4 * kPage);
  EXPECT_NE(b, c) << "an invalidated registration is never handed out again";
  dereg(b);
  EXPECT_EQ(1, comp.calls);
  EXPECT_EQ(UCS_OK, comp.c.status);
  dereg(c);
  // INVALIDATE without a completion is refused.
  uct_mem_h d = reg(m.addr, kPage);
  p.memh = d;
  p.field_mask = ucx::kDeregFieldMemh | ucx::kDeregFieldFlags;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_md_mem_dereg_v2(md_, &p));
  dereg(d);
}

TEST_F(GmdMd, SeveralThreadsRegisterAndReleaseConcurrently) {
  constexpr int kThreads = 4, kIters = 300, kBuffers = 16;
  Mapping pool(kBuffers * 4 * kPage);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      for (int i = 0; i < kIters; ++i) {
        const std::size_t off = (rng() % kBuffers) * 4 * kPage + rng() % kPage;
        const std::size_t len = 1 + rng() % (3 * kPage);
        uct_mem_h memh = nullptr;
        if (uct_md_mem_reg(md_, pool.addr + off, len, kRma, &memh) != UCS_OK) {
          failures++;
          continue;
        }
        const auto* r = regionOf(memh);
        if (r->start() > reinterpret_cast<std::uintptr_t>(pool.addr + off) ||
            r->end() < reinterpret_cast<std::uintptr_t>(pool.addr + off + len)) {
          failures++;
        }
        if (uct_md_mem_dereg(md_, memh) != UCS_OK) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(0, failures.load());
  EXPECT_GT(stats().hits, 0u);
}

// Registrations are real: RDMA between two devices with gmd's keys, each QP on its MD's PD.
class GmdRdma : public ::testing::Test {
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(2);
    std::vector<std::string> names;
    comp_ = findGmd(&names);
    ASSERT_NE(nullptr, comp_);
    ASSERT_GE(names.size(), 2u);
    ucs_status_t st;
    target_ = openMd(comp_, names[0], &st);  // rxe0
    ASSERT_EQ(UCS_OK, st);
    initiator_ = openMd(comp_, names[1], &st);  // rxe1
    ASSERT_EQ(UCS_OK, st);
    std::string err;
    auto* t = md::Md::from(target_);
    auto* i = md::Md::from(initiator_);
    auto pi = VerbsPort::wrap(i->context(), i->pd(), names[1], &err);
    ASSERT_TRUE(pi) << err;
    auto pt = VerbsPort::wrap(t->context(), t->pd(), names[0], &err);
    ASSERT_TRUE(pt) << err;
    ASSERT_TRUE(pair_.connect(std::move(pi), std::move(pt), &err)) << err;
  }
  void TearDown() override {
    pair_ = RcPair{};
    if (initiator_ != nullptr) uct_md_close(initiator_);
    if (target_ != nullptr) uct_md_close(target_);
  }
  uct_mem_h reg(uct_md_h md, void* addr, std::size_t len) {
    uct_mem_h memh = nullptr;
    EXPECT_EQ(UCS_OK, uct_md_mem_reg(md, addr, len, kRma, &memh));
    return memh;
  }
  std::uint32_t remoteKey(uct_mem_h memh) {
    std::uint8_t packed[md::kPackedRkeySize];
    EXPECT_EQ(UCS_OK, uct_md_mkey_pack(target_, memh, packed));
    uct_rkey_bundle_t b{};
    EXPECT_EQ(UCS_OK, uct_rkey_unpack(comp_, packed, &b));
    uct_rkey_release(comp_, &b);
    return static_cast<std::uint32_t>(b.rkey);
  }

  uct_component_h comp_ = nullptr;
  uct_md_h target_ = nullptr, initiator_ = nullptr;
  RcPair pair_;
};

TEST_F(GmdRdma, WriteAndReadWithGmdKeys) {
  constexpr std::size_t kLen = 4u << 20;
  Mapping src(kLen), dst(kLen), back(kLen);
  uct_mem_h ms = reg(initiator_, src.addr, kLen);
  uct_mem_h md = reg(target_, dst.addr, kLen);
  uct_mem_h mb = reg(initiator_, back.addr, kLen);
  ASSERT_TRUE(ms && md && mb);
  const std::uint32_t rkey = remoteKey(md);
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{100000}, kLen}) {
    fillPattern(src.addr, size, size);
    std::string err;
    ASSERT_EQ(IBV_WC_SUCCESS,
              pair_.qa->write(src.addr, size, regionOf(ms)->registration().lkey,
                              reinterpret_cast<std::uint64_t>(dst.addr), rkey, &err))
        << err;
    EXPECT_EQ(size, checkPattern(dst.addr, size, size));
    std::memset(back.addr, 0, size);
    ASSERT_EQ(IBV_WC_SUCCESS,
              pair_.qa->read(back.addr, size, regionOf(mb)->registration().lkey,
                             reinterpret_cast<std::uint64_t>(dst.addr), rkey, &err))
        << err;
    EXPECT_EQ(size, checkPattern(back.addr, size, size));
  }
  uct_md_mem_dereg(initiator_, ms);
  uct_md_mem_dereg(target_, md);
  uct_md_mem_dereg(initiator_, mb);
}

// munmap + mmap at the same address: the cached registration is dropped by the libucm event, a new
// registration covers the new pages, and the old remote key no longer reaches memory.
TEST_F(GmdRdma, AfterRemapAtSameAddressReadsSeeNewPagesAndOldKeyIsRevoked) {
  constexpr std::size_t kLen = 64 * 1024;
  Mapping back(kLen);
  uct_mem_h mb = reg(initiator_, back.addr, kLen);
  auto* target = static_cast<std::uint8_t*>(
      mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(MAP_FAILED, target);
  fillPattern(target, kLen, 1);
  uct_mem_h m1 = reg(target_, target, kLen);
  const std::uint32_t old_rkey = remoteKey(m1);
  std::string err;
  ASSERT_EQ(IBV_WC_SUCCESS, pair_.qa->read(back.addr, kLen, regionOf(mb)->registration().lkey,
                                           reinterpret_cast<std::uint64_t>(target), old_rkey, &err));
  EXPECT_EQ(kLen, checkPattern(back.addr, kLen, 1));
  uct_md_mem_dereg(target_, m1);  // cached, unused

  ASSERT_EQ(0, munmap(target, kLen));
  ASSERT_EQ(target, mmap(target, kLen, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
  fillPattern(target, kLen, 2);
  uct_mem_h m2 = reg(target_, target, kLen);
  const std::uint32_t new_rkey = remoteKey(m2);
  EXPECT_NE(old_rkey, new_rkey);
  std::memset(back.addr, 0, kLen);
  ASSERT_EQ(IBV_WC_SUCCESS, pair_.qa->read(back.addr, kLen, regionOf(mb)->registration().lkey,
                                           reinterpret_cast<std::uint64_t>(target), new_rkey, &err));
  EXPECT_EQ(kLen, checkPattern(back.addr, kLen, 2)) << "read the old pages through a stale entry";

  // The old remote key no longer reaches memory: a WRITE through it fails at the initiator and the
  // new pages are untouched.
  Mapping src(kPage);
  fillPattern(src.addr, kPage, 3);
  uct_mem_h msrc = reg(initiator_, src.addr, kPage);
  const ibv_wc_status st =
      pair_.qa->write(src.addr, kPage, regionOf(msrc)->registration().lkey,
                      reinterpret_cast<std::uint64_t>(target), old_rkey, &err);
  EXPECT_NE(IBV_WC_SUCCESS, st) << "a WRITE through a revoked key succeeded";
  EXPECT_EQ(kLen, checkPattern(target, kLen, 2)) << "bytes landed through a revoked key";
  uct_md_mem_dereg(initiator_, msrc);
  uct_md_mem_dereg(target_, m2);
  uct_md_mem_dereg(initiator_, mb);
  munmap(target, kLen);
}

}  // namespace
}  // namespace gmd::test
