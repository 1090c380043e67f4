// gmd_rc against the UCT contract where UCX's own rc_verbs sets the example, through the public UCT
// API on real RDMA devices (soft-RoCE in the VM), rxe1 → rxe0 and rxe0 → rxe0: am.max_short counts
// the 8-byte header; caller errors on the data path are logged at error level; destroying an
// endpoint completes its outstanding operations and flushes with UCS_ERR_CANCELED; am_alignment and
// am_align_offset are validated and honoured; the iface's send CQ credits never run out with only
// unsignaled work requests outstanding.
#include <gtest/gtest.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "gtest/transport/rc_fixture.h"

namespace gmd::test {
namespace {

constexpr std::uint8_t kAmId = 5;

// The lines UCX's logger was asked to print while a LogCapture lives, formatted, with their level.
// Captured lines are not printed (the tests provoke them on purpose); `dump()` shows them.
class LogCapture {
 public:
  struct Line {
    ucs_log_level_t level;
    std::string text;
  };
  // `level`: the component log level while capturing (debug, so that debug lines reach the handler).
  explicit LogCapture(ucs_log_level_t level = UCS_LOG_LEVEL_DEBUG) {
    saved_ = ucs_global_opts.log_component.log_level;
    ucs_global_opts.log_component.log_level = level;
    current_ = this;
    ucs_log_push_handler(handler);
  }
  ~LogCapture() {
    ucs_log_pop_handler();
    current_ = nullptr;
    ucs_global_opts.log_component.log_level = saved_;
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  void clear() { lines_.clear(); }
  // Lines from gmd_rc at `level` (or more severe) containing `word`.
  std::size_t count(ucs_log_level_t level, const std::string& word) const {
    std::size_t n = 0;
    for (const Line& l : lines_) {
      if (l.level <= level && l.text.find("gmd_rc") != std::string::npos &&
          l.text.find(word) != std::string::npos) {
        ++n;
      }
    }
    return n;
  }
  std::size_t countAtLeast(ucs_log_level_t level) const {
    std::size_t n = 0;
    for (const Line& l : lines_) n += l.level <= level ? 1 : 0;
    return n;
  }
  std::string dump() const {
    std::string s;
    for (const Line& l : lines_) {
      s += "  [" + std::string(ucs_log_level_names[l.level]) + "] " + l.text + "\n";
    }
    return s.empty() ? "  (nothing logged)\n" : s;
  }

 private:
  static ucs_log_func_rc_t handler(const char*, unsigned, const char*, ucs_log_level_t level,
                                   const ucs_log_component_config_t*, const char* fmt,
                                   va_list ap) {
    if (current_ == nullptr) return UCS_LOG_FUNC_RC_CONTINUE;
    char buf[512];
    va_list copy;
    va_copy(copy, ap);
    std::vsnprintf(buf, sizeof(buf), fmt, copy);
    va_end(copy);
    current_->lines_.push_back({level, buf});
    return UCS_LOG_FUNC_RC_STOP;
  }

  static inline LogCapture* current_ = nullptr;
  ucs_log_level_t saved_;
  std::vector<Line> lines_;
};

// What a handler saw: the messages (copied) in order.
struct Seen {
  std::vector<std::vector<std::uint8_t>> messages;
};

ucs_status_t seenHandler(void* arg, void* data, size_t length, unsigned) {
  auto* s = static_cast<Seen*>(arg);
  const auto* p = static_cast<const std::uint8_t*>(data);
  s->messages.emplace_back(p, p + length);
  return UCS_OK;
}

class GmdRcContract : public GmdRc {
 protected:
  void SetUp() override {
    GmdRc::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    ASSERT_NE(nullptr, ep_);
    ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(target_.iface, kAmId, seenHandler, &seen_, 0));
    // Connected: the first message waits for the handshake.
    ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(ep_, kAmId, 1, nullptr, 0); }));
    ASSERT_TRUE(progressUntil([&] { return seen_.messages.size() == 1; }));
    seen_.messages.clear();
  }

  // Retries `send` while the transport has no resources.
  ucs_status_t retry(const std::function<ucs_status_t()>& send) {
    ucs_status_t st = UCS_ERR_NO_RESOURCE;
    progressUntil([&] {
      st = send();
      return st != UCS_ERR_NO_RESOURCE;
    });
    return st;
  }

  // Progresses a while; true when nothing more than `n` messages arrived.
  bool noMoreThan(std::size_t n) {
    for (int i = 0; i < 2000; ++i) uct_worker_progress(worker_);
    return seen_.messages.size() <= n;
  }

  Seen seen_;
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcContract, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

