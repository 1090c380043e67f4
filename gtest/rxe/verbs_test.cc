// Proves the soft-RoCE harness: two real RDMA devices, an RC QP pair across them (RoCEv2 GID of the
// IPv4 address on rxe), RDMA WRITE and READ of several sizes with the bytes checked on the other side.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/rxe/verbs_fixture.h"

namespace gmd::test {
namespace {

// A page-aligned anonymous mapping registered on one port, unmapped and deregistered on destruction.
class MappedMr {
 public:
  MappedMr(ibv_pd* pd, std::size_t length, int access) : length_(length) {
    addr_ = mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
      return;
    }
    mr_ = ibv_reg_mr(pd, addr_, length_, access);
  }
  ~MappedMr() {
    if (mr_ != nullptr) ibv_dereg_mr(mr_);
    if (addr_ != nullptr) munmap(addr_, length_);
  }
  bool ok() const { return mr_ != nullptr; }
  void dereg() {
    ibv_dereg_mr(mr_);
    mr_ = nullptr;
  }
  std::uint8_t* data() const { return static_cast<std::uint8_t*>(addr_); }
  std::uint64_t addr() const { return reinterpret_cast<std::uint64_t>(addr_); }
  ibv_mr* mr() const { return mr_; }

 private:
  std::size_t length_;
  void* addr_ = nullptr;
  ibv_mr* mr_ = nullptr;
};

constexpr int kRemoteAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

class VerbsRc : public ::testing::Test {
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(2);
    const auto devs = rdmaDeviceNames();
    // rxe1 -> rxe0 in the VM; the first two devices elsewhere.
    std::string err;
    ASSERT_TRUE(pair_.open(devs[1], devs[0], &err)) << err;
  }
  RcPair pair_;
};

TEST_F(VerbsRc, WriteAndReadAcrossDevicesVerifyBytes) {
  constexpr std::size_t kMax = 8u << 20;
  MappedMr src(pair_.a->pd(), kMax, kRemoteAccess);
  MappedMr dst(pair_.b->pd(), kMax, kRemoteAccess);
  MappedMr back(pair_.a->pd(), kMax, kRemoteAccess);
  ASSERT_TRUE(src.ok() && dst.ok() && back.ok()) << "ibv_reg_mr: " << std::strerror(errno);

  const std::size_t sizes[] = {1, 63, 4096, 65536 + 13, 1u << 20, kMax};
  std::uint64_t seed = 1;
  for (std::size_t size : sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    // An offset inside the region checks that remote addresses are honoured, not just the base.
    const std::size_t off = size < kMax ? 8 : 0;
    fillPattern(src.data(), size, seed);
    std::memset(dst.data(), 0, kMax);
    std::string err;
    ASSERT_EQ(IBV_WC_SUCCESS, pair_.qa->write(src.data(), size, src.mr()->lkey, dst.addr() + off,
                                              dst.mr()->rkey, &err))
        << err;
    EXPECT_EQ(size, checkPattern(dst.data() + off, size, seed));
    if (off != 0) {
      EXPECT_EQ(0, dst.data()[0]) << "bytes landed before the remote address";
    }

    std::memset(back.data(), 0, kMax);
    ASSERT_EQ(IBV_WC_SUCCESS, pair_.qa->read(back.data(), size, back.mr()->lkey, dst.addr() + off,
                                             dst.mr()->rkey, &err))
        << err;
    EXPECT_EQ(size, checkPattern(back.data(), size, seed));
    ++seed;
  }
}

TEST_F(VerbsRc, WriteWithWrongRkeyFailsAtInitiator) {
  MappedMr src(pair_.a->pd(), 4096, kRemoteAccess);
  MappedMr dst(pair_.b->pd(), 4096, kRemoteAccess);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::memset(dst.data(), 0x5a, 4096);
  fillPattern(src.data(), 4096, 42);
  std::string err;
  const ibv_wc_status st =
      pair_.qa->write(src.data(), 4096, src.mr()->lkey, dst.addr(), dst.mr()->rkey ^ 0x80, &err);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st) << ibv_wc_status_str(st) << " " << err;
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(0x5a, dst.data()[i]) << "byte " << i << " was written";
}

TEST_F(VerbsRc, WriteThroughDeregisteredKeyFails) {
  MappedMr src(pair_.a->pd(), 4096, kRemoteAccess);
  MappedMr dst(pair_.b->pd(), 4096, kRemoteAccess);
  ASSERT_TRUE(src.ok() && dst.ok());
  const std::uint32_t old_rkey = dst.mr()->rkey;
  dst.dereg();
  std::memset(dst.data(), 0x5a, 4096);
  fillPattern(src.data(), 4096, 7);
  std::string err;
  const ibv_wc_status st =
      pair_.qa->write(src.data(), 4096, src.mr()->lkey, dst.addr(), old_rkey, &err);
  EXPECT_NE(IBV_WC_SUCCESS, st) << err;
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(0x5a, dst.data()[i]) << "byte " << i << " was written";
}

}  // namespace
}  // namespace gmd::test
