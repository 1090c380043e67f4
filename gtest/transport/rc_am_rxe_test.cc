// gmd_rc's active messages through the public UCT API on real RDMA devices (soft-RoCE in the VM),
// rxe1 → rxe0 and rxe0 → rxe0: every flavour at sizes from 0 B to its maximum with every byte
// checked, more messages than the receive queue holds, credits, descriptors kept by a handler and
// released later, pending requests going before later operations, three senders to one receiver,
// both directions of a connection, the event fd (woken by a message and by a send completion, BUSY
// when something is already there) and bad input.
#include <gtest/gtest.h>
#include <poll.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "gtest/transport/rc_fixture.h"

namespace gmd::test {
namespace {

constexpr std::uint8_t kAmId = 7;
constexpr std::uint32_t kSync = 0;  // a synchronous handler: no UCT_CB_FLAG_ASYNC

// What a handler saw: the message bytes (copied unless kept).
struct Received {
  std::vector<std::vector<std::uint8_t>> messages;
  std::vector<void*> kept;   // data pointers of descriptors kept (UCS_INPROGRESS)
  std::size_t keep = 0;      // keep this many more descriptors
  unsigned flags_seen = ~0u;  // AND of the flags of every call
};

ucs_status_t recordHandler(void* arg, void* data, size_t length, unsigned flags) {
  auto* r = static_cast<Received*>(arg);
  const auto* p = static_cast<const std::uint8_t*>(data);
  r->messages.emplace_back(p, p + length);
  r->flags_seen &= flags;
  if (r->keep > 0 && (flags & UCT_CB_PARAM_FLAG_DESC)) {
    --r->keep;
    r->kept.push_back(data);
    return UCS_INPROGRESS;
  }
  return UCS_OK;
}

struct PackArg {
  std::uint64_t seed;
  std::size_t length;
};

size_t packPattern(void* dest, void* arg) {
  const auto* a = static_cast<const PackArg*>(arg);
  fillPattern(dest, a->length, a->seed);
  return a->length;
}

class GmdRcAm : public GmdRc {
 protected:
  void SetUp() override {
    rx_headroom_ = 24;  // as UCP asks for some: handlers may write there
    GmdRc::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    ASSERT_NE(nullptr, ep_);
    setHandler(target_, &rx_);
  }

  void setHandler(const Side& s, Received* r, std::uint8_t id = kAmId) {
    ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(s.iface, id, recordHandler, r, kSync));
  }

  // Retries `send` (returning a status) while the transport has no resources.
  ucs_status_t retry(const std::function<ucs_status_t()>& send) {
    ucs_status_t st = UCS_ERR_NO_RESOURCE;
    progressUntil([&] {
      st = send();
      return st != UCS_ERR_NO_RESOURCE;
    });
    return st;
  }

  bool receivedAtLeast(const Received& r, std::size_t n) {
    return progressUntil([&] { return r.messages.size() >= n; });
  }

  // One am_bcopy of `length` pattern bytes from `seed`; the length packed or an error.
  ssize_t bcopy(uct_ep_h ep, std::uint64_t seed, std::size_t length, std::uint8_t id = kAmId) {
    PackArg a{seed, length};
    ssize_t r = UCS_ERR_NO_RESOURCE;
    progressUntil([&] {
      r = uct_ep_am_bcopy(ep, id, packPattern, &a, 0);
      return r != UCS_ERR_NO_RESOURCE;
    });
    return r;
  }