// cap.am.max_short is the whole message, the 8-byte header included (UCT's definition, as
// rc_verbs): am_short with max_short - 8 payload bytes goes, one byte more is refused with
// UCS_ERR_INVALID_PARAM and a log line, and nothing of it arrives; am_short_iov (no header) carries
// max_short bytes, not one more.
TEST_P(GmdRcContract, AmMaxShortCountsTheHeader) {
  const std::size_t max_short = attr_.cap.am.max_short;
  ASSERT_GE(max_short, 8u);
  std::vector<std::uint8_t> buf(max_short + 1);
  fillPattern(buf.data(), buf.size(), 42);
  const auto payload = static_cast<unsigned>(max_short - 8);

  ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(ep_, kAmId, 7, buf.data(), payload); }));
  ASSERT_TRUE(progressUntil([&] { return seen_.messages.size() == 1; }));
  ASSERT_EQ(max_short, seen_.messages[0].size());
  EXPECT_EQ(payload, checkPattern(seen_.messages[0].data() + 8, payload, 42));

  {
    LogCapture log;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_am_short(ep_, kAmId, 7, buf.data(), payload + 1))
        << "am_short of max_short + 1 bytes, header included";
    EXPECT_EQ(1u, log.count(UCS_LOG_LEVEL_DEBUG, "am_short")) << log.dump();
  }
  EXPECT_TRUE(noMoreThan(1)) << "the refused am_short arrived (" << seen_.messages.back().size()
                             << " bytes)";

  std::vector<uct_iov_t> iov = {{buf.data(), max_short / 2, nullptr, 0, 1},
                                {buf.data() + max_short / 2, max_short - max_short / 2, nullptr,
                                 0, 1}};
  if (attr_.cap.am.max_iov < 2) iov = {{buf.data(), max_short, nullptr, 0, 1}};
  ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short_iov(ep_, kAmId, iov.data(), iov.size()); }));
  ASSERT_TRUE(progressUntil([&] { return seen_.messages.size() == 2; }));
  ASSERT_EQ(max_short, seen_.messages[1].size());
  EXPECT_EQ(max_short, checkPattern(seen_.messages[1].data(), max_short, 42));
  iov.back().length += 1;
  {
    LogCapture log;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_am_short_iov(ep_, kAmId, iov.data(), iov.size()))
        << "am_short_iov of max_short + 1 bytes";
    EXPECT_EQ(1u, log.count(UCS_LOG_LEVEL_DEBUG, "am_short")) << log.dump();
  }
  EXPECT_TRUE(noMoreThan(2)) << "the refused am_short_iov arrived";
}

size_t packBytes(void* dest, void* arg) {
  const std::size_t n = *static_cast<const std::size_t*>(arg);
  std::memset(dest, 0x5a, n);
  return n;
}

void unpackNothing(void*, const void*, size_t) {}

