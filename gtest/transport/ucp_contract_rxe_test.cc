// UCP over gmd_rc alone (UCX_TLS=gmd_rc,self): what UCP needs of a transport's UCT contract (issue
// #25), seen from UCP.
//
// - ForceClose: an endpoint with peer error handling, closed with UCP_EP_CLOSE_FLAG_FORCE while
//   puts (zero-copy, posted to gmd_rc's QP), eager and rendezvous tag sends are outstanding. Every
//   request completes exactly once (OK when it finished before the close, an error otherwise),
//   the close request completes, and progress afterwards calls nothing more. This rests on
//   uct_ep_destroy calling every outstanding completion once with UCS_ERR_CANCELED (UCP discards
//   the transport endpoint and waits for those completions).
// - AmAlignment: a receiving worker created with UCP_WORKER_PARAM_FIELD_AM_ALIGNMENT hands every
//   eager active message to its handler with `data` on that alignment (UCP passes the alignment
//   and its own header size as am_alignment / am_align_offset to gmd_rc's iface); rendezvous
//   data, which lands in the user's buffer, is received and compared only. With UCX 1.13 this
//   also passed with gmd_rc's alignment switched off in a local build (am_align_ forced to 1):
//   whether UCP realigns the data itself or gmd_rc's segments land aligned by chance was not
//   established, so the case checks what a UCP user gets over gmd_rc, not that gmd_rc aligns.
//
// One process, two UCP contexts, each with its own worker: the receiver on the first RDMA device,
// the sender on the last (CrossDevice) or the same one (SameDevice); "self" cannot reach across
// contexts, so gmd_rc carries everything (as in ucp_unexpected_rxe_test.cc).
//
// Thread safety: none; one test at a time on the test's thread.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
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
constexpr auto kDeadline = std::chrono::seconds(60);

using Peer = UcpPeer;

// One request's callbacks: how often it completed, and the last status.
struct Tracked {
  int calls = 0;
  ucs_status_t status = UCS_OK;
  void* req = nullptr;  // nullptr: completed in place
};

void sendDone(void*, ucs_status_t status, void* user) {
  auto* t = static_cast<Tracked*>(user);
  ++t->calls;
  t->status = status;
}

class UcpContract : public ::testing::TestWithParam<bool> {  // param: sender on another device
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    devs_ = rdmaDeviceNames();
    if (GetParam() && devs_.size() < 2) GTEST_SKIP() << "needs two RDMA devices";
  }

  void TearDown() override {
    for (Peer* p : {&send_, &recv_}) closeUcpPeer(p);
  }

  void openBoth(std::uint64_t features, std::size_t am_alignment = 0) {
    open(devs_.front() + ":1", features, am_alignment, &recv_);
    open((GetParam() ? devs_.back() : devs_.front()) + ":1", features, am_alignment, &send_);
  }

  void open(const std::string& device, std::uint64_t features, std::size_t am_alignment,
            Peer* peer) {
    openUcpPeer(device,
                {{{"TLS", "gmd_rc,self"}, {"RNDV_THRESH", std::to_string(kRndvThresh)}},
                 features,
                 am_alignment},
                peer);
  }

  ucp_ep_h connect(const Peer& from, const Peer& to, bool peer_errors) {
    ucp_err_handler_t on_error{};
    on_error.cb = [](void* arg, ucp_ep_h, ucs_status_t) { ++*static_cast<int*>(arg); };
    on_error.arg = &ep_errors_;
    return connectUcpPeer(from, to, peer_errors ? &on_error : nullptr);
  }

  void progress() {
    ucp_worker_progress(send_.worker);
    ucp_worker_progress(recv_.worker);
  }

  template <typename Done>
  bool progressUntil(Done done) {
    const auto end = std::chrono::steady_clock::now() + kDeadline;
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      progress();
    }
    return true;
  }

  // Closes `ep` (flushing, or forced) and waits for the close. Returns its status.
  ucs_status_t close(ucp_ep_h ep, bool force) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (!UCS_PTR_IS_PTR(req)) return UCS_PTR_STATUS(req);
    progressUntil([&] { return ucp_request_check_status(req) != UCS_INPROGRESS; });
    const ucs_status_t st = ucp_request_check_status(req);
    if (st != UCS_INPROGRESS) ucp_request_free(req);  // else leaked: the worker goes with it
    return st;
  }

  // Receives the eager messages with `kind` in their tag that wait unexpected at the receiver (so
  // that destroying its worker finds none). The rendezvous ones stay: their senders are gone.
  void drainEager(ucp_tag_t kind) {
    std::vector<std::uint8_t> buf;
    ucp_tag_recv_info_t info{};
    while (ucp_tag_message_h msg = ucp_tag_probe_nb(recv_.worker, kind, 0xf00000, 1, &info)) {
      buf.resize(info.length);
      ucp_request_param_t p{};
      void* r = ucp_tag_msg_recv_nbx(recv_.worker, buf.data(), buf.size(), msg, &p);
      ASSERT_FALSE(UCS_PTR_IS_ERR(r)) << ucs_status_string(UCS_PTR_STATUS(r));
      if (r == nullptr) continue;
      ASSERT_TRUE(progressUntil([&] { return ucp_request_check_status(r) != UCS_INPROGRESS; }));
      EXPECT_EQ(UCS_OK, ucp_request_check_status(r));
      ucp_request_free(r);
    }
  }

  std::vector<std::string> devs_;
  Peer recv_, send_;
  int ep_errors_ = 0;
};

