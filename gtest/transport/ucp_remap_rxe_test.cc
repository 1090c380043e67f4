// The remap exchange through UCP alone (no MPI; a pip build of UCX has no Open MPI built against
// it): host buffers sent by rendezvous over gmd_rc, then unmapped and mapped again at the same
// addresses with new contents, and sent again. Every byte of every round must be the new round's:
// a registration that outlived its pages (in gmd's cache, or in UCP's own from UCX 1.16) would move
// the old pages' bytes.
//
// One process, two UCP contexts (receiver on the first RDMA device, sender on the last: rxe0:1 and
// rxe1:1 in the soft-RoCE VM; the same device with SameDevice), UCX_TLS=gmd_rc,self, rendezvous
// from 8 KiB with the GET scheme (the receiver's NIC reads the sender's pages into its own) or the
// PUT scheme (the sender's NIC writes them): both sides' buffers are registered either way.
//
// Thread safety: none; one test at a time on the test's thread.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>

#include "gtest/rxe/ucp_peer.h"
#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

constexpr std::size_t kSizes[] = {64 * 1024 + 3, 1024 * 1024};  // rendezvous, odd and whole pages
constexpr std::size_t kMapBytes = 2 * 1024 * 1024;
constexpr int kRounds = 12;
constexpr ucp_tag_t kTag = 0x72656d;
constexpr auto kDeadline = std::chrono::seconds(120);

std::uint8_t pattern(int round, std::size_t i) {
  return static_cast<std::uint8_t>((i * 7 + static_cast<std::size_t>(round) * 59 + (i >> 12)) & 0xff);
}

struct Done {
  bool done = false;
  ucs_status_t status = UCS_OK;
};
void sendDone(void*, ucs_status_t status, void* user) { *static_cast<Done*>(user) = {true, status}; }
void recvDone(void*, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
  *static_cast<Done*>(user) = {true, status};
}

// Maps kMapBytes of fresh anonymous memory at `at` (nullptr: anywhere); nullptr on failure.
void* mapAt(void* at) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_FIXED_NOREPLACE
  if (at != nullptr) flags |= MAP_FIXED_NOREPLACE;
#endif
  void* p = mmap(at, kMapBytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// param: sender on another device, rendezvous scheme
class UcpRemap : public ::testing::TestWithParam<std::tuple<bool, const char*>> {
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    const auto devs = rdmaDeviceNames();
    if (std::get<0>(GetParam()) && devs.size() < 2) GTEST_SKIP() << "needs two RDMA devices";
    open(devs.front() + ":1", &recv_);
    open((std::get<0>(GetParam()) ? devs.back() : devs.front()) + ":1", &send_);
    if (HasFatalFailure()) return;
    ep_ = connectUcpPeer(send_, recv_);
    ASSERT_NE(nullptr, ep_);
  }

  void TearDown() override {
    if (ep_ != nullptr) {
      closeUcpEndpoint(ep_, HasFailure() ? UCP_EP_CLOSE_FLAG_FORCE : 0, [this] { progress(); });
    }
    for (UcpPeer* p : {&send_, &recv_}) closeUcpPeer(p);
    for (void* m : {src_, dst_}) {
      if (m != nullptr) munmap(m, kMapBytes);
    }
  }

  void open(const std::string& device, UcpPeer* peer) {
    openUcpPeer(device,
                {{{"TLS", "gmd_rc,self"},
                  {"RNDV_THRESH", "8192"},
                  {"RNDV_SCHEME", std::get<1>(GetParam())}},
                 UCP_FEATURE_TAG},
                peer);
  }

  void progress() {
    ucp_worker_progress(send_.worker);
    ucp_worker_progress(recv_.worker);
  }

  // Sends `size` bytes from src_ into dst_; false (with the failure recorded) when it did not end OK.
  bool transfer(std::size_t size) {
    Done sent, got;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv = recvDone;
    rp.user_data = &got;
    void* rreq = ucp_tag_recv_nbx(recv_.worker, dst_, size, kTag, ~ucp_tag_t{0}, &rp);
    EXPECT_FALSE(UCS_PTR_IS_ERR(rreq)) << ucs_status_string(UCS_PTR_STATUS(rreq));
    if (rreq == nullptr) got.done = true;
    ucp_request_param_t sp{};
    sp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    sp.cb.send = sendDone;
    sp.user_data = &sent;
    void* sreq = ucp_tag_send_nbx(ep_, src_, size, kTag, &sp);
    EXPECT_FALSE(UCS_PTR_IS_ERR(sreq)) << ucs_status_string(UCS_PTR_STATUS(sreq));
    if (sreq == nullptr) sent.done = true;
    const auto end = std::chrono::steady_clock::now() + kDeadline;
    while (!(sent.done && got.done) && std::chrono::steady_clock::now() < end) progress();
    EXPECT_TRUE(sent.done && got.done) << size << " B: the transfer did not complete in time";
    EXPECT_EQ(UCS_OK, sent.status) << size << " B: send";
    EXPECT_EQ(UCS_OK, got.status) << size << " B: receive";
    if (UCS_PTR_IS_PTR(sreq)) ucp_request_free(sreq);
    if (UCS_PTR_IS_PTR(rreq)) ucp_request_free(rreq);
    return sent.done && got.done && sent.status == UCS_OK && got.status == UCS_OK;
  }

  UcpPeer recv_, send_;
  ucp_ep_h ep_ = nullptr;
  void* src_ = nullptr;
  void* dst_ = nullptr;
};