// Caller errors on the data path are refused with UCS_ERR_INVALID_PARAM and one error-level line
// with the words UCX's transports use ("Invalid ... length", "Invalid active message id"), as UCX
// built with parameter checks (Debian's) logs them: lengths above each advertised cap, an AM id at
// UCT_AM_ID_MAX, a zero-copy header above max_hdr, more iov entries than max_iov. Nothing is sent.
// mem_dereg's argument checks stay quiet, as UCX's memory domains are.
TEST_P(GmdRcContract, CallerErrorsAreLoggedAtErrorLevel) {
  const auto& cap = attr_.cap;
  Mapping local(2 * kPage), remote(kPage);
  uct_mem_h lmemh = reg(init_.md, local.addr, local.length);
  uct_mem_h rmemh = reg(target_.md, remote.addr, remote.length);
  uct_rkey_bundle_t rk = rkeyOf(target_.md, rmemh);
  const auto raddr = reinterpret_cast<std::uint64_t>(remote.addr);
  std::vector<std::uint8_t> big(cap.am.max_bcopy + cap.put.max_bcopy + kPage);
  const std::uint8_t bad_id = UCT_AM_ID_MAX;
  Comp comp;

  struct Case {
    const char* what;
    const char* word;
    std::function<ucs_status_t()> call;
  };
  const std::vector<Case> cases = {
      {"put_short above put.max_short", "Invalid length",
       [&] {
         return uct_ep_put_short(ep_, big.data(), static_cast<unsigned>(cap.put.max_short + 1),
                                 raddr, rk.rkey);
       }},
      {"put_bcopy above put.max_bcopy", "Invalid length",
       [&] {
         std::size_t n = cap.put.max_bcopy + 1;
         return static_cast<ucs_status_t>(uct_ep_put_bcopy(ep_, packBytes, &n, raddr, rk.rkey));
       }},
      {"get_bcopy above get.max_bcopy", "Invalid length",
       [&] {
         return uct_ep_get_bcopy(ep_, unpackNothing, nullptr, cap.get.max_bcopy + 1, raddr,
                                 rk.rkey, &comp.c);
       }},
      {"put_zcopy above put.max_zcopy", "Invalid length",
       [&] {
         uct_iov_t iov{local.addr, cap.put.max_zcopy + 1, lmemh, 0, 1};
         return uct_ep_put_zcopy(ep_, &iov, 1, raddr, rk.rkey, &comp.c);
       }},
      {"get_zcopy above get.max_zcopy", "Invalid length",
       [&] {
         uct_iov_t iov{local.addr, cap.get.max_zcopy + 1, lmemh, 0, 1};
         return uct_ep_get_zcopy(ep_, &iov, 1, raddr, rk.rkey, &comp.c);
       }},
      {"am_short above am.max_short", "Invalid length",
       [&] {
         return uct_ep_am_short(ep_, kAmId, 0, big.data(),
                                static_cast<unsigned>(cap.am.max_short - 7));
       }},
      {"am_short_iov above am.max_short", "Invalid length",
       [&] {
         uct_iov_t iov{big.data(), cap.am.max_short + 1, nullptr, 0, 1};
         return uct_ep_am_short_iov(ep_, kAmId, &iov, 1);
       }},
      {"am_bcopy above am.max_bcopy", "Invalid length",
       [&] {
         std::size_t n = cap.am.max_bcopy + 1;
         return static_cast<ucs_status_t>(uct_ep_am_bcopy(ep_, kAmId, packBytes, &n, 0));
       }},
      {"am_zcopy header above am.max_hdr", "Invalid length",
       [&] {
         uct_iov_t iov{local.addr, 8, lmemh, 0, 1};
         return uct_ep_am_zcopy(ep_, kAmId, big.data(), static_cast<unsigned>(cap.am.max_hdr + 1),
                                &iov, 1, 0, &comp.c);
       }},
      {"am_zcopy payload above am.max_zcopy", "Invalid length",
       [&] {
         uct_iov_t iov{local.addr, cap.am.max_zcopy + 1, lmemh, 0, 1};
         return uct_ep_am_zcopy(ep_, kAmId, nullptr, 0, &iov, 1, 0, &comp.c);
       }},
      {"am_zcopy with more than am.max_iov entries", "Invalid iov count",
       [&] {
         std::vector<uct_iov_t> iov(cap.am.max_iov + 1, uct_iov_t{local.addr, 8, lmemh, 0, 1});
         return uct_ep_am_zcopy(ep_, kAmId, nullptr, 0, iov.data(), iov.size(), 0, &comp.c);
       }},
      {"am_short_iov with more than am.max_iov entries", "Invalid iov count",
       [&] {
         std::vector<uct_iov_t> iov(cap.am.max_iov + 1, uct_iov_t{big.data(), 1, nullptr, 0, 1});
         return uct_ep_am_short_iov(ep_, kAmId, iov.data(), iov.size());
       }},
      {"put_zcopy with more than put.max_iov entries", "Invalid iov count",
       [&] {
         std::vector<uct_iov_t> iov(cap.put.max_iov + 1, uct_iov_t{local.addr, 8, lmemh, 0, 1});
         return uct_ep_put_zcopy(ep_, iov.data(), iov.size(), raddr, rk.rkey, &comp.c);
       }},
      {"am_short with AM id 32", "Invalid active message id",
       [&] { return uct_ep_am_short(ep_, bad_id, 0, big.data(), 1); }},
      {"am_short_iov with AM id 32", "Invalid active message id",
       [&] {
         uct_iov_t iov{big.data(), 1, nullptr, 0, 1};
         return uct_ep_am_short_iov(ep_, bad_id, &iov, 1);
       }},
      {"am_bcopy with AM id 32", "Invalid active message id",
       [&] {
         std::size_t n = 16;
         return static_cast<ucs_status_t>(uct_ep_am_bcopy(ep_, bad_id, packBytes, &n, 0));
       }},
      {"am_zcopy with AM id 32", "Invalid active message id",
       [&] {
         uct_iov_t iov{local.addr, 8, lmemh, 0, 1};
         return uct_ep_am_zcopy(ep_, bad_id, nullptr, 0, &iov, 1, 0, &comp.c);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    LogCapture log;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, c.call());
    EXPECT_EQ(1u, log.count(UCS_LOG_LEVEL_ERROR, c.word))
        << "expected one error-level line with \"" << c.word << "\"; logged:\n"
        << log.dump();
  }
  EXPECT_TRUE(noMoreThan(0)) << "a refused message arrived";
  EXPECT_EQ(0, comp.calls) << "a refused operation completed";

  {
    LogCapture log;
    uct_md_mem_dereg(init_.md, UCT_MEM_HANDLE_NULL);
    EXPECT_EQ(0u, log.countAtLeast(UCS_LOG_LEVEL_WARN))
        << "mem_dereg's argument checks are quiet:\n" << log.dump();
  }
  // The endpoint still works.
  ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(ep_, kAmId, 3, nullptr, 0); }));
  EXPECT_TRUE(progressUntil([&] { return seen_.messages.size() == 1; }));
  uct_rkey_release(comp_, &rk);
  uct_md_mem_dereg(target_.md, rmemh);
  uct_md_mem_dereg(init_.md, lmemh);
}