INSTANTIATE_TEST_SUITE_P(Devices, UcpContract, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

// Per round: kPuts zero-copy puts of kPutSize into the receiver's mapped memory, kEager eager tag
// sends and kRndv rendezvous tag sends (the receiver posts no receive for them: they wait), then
// zero to four progress calls and a forced close. Three rounds in four first wait until the
// endpoint is wired up, so the puts are on gmd_rc's QP when it closes; the fourth closes it while
// UCP still holds its requests back. The eager messages that arrived are received after each
// round. Asserted: each request's callback exactly once, none still in progress, the rendezvous
// ones never OK, some puts on a wired-up endpoint cut short (failed), the close complete, nothing
// called afterwards, and a new endpoint to the same receiver working.
//
// kRounds: issue #25 asks for 300. In the soft-RoCE VM (TCG, UCX 1.13) 300 rounds took 10-14 s
// per parameter, the whole binary about 31 s. The rendezvous sends stay unexpected at the receiver
// (their senders are gone): UCX warns about each when the receiver's worker is destroyed.
constexpr int kRounds = 300;
constexpr ucp_tag_t kEagerTag = 0x100000, kRndvTag = 0x200000;  // kinds: 0xf00000
constexpr std::size_t kPuts = 16, kPutSize = 256 * 1024;
constexpr std::size_t kEager = 8, kEagerSize = 4000;
constexpr std::size_t kRndv = 4, kRndvSize = 1 << 20;

TEST_P(UcpContract, ForceCloseCompletesEveryOutstandingRequestOnce) {
  openBoth(UCP_FEATURE_TAG | UCP_FEATURE_RMA);
  ASSERT_FALSE(HasFatalFailure());
  // The put target: mapped on the receiver, its rkey packed once and unpacked per endpoint.
  std::vector<std::uint8_t> target(kPuts * kPutSize);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = target.data();
  mp.length = target.size();
  ucp_mem_h memh = nullptr;
  ASSERT_EQ(UCS_OK, ucp_mem_map(recv_.context, &mp, &memh));
  void* rkey_buf = nullptr;
  std::size_t rkey_len = 0;
  ASSERT_EQ(UCS_OK, ucp_rkey_pack(recv_.context, memh, &rkey_buf, &rkey_len));
  std::vector<std::uint8_t> src(kRndvSize > kPuts * kPutSize ? kRndvSize : kPuts * kPutSize, 0x5a);

  const auto start = std::chrono::steady_clock::now();
  std::size_t ok = 0, failed = 0, in_place = 0, puts_cut = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ucp_ep_h ep = connect(send_, recv_, true);
    ASSERT_NE(nullptr, ep);
    // Three rounds in four wait until the endpoint is wired up (a flush), so the puts go straight
    // to gmd_rc's QP; the fourth closes it while UCP still holds everything back.
    const bool wired = round % 4 != 0;
    if (wired) {
      ucp_request_param_t fp{};
      void* f = ucp_ep_flush_nbx(ep, &fp);
      ASSERT_FALSE(UCS_PTR_IS_ERR(f)) << ucs_status_string(UCS_PTR_STATUS(f));
      if (f != nullptr) {
        ASSERT_TRUE(progressUntil([&] { return ucp_request_check_status(f) != UCS_INPROGRESS; }));
        ASSERT_EQ(UCS_OK, ucp_request_check_status(f)) << "flushing the new endpoint";
        ucp_request_free(f);
      }
    }
    ucp_rkey_h rkey = nullptr;
    ASSERT_EQ(UCS_OK, ucp_ep_rkey_unpack(ep, rkey_buf, &rkey));
    std::vector<Tracked> ops(kPuts + kEager + kRndv);
    auto track = [&](std::size_t i, void* r, const char* what) {
      ASSERT_FALSE(UCS_PTR_IS_ERR(r))
          << what << " " << i << ": " << ucs_status_string(UCS_PTR_STATUS(r));
      ops[i].req = r;
      if (r == nullptr) ++in_place;
    };
    std::size_t i = 0;
    for (std::size_t k = 0; k < kPuts; ++k, ++i) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = sendDone;
      p.user_data = &ops[i];
      track(i,
            ucp_put_nbx(ep, src.data() + k * kPutSize, kPutSize,
                        reinterpret_cast<std::uint64_t>(target.data() + k * kPutSize), rkey, &p),
            "put");
    }
    for (std::size_t k = 0; k < kEager + kRndv; ++k, ++i) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = sendDone;
      p.user_data = &ops[i];
      const std::size_t len = k < kEager ? kEagerSize : kRndvSize;
      track(i,
            ucp_tag_send_nbx(ep, src.data(), len, (k < kEager ? kEagerTag : kRndvTag) + round, &p),
            "tag send");
    }
    if (HasFatalFailure()) return;
    // A few progress calls (none to four): some eager sends may finish first, the puts cannot.
    for (int k = 0; k < round % 5; ++k) progress();
    const ucs_status_t closed = close(ep, true);
    EXPECT_TRUE(closed == UCS_OK || closed == UCS_ERR_CANCELED ||
                closed == UCS_ERR_CONNECTION_RESET || closed == UCS_ERR_ENDPOINT_TIMEOUT)
        << "forced close: " << ucs_status_string(closed);
    EXPECT_NE(UCS_INPROGRESS, closed) << "the forced close never completed";
    // Every request is complete now or soon (no receive will ever be posted for them).
    const bool all = progressUntil([&] {
      for (const Tracked& t : ops) {
        if (t.req != nullptr && t.calls == 0) return false;
      }
      return true;
    });
    for (int k = 0; k < 1000; ++k) progress();  // nothing may come after
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const Tracked& t = ops[k];
      if (t.req == nullptr) continue;
      EXPECT_EQ(1, t.calls) << "request " << k << " completed " << t.calls << " times";
      EXPECT_NE(UCS_INPROGRESS, ucp_request_check_status(t.req)) << "request " << k;
      if (t.calls > 0) (t.status == UCS_OK ? ok : failed) += 1;
      if (wired && k < kPuts && t.calls > 0 && t.status != UCS_OK) ++puts_cut;
      if (k >= kPuts + kEager) {  // rendezvous: the receiver never asked for the data
        EXPECT_NE(UCS_OK, t.status) << "rendezvous send " << k << " completed without a receive";
      }
      ucp_request_free(t.req);
    }
    ucp_rkey_destroy(rkey);
    drainEager(kEagerTag);
    ASSERT_TRUE(all) << "requests still in progress after the forced close";
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[ contract ] %d forced closes in %.2f s: %zu requests completed OK, %zu with an error "
      "(%zu puts on a wired-up endpoint), %zu in place; %d endpoint error callbacks\n",
      kRounds, secs, ok, failed, puts_cut, in_place, ep_errors_);
  RecordProperty("force_close_seconds", std::to_string(secs));
  // Something was cut short: at least the rendezvous sends. Puts on wired-up endpoints cut short
  // on gmd_rc's QP (errors from uct_ep_destroy's cancellation) are printed, not asserted: with UCX
  // 1.13 and 1.18 most were (3440-3545 of 3600), with UCX 1.23 on rxe1 -> rxe0 627, on rxe0 -> rxe0
  // none (each completed OK before the close; why was not established).
  EXPECT_GE(failed, static_cast<std::size_t>(kRounds) * kRndv)
      << "fewer errors than rendezvous sends";
  // The receiver is still usable: a new endpoint, a flushed close.
  ucp_ep_h ep = connect(send_, recv_, true);
  ASSERT_NE(nullptr, ep);
  Tracked t;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = sendDone;
  p.user_data = &t;
  std::vector<std::uint8_t> dst(64, 0);
  void* rr = ucp_tag_recv_nbx(recv_.worker, dst.data(), dst.size(), 0x7777, ~ucp_tag_t{0}, &p);
  ASSERT_FALSE(UCS_PTR_IS_ERR(rr));
  Tracked s;
  p.user_data = &s;
  s.req = ucp_tag_send_nbx(ep, src.data(), 64, 0x7777, &p);
  ASSERT_FALSE(UCS_PTR_IS_ERR(s.req));
  EXPECT_TRUE(progressUntil([&] { return ucp_request_check_status(rr) != UCS_INPROGRESS; }));
  EXPECT_EQ(UCS_OK, ucp_request_check_status(rr));
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), 64));
  if (rr != nullptr) ucp_request_free(rr);
  if (s.req != nullptr) {
    progressUntil([&] { return s.calls > 0; });
    ucp_request_free(s.req);
  }
  EXPECT_EQ(UCS_OK, close(ep, false));
  ucp_rkey_buffer_release(rkey_buf);
  EXPECT_EQ(UCS_OK, ucp_mem_unmap(recv_.context, memh));
}

