// UCP over gmd_rc alone (UCX_TLS=gmd_rc,self): tagged messages that arrive before their receive is
// posted ("unexpected" messages), eager and rendezvous, every byte checked.
//
// One process, two UCP contexts: the receiver on the first RDMA device (rxe0:1), the sender on the
// last (CrossDevice: rxe1:1) or the same one (SameDevice). Each context has its own worker, so the
// "self" transport cannot reach across and gmd_rc carries everything (without it the endpoints
// cannot be created: UCS_ERR_UNREACHABLE). The sender posts every message; both workers progress
// until the receiver's ucp_tag_probe_nb sees each message's full length (it is there, unexpected);
// only then are the receives posted, in the opposite order, and every byte compared.
//
// UCX_RNDV_THRESH is set to kRndvThresh: messages below it travel eagerly (one fragment up to the
// AM lane's max_bcopy, several above), messages at or above it by rendezvous (the receiver fetches
// the data after its receive is posted).
//
// Thread safety: none; one test at a time on the test's thread.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/rxe/ucp_peer.h"
#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

constexpr std::size_t kRndvThresh = 16384;
constexpr auto kDeadline = std::chrono::seconds(180);

// Eager: empty, one byte, one fragment, a full fragment, several fragments (gmd_rc's max_bcopy is
// 8 KiB by default), just below the threshold. Rendezvous: at the threshold and far above it.
const std::size_t kSizes[] = {0,     1,      8,     1000, 4099, 8192, 8193, 12000,
                              16383, 16384, 65543, 1048579, 4194304};

std::uint8_t pattern(std::size_t msg, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131 + msg * 29 + (i >> 9)) & 0xff);
}

struct Request {  // what the callbacks report
  bool done = false;
  ucs_status_t status = UCS_OK;
  std::size_t length = 0;
  ucp_tag_t tag = 0;
};

void sendDone(void*, ucs_status_t status, void* user) {
  auto* r = static_cast<Request*>(user);
  r->done = true;
  r->status = status;
}

void recvDone(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* r = static_cast<Request*>(user);
  r->done = true;
  r->status = status;
  if (info != nullptr) {
    r->length = info->length;
    r->tag = info->sender_tag;
  }
}

// A UCP context and worker on one device, gmd_rc and self only.
using Peer = UcpPeer;

class UcpUnexpected : public ::testing::TestWithParam<bool> {  // param: sender on another device
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    const auto devs = rdmaDeviceNames();
    if (GetParam() && devs.size() < 2) GTEST_SKIP() << "needs two RDMA devices";
    open(devs.front() + ":1", &recv_);
    open((GetParam() ? devs.back() : devs.front()) + ":1", &send_);
    if (HasFatalFailure()) return;
    to_recv_ = connect(send_, recv_);
    to_send_ = connect(recv_, send_);  // as MPI and ucx_perftest do: endpoints both ways
  }

  void TearDown() override {
    for (ucp_ep_h* ep : {&to_recv_, &to_send_}) {
      if (*ep == nullptr) continue;
      // Flush, then close; after a failure requests may still wait for each other: no flush.
      const bool forced = HasFailure();
      const ucs_status_t st =
          closeUcpEndpoint(*ep, forced ? UCP_EP_CLOSE_FLAG_FORCE : 0, [this] { progress(); });
      if (!forced) {
        EXPECT_EQ(UCS_OK, st) << "closing an endpoint";
      }
      *ep = nullptr;
    }
    for (Peer* p : {&send_, &recv_}) closeUcpPeer(p);
  }

  void open(const std::string& device, Peer* peer) {
    openUcpPeer(device,
                {{{"TLS", "gmd_rc,self"}, {"RNDV_THRESH", std::to_string(kRndvThresh)}},
                 UCP_FEATURE_TAG},
                peer);
  }

  ucp_ep_h connect(const Peer& from, const Peer& to) { return connectUcpPeer(from, to); }

  void progress() {
    ucp_worker_progress(send_.worker);
    ucp_worker_progress(recv_.worker);
  }

  Peer recv_, send_;
  ucp_ep_h to_recv_ = nullptr, to_send_ = nullptr;
};