  Received rx_;
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcAm, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcAm, AttributesAreHonest) {
  const auto& am = attr_.cap.am;
  EXPECT_GE(am.max_short, 8u) << "am_short must carry at least its header";
  EXPECT_GE(am.max_bcopy, 64u) << "UCP needs an AM lane of at least 64 bytes";
  EXPECT_GT(am.max_zcopy, 0u);
  EXPECT_GT(am.max_hdr, 0u);
  EXPECT_LE(am.max_hdr + am.max_zcopy, am.max_bcopy) << "header and payload share one buffer";
  EXPECT_GE(am.max_iov, 1u);
  const std::uint64_t events = UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV |
                               UCT_IFACE_FLAG_EVENT_FD;
  EXPECT_EQ(events, attr_.cap.event_flags & events);
  int fd = -1;
  EXPECT_EQ(UCS_OK, uct_iface_event_fd_get(target_.iface, &fd));
  EXPECT_GE(fd, 0);
}

// Every flavour, every size class from 0 B to its maximum, every byte checked at the receiver. The
// handler gets UCT_CB_PARAM_FLAG_DESC and writable rx headroom.
TEST_P(GmdRcAm, EveryFlavourMovesEveryByteAtEverySize) {
  const auto& am = attr_.cap.am;
  struct Expect {
    std::uint64_t seed;
    std::size_t length;
    std::uint64_t header;  // am_short: the 8-byte header that precedes the payload
    bool has_header;
  };
  std::vector<Expect> expect;

  // am_short: 0 .. max_short - 8 payload bytes after the 8-byte header (max_short counts it).
  std::vector<std::uint8_t> buf(std::max<std::size_t>(am.max_short, 1));
  for (std::size_t len = 0; len + 8 <= am.max_short; ++len) {
    const std::uint64_t seed = 1000 + len;
    fillPattern(buf.data(), len, seed);
    ASSERT_EQ(UCS_OK, retry([&] {
      return uct_ep_am_short(ep_, kAmId, seed, buf.data(), static_cast<unsigned>(len));
    })) << "am_short " << len;
    expect.push_back({seed, len, seed, true});
  }
  // am_short_iov: the payload in up to max_iov pieces.
  for (std::size_t len : {std::size_t{0}, std::size_t{5}, am.max_short}) {
    const std::uint64_t seed = 3000 + len;
    std::vector<std::uint8_t> whole(len);
    fillPattern(whole.data(), len, seed);
    std::vector<uct_iov_t> iov;
    const std::size_t pieces = std::min<std::size_t>(am.max_iov, 3);
    for (std::size_t i = 0, off = 0; i < pieces; ++i) {
      const std::size_t n = i + 1 == pieces ? len - off : len / pieces;
      iov.push_back({whole.data() + off, n, nullptr, 0, 1});
      off += n;
    }
    ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short_iov(ep_, kAmId, iov.data(), iov.size()); }))
        << "am_short_iov " << len;
    expect.push_back({seed, len, 0, false});
  }
  // am_bcopy.
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{63},
                          std::size_t{64}, std::size_t{65}, std::size_t{1000}, std::size_t{4095},
                          std::size_t{4096}, std::size_t{4097}, am.max_bcopy - 1, am.max_bcopy}) {
    const std::uint64_t seed = 5000 + len;
    ASSERT_EQ(static_cast<ssize_t>(len), bcopy(ep_, seed, len)) << "am_bcopy " << len;
    expect.push_back({seed, len, 0, false});
  }
  // am_zcopy: header and payload, the payload in one or several registered pieces.
  Mapping payload(am.max_zcopy + kPage);
  uct_mem_h memh = reg(init_.md, payload.addr, payload.length);
  std::vector<std::uint8_t> header(am.max_hdr);
  std::deque<Comp> comps;
  for (std::size_t hlen : {std::size_t{0}, std::size_t{1}, am.max_hdr}) {
    for (std::size_t plen : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, am.max_zcopy}) {
      for (std::size_t pieces : {std::size_t{1}, std::min<std::size_t>(am.max_iov, 3)}) {
        const std::uint64_t seed = 7000 + hlen * 100000 + plen * 10 + pieces;
        std::vector<std::uint8_t> whole(hlen + plen);
        fillPattern(whole.data(), whole.size(), seed);
        std::memcpy(header.data(), whole.data(), hlen);
        std::memcpy(payload.addr, whole.data() + hlen, plen);
        std::vector<uct_iov_t> iov;
        for (std::size_t i = 0, off = 0; i < pieces; ++i) {
          const std::size_t n = i + 1 == pieces ? plen - off : plen / pieces;
          iov.push_back({payload.addr + off, n, memh, 0, 1});
          off += n;
        }
        Comp& c = comps.emplace_back();
        const ucs_status_t st = retry([&] {
          return uct_ep_am_zcopy(ep_, kAmId, header.data(), static_cast<unsigned>(hlen),
                                 iov.data(), iov.size(), 0, &c.c);
        });
        ASSERT_TRUE(st == UCS_OK || st == UCS_INPROGRESS) << ucs_status_string(st);
        // The payload buffer is reused by the next message: wait for this one to leave.
        if (st == UCS_INPROGRESS) {
          ASSERT_TRUE(progressUntil([&] { return c.calls > 0; }));
          EXPECT_EQ(UCS_OK, c.last);
        }
        expect.push_back({seed, hlen + plen, 0, false});
      }
    }
  }

  ASSERT_TRUE(receivedAtLeast(rx_, expect.size()))
      << rx_.messages.size() << " of " << expect.size() << " messages arrived";
  EXPECT_EQ(expect.size(), rx_.messages.size());
  EXPECT_TRUE(rx_.flags_seen & UCT_CB_PARAM_FLAG_DESC);
  for (std::size_t i = 0; i < expect.size() && i < rx_.messages.size(); ++i) {
    const auto& m = rx_.messages[i];
    const Expect& e = expect[i];
    SCOPED_TRACE("message " + std::to_string(i) + ", seed " + std::to_string(e.seed));
    if (e.has_header) {
      ASSERT_EQ(e.length + 8, m.size());
      std::uint64_t h = 0;
      std::memcpy(&h, m.data(), 8);
      EXPECT_EQ(e.header, h);
      EXPECT_EQ(e.length, checkPattern(m.data() + 8, e.length, e.seed));
    } else {
      ASSERT_EQ(e.length, m.size());
      EXPECT_EQ(e.length, checkPattern(m.data(), e.length, e.seed));
    }
  }
  uct_md_mem_dereg(init_.md, memh);
}