// --- Active-message alignment

struct AmSeen {
  std::size_t align = 0;
  std::size_t messages = 0, eager = 0, misaligned = 0, rndv = 0, bad_bytes = 0;
  std::string first_misaligned;
  ucp_worker_h worker = nullptr;
  std::vector<std::vector<std::uint8_t>> rndv_bufs;
  std::vector<void*> rndv_reqs;
};

std::uint8_t pattern(std::size_t len, std::size_t i) {
  return static_cast<std::uint8_t>((i * 7 + len) & 0xff);
}

ucs_status_t onAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                  const ucp_am_recv_param_t* param) {
  auto* s = static_cast<AmSeen*>(arg);
  ++s->messages;
  std::uint64_t sent_len = 0;
  if (header_length == sizeof(sent_len)) std::memcpy(&sent_len, header, sizeof(sent_len));
  if (sent_len != length) ++s->bad_bytes;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ++s->rndv;
    s->rndv_bufs.emplace_back(length);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* r = ucp_am_recv_data_nbx(s->worker, data, s->rndv_bufs.back().data(), length, &p);
    s->rndv_reqs.push_back(r);
    return UCS_OK;
  }
  ++s->eager;
  if (reinterpret_cast<std::uintptr_t>(data) % s->align != 0 && length > 0) {
    if (s->misaligned++ == 0) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%zu-byte message at %p (flags 0x%lx)", length, data,
                    static_cast<unsigned long>(param->recv_attr));
      s->first_misaligned = buf;
    }
  }
  const auto* d = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < length; ++i) {
    if (d[i] != pattern(length, i)) {
      ++s->bad_bytes;
      break;
    }
  }
  return UCS_OK;
}