TEST_P(UcpUnexpected, EagerAndRendezvousArriveBeforeTheirReceive) {
  ASSERT_NE(nullptr, to_recv_);
  constexpr std::size_t n = std::size(kSizes);
  constexpr ucp_tag_t kTagBase = 0x6d640000;
  std::vector<std::vector<std::uint8_t>> src(n), dst(n);
  std::vector<Request> sent(n), got(n);
  std::vector<void*> sreq(n, nullptr), rreq(n, nullptr);

  for (std::size_t m = 0; m < n; ++m) {
    src[m].resize(kSizes[m]);
    for (std::size_t i = 0; i < kSizes[m]; ++i) src[m][i] = pattern(m, i);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = sendDone;
    p.user_data = &sent[m];
    void* r = ucp_tag_send_nbx(to_recv_, src[m].data(), kSizes[m], kTagBase + m, &p);
    ASSERT_FALSE(UCS_PTR_IS_ERR(r)) << kSizes[m] << " B: "
                                    << ucs_status_string(UCS_PTR_STATUS(r));
    if (r == nullptr) {
      sent[m].done = true;  // completed in place
    } else {
      sreq[m] = r;
    }
  }

  // Every message must be there, whole length announced, before any receive is posted.
  auto end = std::chrono::steady_clock::now() + kDeadline;
  std::vector<bool> seen(n, false);
  std::size_t nseen = 0;
  while (nseen < n && std::chrono::steady_clock::now() < end) {
    progress();
    for (std::size_t m = 0; m < n; ++m) {
      if (seen[m]) continue;
      ucp_tag_recv_info_t info{};
      if (ucp_tag_probe_nb(recv_.worker, kTagBase + m, ~ucp_tag_t{0}, 0, &info) == nullptr) {
        continue;
      }
      EXPECT_EQ(kSizes[m], info.length) << "probed length of message " << m;
      EXPECT_EQ(kTagBase + m, info.sender_tag);
      seen[m] = true;
      ++nseen;
    }
  }
  for (std::size_t m = 0; m < n; ++m) {
    EXPECT_TRUE(seen[m]) << kSizes[m] << "-byte message never arrived unexpected";
  }
  ASSERT_EQ(n, nseen);
  // Eager messages need nothing from the receiver: their sends finish now (the remaining fragments
  // of the multi-fragment ones land unexpected too). Rendezvous sends wait for the receives.
  end = std::chrono::steady_clock::now() + kDeadline;
  auto eagerDone = [&] {
    for (std::size_t m = 0; m < n; ++m) {
      if (kSizes[m] < kRndvThresh && !sent[m].done) return false;
    }
    return true;
  };
  while (!eagerDone() && std::chrono::steady_clock::now() < end) progress();
  ASSERT_TRUE(eagerDone()) << "eager sends did not complete before their receives were posted";
  for (int i = 0; i < 1000; ++i) progress();
  for (std::size_t m = 0; m < n; ++m) {
    if (kSizes[m] >= kRndvThresh) {
      EXPECT_FALSE(sent[m].done) << kSizes[m] << "-byte rendezvous send done without a receive";
    }
  }

  for (std::size_t k = n; k-- > 0;) {  // the opposite order: matching by tag, not by arrival
    dst[k].assign(kSizes[k] + 64, 0xee);  // room past the end shows an overrun
    ucp_request_param_t p{};
    // A whole eager message that is waiting completes the receive at once: NO_IMM_CMPL still
    // returns a request and reports it through the callback, with the length and tag.
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = recvDone;
    p.user_data = &got[k];
    void* r = ucp_tag_recv_nbx(recv_.worker, dst[k].data(), kSizes[k], kTagBase + k,
                               ~ucp_tag_t{0}, &p);
    ASSERT_FALSE(UCS_PTR_IS_ERR(r)) << ucs_status_string(UCS_PTR_STATUS(r));
    ASSERT_NE(nullptr, r);
    rreq[k] = r;
  }
  end = std::chrono::steady_clock::now() + kDeadline;
  auto allDone = [&] {
    for (std::size_t m = 0; m < n; ++m) {
      if (!sent[m].done || !got[m].done) return false;
    }
    return true;
  };
  while (!allDone() && std::chrono::steady_clock::now() < end) progress();
  for (std::size_t m = 0; m < n; ++m) {
    SCOPED_TRACE(std::to_string(kSizes[m]) + "-byte message");
    EXPECT_TRUE(sent[m].done) << "send not complete";
    ASSERT_TRUE(got[m].done) << "receive not complete";
    EXPECT_EQ(UCS_OK, sent[m].status);
    EXPECT_EQ(UCS_OK, got[m].status);
    EXPECT_EQ(kSizes[m], got[m].length);
    EXPECT_EQ(kTagBase + m, got[m].tag);
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < kSizes[m]; ++i) {
      if (dst[m][i] != src[m][i] && bad++ == 0) first = i;
    }
    EXPECT_EQ(0u, bad) << "wrong bytes, the first at offset " << first;
    for (std::size_t i = kSizes[m]; i < dst[m].size(); ++i) {
      ASSERT_EQ(0xee, dst[m][i]) << "written past the end at " << i;
    }
  }
  for (void* r : sreq) {
    if (r != nullptr) ucp_request_free(r);
  }
  for (void* r : rreq) {
    if (r != nullptr) ucp_request_free(r);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, UcpUnexpected, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

}  // namespace
}  // namespace gmd::test