// A handler may write all of the rx headroom before the data (as UCP puts its descriptor there)
// and keep the message: the data stays intact and uct_iface_release_desc still finds its way back.
TEST_P(GmdRcAm, HeadroomIsWritableAndKeptMessagesRelease) {
  struct Scribble {
    std::size_t headroom;
    std::vector<void*> kept;
  } s{rx_headroom_, {}};
  ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(
                        target_.iface, kAmId + 1,
                        [](void* arg, void* data, size_t length, unsigned flags) -> ucs_status_t {
                          auto* me = static_cast<Scribble*>(arg);
                          std::memset(static_cast<std::uint8_t*>(data) - me->headroom, 0xab,
                                      me->headroom);
                          if (length != 100 || !(flags & UCT_CB_PARAM_FLAG_DESC)) return UCS_OK;
                          me->kept.push_back(data);
                          return UCS_INPROGRESS;
                        },
                        &s, kSync));
  constexpr int kMessages = 300;
  for (int i = 0; i < kMessages; ++i) ASSERT_EQ(100, bcopy(ep_, i, 100, kAmId + 1));
  ASSERT_TRUE(progressUntil([&] { return s.kept.size() == kMessages; })) << s.kept.size();
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(100u, checkPattern(s.kept[i], 100, i)) << "message " << i;
    uct_iface_release_desc(static_cast<std::uint8_t*>(s.kept[i]) - rx_headroom_);
  }
  ASSERT_EQ(64, bcopy(ep_, 1, 64));
  ASSERT_TRUE(receivedAtLeast(rx_, 1));
  EXPECT_EQ(64u, checkPattern(rx_.messages[0].data(), 64, 1));
}

// A small receive queue and window: thousands of messages, none lost, in order. Without progress
// a sender can send exactly its window, then must wait for credits.
class GmdRcAmSmallQueue : public GmdRcAm {
 protected:
  void SetUp() override {
    iface_config_ = {{"RX_QUEUE_LEN", "64"}, {"FC_WND_SIZE", "32"}};
    GmdRcAm::SetUp();
  }
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcAmSmallQueue, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcAmSmallQueue, CreditsBoundTheSenderAndNothingIsLost) {
  // Connect first (the first send waits for the handshake).
  ASSERT_EQ(8, bcopy(ep_, 0, 8));
  ASSERT_TRUE(receivedAtLeast(rx_, 1));
  ASSERT_TRUE(progressUntil([&] { return uct_iface_flush(init_.iface, 0, nullptr) == UCS_OK; }));
  // Let the grant for that message come back if one was asked for (it was not: 31 credits left).
  for (int i = 0; i < 100; ++i) uct_worker_progress(worker_);
  PackArg a{1, 16};
  int sent = 0;
  while (uct_ep_am_bcopy(ep_, kAmId, packPattern, &a, 0) == 16) ++sent;
  EXPECT_EQ(31, sent) << "a sender without progress must stop exactly at its window";

  constexpr int kMessages = 2000;  // ~30 times the receive queue
  for (int i = sent; i < kMessages; ++i) {
    ASSERT_EQ(16, bcopy(ep_, 1, 16)) << "message " << i;
  }
  ASSERT_TRUE(receivedAtLeast(rx_, kMessages + 1)) << rx_.messages.size() << " arrived";
  EXPECT_EQ(static_cast<std::size_t>(kMessages + 1), rx_.messages.size());
  for (std::size_t i = 1; i < rx_.messages.size(); ++i) {
    ASSERT_EQ(16u, rx_.messages[i].size());
    ASSERT_EQ(16u, checkPattern(rx_.messages[i].data(), 16, 1)) << "message " << i;
  }
}