// A completion that records every call (how many, and the status of each).
struct Counted {
  Counted() {
    c.func = [](uct_completion_t* self) {
      auto* me = reinterpret_cast<Counted*>(self);
      ++me->calls;
      if (self->status != UCS_ERR_CANCELED) ++me->not_canceled;
    };
    c.count = 1;
    c.status = UCS_OK;
  }
  uct_completion_t c;  // first: the callback casts back
  int calls = 0;
  int not_canceled = 0;
};

// UCT calls every outstanding completion of an endpoint before uct_ep_destroy returns, with
// UCS_ERR_CANCELED, as rc_verbs purges its outstanding operations. An endpoint's send queue is filled
// with put_zcopy operations (a completion each, nothing polled), a local flush with a completion is
// added, and the endpoint destroyed: every completion has been called exactly once, canceled, when
// destroy returns, and never again when the work requests come back from the send CQ. 300 rounds:
// credits, bounce buffers and ring slots all come back (no round's queue takes more than the first;
// after the last, once the work requests have returned, a queue takes as many again).
TEST_P(GmdRcContract, DestroyCancelsOutstandingOperationsOnce) {
  constexpr int kRounds = 300;
  constexpr std::size_t kLen = 64;
  Mapping local(kPage), remote(kPage);
  uct_mem_h lmemh = reg(init_.md, local.addr, local.length);
  uct_mem_h rmemh = reg(target_.md, remote.addr, remote.length);
  uct_rkey_bundle_t rk = rkeyOf(target_.md, rmemh);
  struct Release {  // also when an assertion ends the test early
    std::function<void()> f;
    ~Release() { f(); }
  } release{[&] {
    uct_rkey_release(comp_, &rk);
    uct_md_mem_dereg(target_.md, rmemh);
    uct_md_mem_dereg(init_.md, lmemh);
  }};
  const auto raddr = reinterpret_cast<std::uint64_t>(remote.addr);
  uct_iov_t iov{local.addr, kLen, lmemh, 0, 1};
  std::size_t queue = 0;  // operations the first round's queue took
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    uct_ep_h ep = connect(init_, target_);
    ASSERT_NE(nullptr, ep);
    std::deque<Counted> ops;
    // The first one waits for the connection.
    ucs_status_t st = retry([&] {
      if (ops.empty() || ops.back().calls > 0) ops.emplace_back();
      return uct_ep_put_zcopy(ep, &iov, 1, raddr, rk.rkey, &ops.back().c);
    });
    ASSERT_EQ(UCS_INPROGRESS, st);
    ASSERT_EQ(1u, ops.size());
    // Then the queue, filled without progress.
    for (;;) {
      Counted& c = ops.emplace_back();
      st = uct_ep_put_zcopy(ep, &iov, 1, raddr, rk.rkey, &c.c);
      if (st != UCS_INPROGRESS) {
        ops.pop_back();
        break;
      }
    }
    ASSERT_EQ(UCS_ERR_NO_RESOURCE, st);
    if (round == 0) queue = ops.size();
    // The previous rounds' work requests may still be on their way back from the CQ (the send
    // credits they hold return then): a round may take fewer; none may take more. Whether they all
    // come back is checked after the last round.
    ASSERT_LE(ops.size(), queue) << "a round took more operations than the first";
    Counted flush;
    ASSERT_EQ(UCS_INPROGRESS, uct_ep_flush(ep, UCT_FLUSH_FLAG_LOCAL, &flush.c));
    for (const Counted& c : ops) ASSERT_EQ(0, c.calls) << "completed without progress";

    uct_ep_destroy(ep);
    std::size_t once = 0, canceled = 0;
    for (const Counted& c : ops) {
      once += c.calls == 1 ? 1 : 0;
      canceled += c.calls == 1 && c.not_canceled == 0 ? 1 : 0;
    }
    ASSERT_EQ(ops.size(), once) << "operations whose completion was called exactly once by destroy";
    ASSERT_EQ(ops.size(), canceled) << "... with UCS_ERR_CANCELED";
    ASSERT_EQ(1, flush.calls) << "the flush's completion, by destroy";
    ASSERT_EQ(0, flush.not_canceled);
    // The work requests come back from the CQ: nothing is called again (the completions are
    // still alive here, so a second call would be counted; ASan sees a use after free inside).
    for (int i = 0; i < 200; ++i) uct_worker_progress(worker_);
    for (const Counted& c : ops) ASSERT_EQ(1, c.calls) << "called again after destroy";
    ASSERT_EQ(1, flush.calls);
  }
  // Every credit comes back: once the work requests of all 300 destroyed endpoints have returned,
  // a new endpoint's queue takes as many operations as the first one did (a leak of one credit a
  // round would leave it 300 short). Polled until then, 60 s at most.
  std::size_t last = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
    uct_ep_h ep = connect(init_, target_);
    ASSERT_NE(nullptr, ep);
    std::deque<Counted> ops;
    ASSERT_EQ(UCS_INPROGRESS, retry([&] {
                if (ops.empty() || ops.back().calls > 0) ops.emplace_back();
                return uct_ep_put_zcopy(ep, &iov, 1, raddr, rk.rkey, &ops.back().c);
              }));
    while (uct_ep_put_zcopy(ep, &iov, 1, raddr, rk.rkey, &ops.emplace_back().c) ==
           UCS_INPROGRESS) {
    }
    ops.pop_back();
    last = ops.size();
    uct_ep_destroy(ep);
  } while (last != queue && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(queue, last) << "operations a queue takes after every round's have come back";
  EXPECT_EQ(attr_.cap.flags & UCT_IFACE_FLAG_PENDING, UCT_IFACE_FLAG_PENDING);
  EXPECT_GE(queue, 2u);
  // The fixture's endpoint still works.
  ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(ep_, kAmId, 3, nullptr, 0); }));
  EXPECT_TRUE(progressUntil([&] { return seen_.messages.size() == 1; }));
}