TEST_P(UcpRemap, EveryRoundAfterARemapMovesTheNewPages) {
  ASSERT_NE(nullptr, ep_);
  src_ = mapAt(nullptr);
  dst_ = mapAt(nullptr);
  ASSERT_NE(nullptr, src_) << std::strerror(errno);
  ASSERT_NE(nullptr, dst_) << std::strerror(errno);
  void* const src_at = src_;
  void* const dst_at = dst_;
  std::size_t stale = 0;  // bytes of an earlier round that arrived
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {  // new pages at the same addresses, on both sides
      ASSERT_EQ(0, munmap(src_, kMapBytes));
      ASSERT_EQ(0, munmap(dst_, kMapBytes));
      src_ = dst_ = nullptr;
      src_ = mapAt(src_at);
      dst_ = mapAt(dst_at);
      ASSERT_EQ(src_at, src_) << "round " << round << ": the sender's buffer is not back at its address";
      ASSERT_EQ(dst_at, dst_) << "round " << round << ": the receiver's buffer is not back at its address";
    }
    auto* s = static_cast<std::uint8_t*>(src_);
    auto* d = static_cast<std::uint8_t*>(dst_);
    for (std::size_t i = 0; i < kMapBytes; ++i) s[i] = pattern(round, i);
    for (const std::size_t size : kSizes) {
      std::memset(d, 0xee, kMapBytes);
      ASSERT_TRUE(transfer(size)) << "round " << round << ", " << size << " B";
      std::size_t wrong = 0, first = size;
      for (std::size_t i = 0; i < size; ++i) {
        if (d[i] == pattern(round, i)) continue;
        ++wrong;
        if (first == size) first = i;
        if (round > 0 && d[i] == pattern(round - 1, i)) ++stale;
      }
      EXPECT_EQ(0u, wrong) << "round " << round << ", " << size << " B: " << wrong
                           << " bytes wrong, the first at " << first;
      for (std::size_t i = size; i < size + 64; ++i) {
        ASSERT_EQ(0xee, d[i]) << "round " << round << ": written past the end at " << i;
      }
    }
  }
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  std::printf("UCX %u.%u.%u, %s: %d rounds of %zu + %zu B, buffers remapped at the same addresses; "
              "bytes of the previous round that arrived: %zu\n",
              major, minor, release, std::get<1>(GetParam()), kRounds, kSizes[0], kSizes[1], stale);
}

INSTANTIATE_TEST_SUITE_P(
    Devices, UcpRemap,
    ::testing::Combine(::testing::Values(true, false), ::testing::Values("get_zcopy", "put_zcopy")),
    [](const ::testing::TestParamInfo<std::tuple<bool, const char*>>& p) {
      return std::string(std::get<1>(p.param)) + (std::get<0>(p.param) ? "_CrossDevice" : "_SameDevice");
    });

}  // namespace
}  // namespace gmd::test