// Endpoints connected and destroyed again and again with messages in flight: the receiver moves
// each passive QP to the error state and destroys it after IBV_EVENT_QP_LAST_WQE_REACHED, and no
// receive buffer goes missing on the way. 60 cycles of up to 20 messages of 2 KiB each; a loss of
// more than one buffer per cycle would exhaust the 80 receive buffers (a queue of 64) and stall the
// 1000 messages sent afterwards.
TEST_P(GmdRcAmSmallQueue, ConnectDisconnectCyclesLoseNoReceiveBuffer) {
  for (int c = 0; c < 60; ++c) {
    uct_ep_h ep = connect(init_, target_);
    ASSERT_NE(nullptr, ep) << "cycle " << c;
    const int n = 1 + c % 20;
    for (int i = 0; i < n; ++i) ASSERT_EQ(2048, bcopy(ep, c, 2048)) << "cycle " << c;
    uct_ep_destroy(ep);  // messages still in flight
    for (int i = 0; i < c % 7; ++i) uct_worker_progress(worker_);
  }
  Received after;
  setHandler(target_, &after, kAmId + 2);
  constexpr int kMessages = 1000;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(100, bcopy(ep_, 1000 + i, 100, kAmId + 2)) << "message " << i;
  }
  ASSERT_TRUE(receivedAtLeast(after, kMessages)) << after.messages.size() << " arrived";
  EXPECT_EQ(static_cast<std::size_t>(kMessages), after.messages.size());
  for (std::size_t i = 0; i < after.messages.size(); ++i) {
    ASSERT_EQ(100u, checkPattern(after.messages[i].data(), 100, 1000 + i)) << "message " << i;
  }
  // Whatever of the cycles' messages arrived is intact.
  for (const auto& m : rx_.messages) ASSERT_EQ(2048u, m.size());
}

// The drain messages gmd_rc logs for passive QPs (md/rc/rc_recv.cc), counted by a UCX log handler.
int g_drained = 0, g_drain_timeouts = 0;
ucs_log_func_rc_t countDrains(const char*, unsigned, const char*, ucs_log_level_t,
                              const ucs_log_component_config_t*, const char* fmt, va_list) {
  const std::string f = fmt;
  if (f.find("drained (last WQE reached)") != std::string::npos) ++g_drained;
  if (f.find("without its last-WQE event") != std::string::npos) ++g_drain_timeouts;
  return UCS_LOG_FUNC_RC_CONTINUE;
}

// Two ifaces on one MD share the device context's async event queue (md/device_events.h): every
// passive QP of both is destroyed exactly once after its endpoint goes — on its LAST_WQE_REACHED,
// whichever iface read it, or after the drain timeout where the device never raises the event (rxe
// up to at least Linux 6.1 does not).
TEST_P(GmdRcAm, PassiveQpsOfIfacesSharingAnMdAreEachDestroyedOnce) {
  const auto devs = rdmaDeviceNames();
  Side& second = extra_sides_.emplace_back();
  second.md = target_.md;  // shares target_'s MD
  openSide(devs[0], &second);
  if (HasFatalFailure()) return;
  Received rx2;
  setHandler(second, &rx2);
  constexpr int kEach = 4;
  std::vector<uct_ep_h> eps;
  for (int i = 0; i < kEach; ++i) {
    for (const Side* to : {&target_, &second}) {
      eps.push_back(connect(init_, *to));
      ASSERT_NE(nullptr, eps.back());
    }
  }
  // One message on each: its passive QP exists and is connected.
  for (std::size_t i = 0; i < eps.size(); ++i) {
    ASSERT_EQ(64, bcopy(eps[i], i, 64))
        << "endpoint " << i;
  }
  ASSERT_TRUE(receivedAtLeast(rx_, kEach));
  ASSERT_TRUE(receivedAtLeast(rx2, kEach));
  for (uct_ep_h ep : eps) flushEp(ep);
  g_drained = g_drain_timeouts = 0;
  const ucs_log_level_t saved = ucs_global_opts.log_component.log_level;
  ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
  ucs_log_push_handler(countDrains);
  for (uct_ep_h ep : eps) uct_ep_destroy(ep);
  const int n = static_cast<int>(eps.size());
  const bool ended = progressUntil([&] { return g_drained + g_drain_timeouts >= n; }, 30);
  // Nothing more comes (no QP destroyed twice).
  progressUntil([] { return false; }, 0.5);
  ucs_log_pop_handler();
  ucs_global_opts.log_component.log_level = saved;
  EXPECT_TRUE(ended) << g_drained << " drained, " << g_drain_timeouts << " timed out of " << n;
  EXPECT_EQ(n, g_drained + g_drain_timeouts)
      << g_drained << " drained on their event, " << g_drain_timeouts << " after the timeout";
}