// An iface on `dev` of `md` with the fixture's settings, rx headroom `headroom` and whatever `tweak`
// sets in its parameters; the status of uct_iface_open (the iface in *iface on success).
ucs_status_t openIface(uct_md_h md, uct_worker_h worker, const std::string& dev,
                       std::size_t headroom,
                       const std::function<void(uct_iface_params_t*)>& tweak, uct_iface_h* iface) {
  uct_iface_config_t* ic = nullptr;
  if (ucs_status_t st = uct_md_iface_config_read(md, "gmd_rc", nullptr, nullptr, &ic);
      st != UCS_OK) {
    return st;
  }
  const std::string port = dev + ":1";
  uct_iface_params_t p{};
  p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
  p.rx_headroom = headroom;
  p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
  p.mode.device.tl_name = "gmd_rc";
  p.mode.device.dev_name = port.c_str();
  tweak(&p);
  const ucs_status_t st = uct_iface_open(md, worker, &p, ic, iface);
  uct_config_release(ic);
  return st;
}

// am_alignment / am_align_offset of uct_iface_params_t: an alignment of 0 or not a power of two and
// an offset without an alignment are refused with UCS_ERR_INVALID_PARAM and an error line; sane
// values open, and so does an offset at or above the alignment (UCX's transports let it pass, and
// UCP passes 8 whatever alignment its user asked for: AmAlignmentIsHonoured checks where it lands).
TEST_P(GmdRcContract, InvalidAmAlignmentIsRefused) {
  const std::string dev = rdmaDeviceNames()[0];
  struct Case {
    const char* what;
    std::uint64_t mask;
    std::size_t align, offset;
  };
  constexpr std::uint64_t kA = UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT;
  constexpr std::uint64_t kO = UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET;
  const std::vector<Case> bad = {
      {"alignment 0", kA, 0, 0},
      {"alignment 3", kA, 3, 0},
      {"alignment 48", kA, 48, 0},
      {"alignment 0 with offset 0", kA | kO, 0, 0},
      {"offset without alignment", kO, 0, 8},
      {"offset 0 without alignment", kO, 64, 0},
  };
  // Opens an iface with the case's parameters; closes it again if it opened.
  const auto open = [&](const Case& c) {
    uct_iface_h iface = nullptr;
    const ucs_status_t st = openIface(target_.md, worker_, dev, 0, [&](uct_iface_params_t* p) {
      p->field_mask |= c.mask;
      p->am_alignment = c.align;
      p->am_align_offset = c.offset;
    }, &iface);
    if (st == UCS_OK) uct_iface_close(iface);
    return st;
  };
  for (const Case& c : bad) {
    SCOPED_TRACE(c.what);
    LogCapture log;
    const ucs_status_t st = open(c);
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, st) << ucs_status_string(st);
    EXPECT_EQ(1u, log.count(UCS_LOG_LEVEL_ERROR, "am_align")) << log.dump();
  }
  for (const Case& c : std::vector<Case>{{"alignment 1", kA, 1, 0},
                                         {"alignment 1, offset 0", kA | kO, 1, 0},
                                         {"alignment 4096, offset 4095", kA | kO, 4096, 4095},
                                         {"offset equal to the alignment", kA | kO, 64, 64},
                                         {"offset above the alignment", kA | kO, 64, 100},
                                         {"offset 1 with alignment 1", kA | kO, 1, 1}}) {
    SCOPED_TRACE(c.what);
    const ucs_status_t st = open(c);
    EXPECT_EQ(UCS_OK, st) << ucs_status_string(st);
  }
}