class UcpAmAlignment : public UcpContract {};

INSTANTIATE_TEST_SUITE_P(Devices, UcpAmAlignment, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(UcpAmAlignment, EagerDataIsOnTheWorkersAlignment) {
  // Sizes: short (a few bytes), one bounce-copied fragment, a full one, several fragments (UCP
  // reassembles them), rendezvous.
  const std::size_t sizes[] = {1, 8, 40, 100, 1000, 4000, 8000, 12000, 70000};
  for (std::size_t align : {4u, 64u, 4096u}) {
    SCOPED_TRACE("am_alignment " + std::to_string(align));
    openBoth(UCP_FEATURE_AM, align);
    ASSERT_FALSE(HasFatalFailure());
    AmSeen seen;
    seen.align = align;
    seen.worker = recv_.worker;
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.id = 3;
    hp.cb = onAm;
    hp.arg = &seen;
    ASSERT_EQ(UCS_OK, ucp_worker_set_am_recv_handler(recv_.worker, &hp));
    ucp_ep_h ep = connect(send_, recv_, false);
    ASSERT_NE(nullptr, ep);
    std::vector<std::vector<std::uint8_t>> bufs;
    std::vector<std::uint64_t> lens;
    std::vector<Tracked> ops(std::size(sizes) * 2);
    lens.reserve(ops.size());
    std::size_t n = 0, eager_expected = 0;
    for (int rep = 0; rep < 2; ++rep) {
      for (std::size_t len : sizes) {
        bufs.emplace_back(len);
        for (std::size_t i = 0; i < len; ++i) bufs.back()[i] = pattern(len, i);
        lens.push_back(len);
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = sendDone;
        p.user_data = &ops[n];
        void* r = ucp_am_send_nbx(ep, hp.id, &lens.back(), sizeof(std::uint64_t),
                                  bufs.back().data(), len, &p);
        ASSERT_FALSE(UCS_PTR_IS_ERR(r)) << len << " B: " << ucs_status_string(UCS_PTR_STATUS(r));
        ops[n++].req = r;
        eager_expected += len < kRndvThresh;
      }
    }
    EXPECT_TRUE(progressUntil([&] {
      for (void* r : seen.rndv_reqs) {
        if (r != nullptr && ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      }
      for (const Tracked& t : ops) {
        if (t.req != nullptr && t.calls == 0) return false;
      }
      return seen.messages == n;
    })) << seen.messages
        << " of " << n << " messages arrived";
    for (const Tracked& t : ops) {
      if (t.req == nullptr) continue;
      EXPECT_EQ(UCS_OK, t.status);
      ucp_request_free(t.req);
    }
    for (void* r : seen.rndv_reqs) {
      if (UCS_PTR_IS_PTR(r)) {
        EXPECT_EQ(UCS_OK, ucp_request_check_status(r));
        ucp_request_free(r);
      }
    }
    for (const auto& b : seen.rndv_bufs) {
      for (std::size_t i = 0; i < b.size(); ++i) {
        if (b[i] != pattern(b.size(), i)) {
          ++seen.bad_bytes;
          break;
        }
      }
    }
    std::printf(
        "[ am_align ] alignment %zu: %zu messages, %zu eager (%zu misaligned), %zu "
        "rendezvous\n",
        align, seen.messages, seen.eager, seen.misaligned, seen.rndv);
    EXPECT_EQ(eager_expected, seen.eager);
    EXPECT_EQ(0u, seen.misaligned) << "eager data not on a " << align
                                   << "-byte boundary; the first: " << seen.first_misaligned;
    EXPECT_EQ(0u, seen.bad_bytes) << "wrong bytes or lengths";
    EXPECT_EQ(UCS_OK, close(ep, false));
    TearDown();  // the next alignment needs new workers
  }
}

}  // namespace
}  // namespace gmd::test