// Descriptors kept by the handler (UCS_INPROGRESS) stay intact while more messages than the
// receive queue holds pass, and go back to the pool on uct_iface_release_desc: two rounds of 50 kept
// descriptors fit only if the first round came back (80 buffers for a queue of 64).
TEST_P(GmdRcAmSmallQueue, KeptDescriptorsAreReleasedLater) {
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    rx_.messages.clear();
    rx_.keep = 50;
    const std::uint64_t base = 100 * (round + 1);
    for (int i = 0; i < 50; ++i) ASSERT_EQ(200, bcopy(ep_, base + i, 200));
    ASSERT_TRUE(receivedAtLeast(rx_, 50));
    ASSERT_EQ(50u, rx_.kept.size());
    // More traffic than the queue holds while the 50 are out.
    for (int i = 0; i < 300; ++i) ASSERT_EQ(300, bcopy(ep_, 9, 300));
    ASSERT_TRUE(receivedAtLeast(rx_, 350));
    for (int i = 0; i < 50; ++i) {
      EXPECT_EQ(200u, checkPattern(rx_.kept[i], 200, base + i)) << "kept descriptor " << i;
      uct_iface_release_desc(static_cast<std::uint8_t*>(rx_.kept[i]) - rx_headroom_);
    }
    rx_.kept.clear();
  }
}

// A request in the pending queue goes before anything sent later, as UCP expects when it queues
// one fragment of a long message after another (protocols v2): once the window is used up a
// pending request sends 40 numbered messages, one per call (UCS_INPROGRESS until the last), while
// the test tries a message of its own after every progress call. That one must be refused
// (UCS_ERR_NO_RESOURCE) as long as the request is queued, and arrive after all 40. Before the fix
// it went out between two of them as soon as a credit grant came back.
TEST_P(GmdRcAmSmallQueue, PendingRequestsGoBeforeLaterOperations) {
  ASSERT_EQ(8, bcopy(ep_, 0, 8));  // connected
  ASSERT_TRUE(receivedAtLeast(rx_, 1));
  ASSERT_TRUE(progressUntil([&] { return uct_iface_flush(init_.iface, 0, nullptr) == UCS_OK; }));
  for (int i = 0; i < 100; ++i) uct_worker_progress(worker_);
  rx_.messages.clear();
  std::uint64_t seq = 0;
  while (uct_ep_am_short(ep_, kAmId, seq, nullptr, 0) == UCS_OK) ++seq;  // the window
  ASSERT_GT(seq, 0u);
  constexpr std::uint64_t kQueued = 40, kLater = 1000;
  struct Req {
    uct_pending_req_t req;  // first
    uct_ep_h ep;
    std::uint64_t next, end;
  } r{{}, ep_, seq, seq + kQueued};
  r.req.func = [](uct_pending_req_t* self) -> ucs_status_t {
    auto* me = reinterpret_cast<Req*>(self);
    const ucs_status_t st = uct_ep_am_short(me->ep, kAmId, me->next, nullptr, 0);
    if (st != UCS_OK) return st;
    return ++me->next == me->end ? UCS_OK : UCS_INPROGRESS;
  };
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep_, &r.req, 0));
  int refused = 0, overtook = 0;
  ASSERT_TRUE(progressUntil([&] {
    const bool queued = r.next < r.end;
    const ucs_status_t st = uct_ep_am_short(ep_, kAmId, kLater, nullptr, 0);
    if (st == UCS_ERR_NO_RESOURCE) {
      ++refused;
      return false;
    }
    EXPECT_EQ(UCS_OK, st);
    if (queued) ++overtook;
    return true;
  })) << "the pending request sent " << r.next - seq << " of " << kQueued;
  EXPECT_EQ(0, overtook) << "a later message went out while the pending request was queued";
  EXPECT_GT(refused, 0);
  EXPECT_EQ(r.end, r.next);
  ASSERT_TRUE(receivedAtLeast(rx_, seq + kQueued + 1));
  ASSERT_EQ(seq + kQueued + 1, rx_.messages.size());
  for (std::size_t i = 0; i < rx_.messages.size(); ++i) {
    std::uint64_t got = 0;
    ASSERT_EQ(sizeof(got), rx_.messages[i].size());
    std::memcpy(&got, rx_.messages[i].data(), sizeof(got));
    EXPECT_EQ(i < seq + kQueued ? i : kLater, got) << "message " << i << " out of order";
  }
}