// What an aligned receiver saw: every data pointer, the kept descriptors, the messages' bytes.
struct AlignedRx {
  std::size_t align = 1, offset = 0;
  std::size_t messages = 0, misaligned = 0, corrupt = 0;
  std::vector<void*> kept;
  std::string first_bad;
};

ucs_status_t alignedHandler(void* arg, void* data, size_t length, unsigned flags) {
  auto* r = static_cast<AlignedRx*>(arg);
  ++r->messages;
  const auto at = reinterpret_cast<std::uintptr_t>(data) + r->offset;
  if (at % r->align != 0) {
    ++r->misaligned;
    if (r->first_bad.empty()) {
      r->first_bad = "data " + std::to_string(reinterpret_cast<std::uintptr_t>(data)) + " + " +
                     std::to_string(r->offset) + " is " + std::to_string(at % r->align) +
                     " past an " + std::to_string(r->align) + "-byte boundary (" +
                     std::to_string(length) + "-byte message)";
    }
  }
  // Every message is the pattern of seed `length`.
  if (checkPattern(data, length, length) != length) ++r->corrupt;
  // Keep every other descriptor (released by the test): kept ones are aligned too.
  if ((flags & UCT_CB_PARAM_FLAG_DESC) && r->messages % 2 == 0) {
    r->kept.push_back(data);
    return UCS_INPROGRESS;
  }
  return UCS_OK;
}