// UCP queues an endpoint flush that found no resources as a pending request whose callback calls
// uct_ep_flush again. Dispatched, that request is the head of the queue: the flush must go on, not
// be refused as "behind the queue" (it was, and nothing ever called the request again: the flush
// and everything queued after it hung).
TEST_P(GmdRcAmSmallQueue, FlushQueuedAsPendingRequestCompletes) {
  ASSERT_EQ(8, bcopy(ep_, 0, 8));  // connected
  ASSERT_TRUE(receivedAtLeast(rx_, 1));
  ASSERT_TRUE(progressUntil([&] { return uct_iface_flush(init_.iface, 0, nullptr) == UCS_OK; }));
  std::uint64_t seq = 0;
  while (uct_ep_am_short(ep_, kAmId, seq, nullptr, 0) == UCS_OK) ++seq;  // the window
  ASSERT_GT(seq, 0u);
  struct Req {
    uct_pending_req_t req;  // first
    uct_ep_h ep;
    Comp comp;
    int calls = 0;
    bool done = false;  // the flush completed at once or was accepted with its completion
  };
  auto flushReq = [](uct_pending_req_t* self) -> ucs_status_t {
    auto* me = reinterpret_cast<Req*>(self);
    ++me->calls;
    const ucs_status_t st = uct_ep_flush(me->ep, 0, &me->comp.c);
    if (st == UCS_ERR_NO_RESOURCE) return st;
    EXPECT_TRUE(st == UCS_OK || st == UCS_INPROGRESS) << ucs_status_string(st);
    if (st == UCS_OK) ++me->comp.calls;
    me->done = true;
    return UCS_OK;
  };
  Req flush;
  flush.req.func = flushReq;
  flush.ep = ep_;
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep_, &flush.req, 0));
  // A second request behind it: the queue goes on after the flush.
  struct Send {
    uct_pending_req_t req;  // first
    uct_ep_h ep;
    bool sent = false;
  } after{{}, ep_};
  after.req.func = [](uct_pending_req_t* self) -> ucs_status_t {
    auto* me = reinterpret_cast<Send*>(self);
    const ucs_status_t st = uct_ep_am_short(me->ep, kAmId, 999, nullptr, 0);
    if (st == UCS_OK) me->sent = true;
    return st;
  };
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep_, &after.req, 0));
  EXPECT_TRUE(progressUntil([&] { return flush.comp.calls > 0 && after.sent; }, 20))
      << "flush request called " << flush.calls << " times, accepted " << flush.done
      << ", completed " << flush.comp.calls << "; the request behind it sent " << after.sent;
  EXPECT_EQ(1, flush.comp.calls);
  EXPECT_EQ(UCS_OK, flush.comp.last);
  ASSERT_TRUE(receivedAtLeast(rx_, seq + 2));
}

// Three senders (three ifaces) to one receiver: no loss, no stall, each sender's messages in order.
TEST_P(GmdRcAmSmallQueue, ThreeSendersOneReceiverLoseNothing) {
  constexpr int kSenders = 3, kEach = 700;
  const auto devs = rdmaDeviceNames();
  std::vector<uct_ep_h> eps;
  for (int s = 0; s < kSenders; ++s) {
    Side& side = extra_sides_.emplace_back();
    openSide(GetParam() ? devs[1] : devs[0], &side);
    if (HasFatalFailure()) return;
    eps.push_back(connect(side, target_));
    extra_eps_.push_back(eps.back());
  }
  struct Tagged {
    std::uint32_t sender, seq;
  };
  std::vector<int> next(kSenders, 0);
  int done = 0;
  ASSERT_TRUE(progressUntil([&] {
    for (int s = 0; s < kSenders; ++s) {
      while (next[s] < kEach) {
        Tagged t{static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(next[s])};
        const ucs_status_t st = uct_ep_am_short(eps[s], kAmId, 0, &t, sizeof(t));
        if (st == UCS_ERR_NO_RESOURCE) break;
        EXPECT_EQ(UCS_OK, st);
        if (++next[s] == kEach) ++done;
      }
    }
    return done == kSenders;
  })) << "senders stalled at " << next[0] << "/" << next[1] << "/" << next[2];
  ASSERT_TRUE(receivedAtLeast(rx_, kSenders * kEach)) << rx_.messages.size() << " arrived";
  EXPECT_EQ(static_cast<std::size_t>(kSenders * kEach), rx_.messages.size());
  std::vector<std::uint32_t> expect(kSenders, 0);
  for (const auto& m : rx_.messages) {
    ASSERT_EQ(8 + sizeof(Tagged), m.size());
    Tagged t;
    std::memcpy(&t, m.data() + 8, sizeof(t));
    ASSERT_LT(t.sender, static_cast<std::uint32_t>(kSenders));
    ASSERT_EQ(expect[t.sender], t.seq) << "sender " << t.sender << " lost or reordered";
    ++expect[t.sender];
  }
}

// Both directions: the receiver answers every message over its own endpoint back, with a window of
// 4 so that grants flow all the time on both connections.
class GmdRcAmTinyWindow : public GmdRcAm {
 protected:
  void SetUp() override {
    iface_config_ = {{"FC_WND_SIZE", "4"}};
    GmdRcAm::SetUp();
  }
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcAmTinyWindow, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcAmTinyWindow, PingPongBothDirections) {
  uct_ep_h back = connect(target_, init_);
  ASSERT_NE(nullptr, back);
  extra_eps_.push_back(back);
  Received pongs;
  setHandler(init_, &pongs);
  constexpr int kRounds = 300;
  for (int i = 0; i < kRounds; ++i) {
    const std::uint64_t v = static_cast<std::uint64_t>(i);
    ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(ep_, kAmId, v, nullptr, 0); }));
    ASSERT_TRUE(receivedAtLeast(rx_, static_cast<std::size_t>(i) + 1)) << "ping " << i;
    ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(back, kAmId, v + 1, nullptr, 0); }));
    ASSERT_TRUE(receivedAtLeast(pongs, static_cast<std::size_t>(i) + 1)) << "pong " << i;
    std::uint64_t got = 0;
    std::memcpy(&got, pongs.messages.back().data(), 8);
    ASSERT_EQ(v + 1, got);
  }
}

// Event-driven progress: arm, sleep in poll() on the event fd, be woken by an arriving message and
// by a send completion; arm says BUSY while a completion waits unhandled.
TEST_P(GmdRcAm, EventFdWakesOnMessageAndSendCompletion) {
  ASSERT_EQ(8, bcopy(ep_, 0, 8));  // connected
  ASSERT_TRUE(receivedAtLeast(rx_, 1));
  ASSERT_TRUE(progressUntil([&] { return uct_iface_flush(init_.iface, 0, nullptr) == UCS_OK; }));
  int rfd = -1, sfd = -1;
  ASSERT_EQ(UCS_OK, uct_iface_event_fd_get(target_.iface, &rfd));
  ASSERT_EQ(UCS_OK, uct_iface_event_fd_get(init_.iface, &sfd));
  auto armed = [&](uct_iface_h iface, unsigned events) {
    ucs_status_t st = UCS_ERR_BUSY;
    progressUntil([&] {
      st = uct_iface_event_arm(iface, events);
      return st != UCS_ERR_BUSY;
    });
    return st;
  };
  auto sleepOn = [](int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 60000) == 1 && (p.revents & POLLIN);
  };

  // A message wakes the receiver.
  ASSERT_EQ(UCS_OK, armed(target_.iface, UCT_EVENT_RECV));
  pollfd quiet{rfd, POLLIN, 0};
  EXPECT_EQ(0, poll(&quiet, 1, 0)) << "event fd readable with nothing sent";
  ASSERT_EQ(UCS_OK, uct_ep_am_short(ep_, kAmId, 42, nullptr, 0));
  EXPECT_TRUE(sleepOn(rfd)) << "not woken by a message";
  EXPECT_EQ(UCS_ERR_BUSY, uct_iface_event_arm(target_.iface, UCT_EVENT_RECV))
      << "a message waits unhandled: arm must say BUSY";
  ASSERT_TRUE(receivedAtLeast(rx_, 2));
  std::uint64_t h = 0;
  std::memcpy(&h, rx_.messages[1].data(), 8);
  EXPECT_EQ(42u, h);

  // A message sent before the arm and not yet handled: arm says BUSY, or (if the message was
  // still on its way) the fd wakes the sleeper. Never a lost wake-up.
  ASSERT_EQ(UCS_OK, uct_ep_am_short(ep_, kAmId, 43, nullptr, 0));
  usleep(200000);
  const ucs_status_t st = uct_iface_event_arm(target_.iface, UCT_EVENT_RECV);
  ASSERT_TRUE(st == UCS_ERR_BUSY || st == UCS_OK) << ucs_status_string(st);
  if (st == UCS_OK) {
    EXPECT_TRUE(sleepOn(rfd)) << "armed, but the message did not wake us";
  }
  ASSERT_TRUE(receivedAtLeast(rx_, 3));

  // A send completion wakes the sender.
  Mapping buf(kPage);
  uct_mem_h memh = reg(init_.md, buf.addr, kPage);
  ASSERT_EQ(UCS_OK, armed(init_.iface, UCT_EVENT_SEND_COMP));
  uct_iov_t iov{buf.addr, kPage, memh, 0, 1};
  Comp c;
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_am_zcopy(ep_, kAmId, nullptr, 0, &iov, 1, 0, &c.c));
  EXPECT_TRUE(sleepOn(sfd)) << "not woken by a send completion";
  EXPECT_EQ(0, c.calls) << "completed without progress";
  ASSERT_TRUE(progressUntil([&] { return c.calls > 0; }));
  EXPECT_EQ(UCS_OK, c.last);
  ASSERT_TRUE(receivedAtLeast(rx_, 4));
  uct_md_mem_dereg(init_.md, memh);
}