// A receiver opened with am_alignment A and am_align_offset O gets every message with data + O on
// an A-byte boundary: A from 1 B to 4 KiB, offsets 0, 1, A/2 and A-1, rx headroom 24 (as UCP asks),
// am_short, am_short_iov, am_bcopy (small and a whole segment) and am_zcopy (header and payload),
// half of them kept by the handler and released later, every byte checked.
TEST_P(GmdRcContract, AmAlignmentIsHonoured) {
  const std::string dev = rdmaDeviceNames()[0];
  constexpr std::size_t kHeadroom = 24;
  const auto& cap = attr_.cap.am;
  Mapping zsrc(cap.max_zcopy + kPage);
  uct_mem_h zmemh = reg(init_.md, zsrc.addr, zsrc.length);
  struct Release {
    std::function<void()> f;
    ~Release() { f(); }
  } release{[&] { uct_md_mem_dereg(init_.md, zmemh); }};
  std::vector<std::uint8_t> buf(cap.max_bcopy);

  for (std::size_t align = 1; align <= 4096; align *= 4) {
    std::vector<std::size_t> offsets{0};
    for (std::size_t o : {std::size_t{1}, align / 2, align - 1}) {
      if (o > 0 && o < align && std::find(offsets.begin(), offsets.end(), o) == offsets.end()) {
        offsets.push_back(o);
      }
    }
    if (align == 4) offsets.push_back(8);  // UCP's case: its 8-byte header, above a small alignment
    for (std::size_t offset : offsets) {
      SCOPED_TRACE("am_alignment " + std::to_string(align) + ", am_align_offset " +
                   std::to_string(offset));
      Side& side = extra_sides_.emplace_back();
      side.md = target_.md;
      const ucs_status_t st = openIface(target_.md, worker_, dev, kHeadroom,
                                        [&](uct_iface_params_t* p) {
        p->field_mask |= UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT | UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET;
        p->am_alignment = align;
        p->am_align_offset = offset;
      }, &side.iface);
      ASSERT_EQ(UCS_OK, st) << ucs_status_string(st);
      uct_iface_progress_enable(side.iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
      side.dev_addr.resize(attr_.device_addr_len);
      side.iface_addr.resize(attr_.iface_addr_len);
      ASSERT_EQ(UCS_OK, uct_iface_get_device_address(
                            side.iface, reinterpret_cast<uct_device_addr_t*>(side.dev_addr.data())));
      ASSERT_EQ(UCS_OK, uct_iface_get_address(
                            side.iface, reinterpret_cast<uct_iface_addr_t*>(side.iface_addr.data())));
      AlignedRx rx;
      rx.align = align;
      rx.offset = offset;
      ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(side.iface, kAmId, alignedHandler, &rx, 0));
      uct_ep_h ep = connect(init_, side);
      ASSERT_NE(nullptr, ep);
      extra_eps_.push_back(ep);

      std::size_t sent = 0;
      // am_short: the 8-byte header is the pattern's first 8 bytes of seed 8 + len.
      for (std::size_t len : {std::size_t{0}, std::size_t{13}, cap.max_short - 8}) {
        fillPattern(buf.data(), len + 8, len + 8);
        std::uint64_t hdr;
        std::memcpy(&hdr, buf.data(), 8);
        ASSERT_EQ(UCS_OK, retry([&] {
          return uct_ep_am_short(ep, kAmId, hdr, buf.data() + 8, static_cast<unsigned>(len));
        })) << "am_short " << len;
        ++sent;
      }
      {
        fillPattern(buf.data(), 77, 77);
        uct_iov_t iov[2] = {{buf.data(), 30, nullptr, 0, 1}, {buf.data() + 30, 47, nullptr, 0, 1}};
        ASSERT_GE(cap.max_iov, 2u);
        ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short_iov(ep, kAmId, iov, 2); }));
        ++sent;
      }
      for (std::size_t len : {std::size_t{1}, std::size_t{1000}, cap.max_bcopy}) {
        fillPattern(buf.data(), len, len);
        struct Arg {
          const std::uint8_t* src;
          std::size_t len;
        } a{buf.data(), len};
        ssize_t r = UCS_ERR_NO_RESOURCE;
        progressUntil([&] {
          r = uct_ep_am_bcopy(ep, kAmId,
                              [](void* dest, void* arg) -> size_t {
                                const auto* me = static_cast<const Arg*>(arg);
                                std::memcpy(dest, me->src, me->len);
                                return me->len;
                              },
                              &a, 0);
          return r != UCS_ERR_NO_RESOURCE;
        });
        ASSERT_EQ(static_cast<ssize_t>(len), r) << "am_bcopy " << len;
        ++sent;
      }
      for (std::size_t plen : {std::size_t{0}, std::size_t{3000}, cap.max_zcopy}) {
        const std::size_t hlen = std::min<std::size_t>(16, cap.max_hdr);
        const std::size_t len = hlen + plen;
        fillPattern(buf.data(), len, len);
        std::memcpy(zsrc.addr, buf.data() + hlen, plen);
        uct_iov_t iov{zsrc.addr, plen, zmemh, 0, 1};
        Comp c;
        const ucs_status_t zst = retry([&] {
          return uct_ep_am_zcopy(ep, kAmId, buf.data(), static_cast<unsigned>(hlen), &iov, 1, 0,
                                 &c.c);
        });
        ASSERT_TRUE(zst == UCS_OK || zst == UCS_INPROGRESS) << ucs_status_string(zst);
        if (zst == UCS_INPROGRESS) {
          ASSERT_TRUE(progressUntil([&] { return c.calls > 0; }));
        }
        ++sent;
      }
      ASSERT_TRUE(progressUntil([&] { return rx.messages >= sent; }))
          << rx.messages << " of " << sent << " arrived";
      EXPECT_EQ(0u, rx.misaligned) << rx.first_bad;
      EXPECT_EQ(0u, rx.corrupt);
      EXPECT_FALSE(rx.kept.empty());
      for (void* d : rx.kept) {
        EXPECT_EQ(0u, (reinterpret_cast<std::uintptr_t>(d) + offset) % align) << "kept";
        uct_iface_release_desc(static_cast<std::uint8_t*>(d) - kHeadroom);
      }
      flushEp(ep);
      uct_ep_destroy(ep);
      extra_eps_.pop_back();
      uct_iface_close(side.iface);
      side.iface = nullptr;
    }
  }
}