// Caller mistakes: UCS_ERR_INVALID_PARAM, nothing sent, the endpoint still works.
TEST_P(GmdRcAm, BadInputIsRefusedAndNothingIsSent) {
  const auto& am = attr_.cap.am;
  ASSERT_EQ(8, bcopy(ep_, 0, 8));  // connected
  ASSERT_TRUE(receivedAtLeast(rx_, 1));
  std::vector<std::uint8_t> big(am.max_bcopy + kPage);
  const std::uint8_t bad_id = UCT_AM_ID_MAX;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_am_short(ep_, bad_id, 0, big.data(), 1));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_ep_am_short(ep_, kAmId, 0, big.data(), static_cast<unsigned>(am.max_short - 7)));
  PackArg a{1, 16};
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_am_bcopy(ep_, bad_id, packPattern, &a, 0));
  PackArg too_much{1, am.max_bcopy + 1};
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_am_bcopy(ep_, kAmId, packPattern, &too_much, 0));

  Mapping payload(kPage);
  uct_mem_h memh = reg(init_.md, payload.addr, kPage);
  std::vector<uct_iov_t> iov(am.max_iov + 1, uct_iov_t{payload.addr, 8, memh, 0, 1});
  Comp c;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_am_zcopy(ep_, bad_id, nullptr, 0, iov.data(), 1, 0, &c.c));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_ep_am_zcopy(ep_, kAmId, big.data(), static_cast<unsigned>(am.max_hdr + 1),
                            iov.data(), 1, 0, &c.c));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_ep_am_zcopy(ep_, kAmId, nullptr, 0, iov.data(), iov.size(), 0, &c.c));
  uct_iov_t no_memh{payload.addr, 8, nullptr, 0, 1};
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_am_zcopy(ep_, kAmId, nullptr, 0, &no_memh, 1, 0, &c.c));
  std::vector<uct_iov_t> short_iov(am.max_iov + 1, uct_iov_t{big.data(), 1, nullptr, 0, 1});
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_ep_am_short_iov(ep_, kAmId, short_iov.data(), short_iov.size()));

  for (int i = 0; i < 2000; ++i) uct_worker_progress(worker_);
  EXPECT_EQ(1u, rx_.messages.size()) << "a refused message arrived";
  EXPECT_EQ(0, c.calls);
  ASSERT_EQ(16, bcopy(ep_, 5, 16));
  ASSERT_TRUE(receivedAtLeast(rx_, 2));
  EXPECT_EQ(16u, checkPattern(rx_.messages[1].data(), 16, 5));
  uct_md_mem_dereg(init_.md, memh);
}

}  // namespace
}  // namespace gmd::test