// A small send CQ shared by several endpoints (UCX_GMD_RC_TX_CQ_LEN=64, 8 endpoints).
class GmdRcContractSmallCq : public GmdRcContract {
 protected:
  void SetUp() override {
    iface_config_ = {{"TX_CQ_LEN", "64"}};
    GmdRcContract::SetUp();
  }
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcContractSmallCq, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

// A pending request that sends one am_short when dispatched.
struct SendOnce {
  uct_pending_req_t uct;  // first: the callback casts back
  uct_ep_h ep;
  int* done;
};

ucs_status_t sendOnce(uct_pending_req_t* self) {
  auto* r = reinterpret_cast<SendOnce*>(self);
  const ucs_status_t st = uct_ep_am_short(r->ep, kAmId, 9, nullptr, 0);
  if (st == UCS_OK) ++*r->done;
  return st;
}

// The send CQ's credits are shared by all endpoints, and a work request is signaled only every
// so often per endpoint. Eight endpoints that together use all 64 credits with a few messages
// each (none of them reaching its signaling interval) must still get their credits back: as
// rc_verbs does, the last work requests before the credits run out are signaled. Before, nothing
// was signaled, no completion ever came, and every endpoint waited for ever (pending requests
// never dispatched; uct_iface_flush could not post its probe either). 128 endpoints sending
// am_short in rounds until each had a pending request hung that way after a dozen rounds.
TEST_P(GmdRcContractSmallCq, CreditsComeBackWhenEveryEndpointHoldsAFewUnsignaledSends) {
  constexpr int kEps = 8;
  std::vector<uct_ep_h> eps{ep_};
  for (int i = 1; i < kEps; ++i) {
    extra_eps_.push_back(connect(init_, target_));
    ASSERT_NE(nullptr, extra_eps_.back());
    eps.push_back(extra_eps_.back());
  }
  // Connected, and nothing outstanding.
  for (uct_ep_h ep : eps) {
    ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(ep, kAmId, 2, nullptr, 0); }));
    flushEp(ep);
  }
  ASSERT_TRUE(progressUntil([&] { return seen_.messages.size() == kEps; }));
  // Round robin, one message per endpoint, until every endpoint is refused.
  std::size_t sent = 0;
  std::vector<bool> full(kEps, false);
  for (int n_full = 0; n_full < kEps;) {
    for (int i = 0; i < kEps; ++i) {
      if (full[i]) continue;
      const ucs_status_t st = uct_ep_am_short(eps[i], kAmId, 3, nullptr, 0);
      if (st == UCS_OK) {
        ++sent;
        continue;
      }
      ASSERT_EQ(UCS_ERR_NO_RESOURCE, st);
      full[i] = true;
      ++n_full;
    }
  }
  ASSERT_GE(sent, 8u);
  int done = 0;
  std::vector<SendOnce> reqs(kEps);
  for (int i = 0; i < kEps; ++i) {
    reqs[i] = {{}, eps[i], &done};
    reqs[i].uct.func = sendOnce;
    ASSERT_EQ(UCS_OK, uct_ep_pending_add(eps[i], &reqs[i].uct, 0)) << "endpoint " << i;
  }
  const bool dispatched = progressUntil([&] { return done == kEps; }, 20);
  if (!dispatched) {
    for (uct_ep_h ep : eps) uct_ep_pending_purge(ep, nullptr, nullptr);
  }
  ASSERT_TRUE(dispatched) << done << " of " << kEps << " pending requests dispatched after "
                          << sent << " messages: no send credit came back";
  EXPECT_TRUE(progressUntil([&] { return seen_.messages.size() == kEps + sent + kEps; }))
      << seen_.messages.size() << " of " << kEps + sent + kEps << " messages arrived";
}

}  // namespace
}  // namespace gmd::test
