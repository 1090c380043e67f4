// gmd_rc against the UCT contract where UCX's own rc_verbs sets the example, through the public UCT
// API on real RDMA devices (soft-RoCE in the VM), rxe1 → rxe0 and rxe0 → rxe0: am.max_short counts
// the 8-byte header; caller errors on the data path are logged at error level; destroying an
// endpoint completes its outstanding operations and flushes with UCS_ERR_CANCELED.
#include <gtest/gtest.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
// credits, bounce buffers and ring slots all come back (every round fills a whole queue again).
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
    ASSERT_EQ(queue, ops.size()) << "a round took fewer operations than the first: resources leak";
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
  EXPECT_EQ(attr_.cap.flags & UCT_IFACE_FLAG_PENDING, UCT_IFACE_FLAG_PENDING);
  EXPECT_GE(queue, 2u);
  // The fixture's endpoint still works.
  ASSERT_EQ(UCS_OK, retry([&] { return uct_ep_am_short(ep_, kAmId, 3, nullptr, 0); }));
  EXPECT_TRUE(progressUntil([&] { return seen_.messages.size() == 1; }));
}

}  // namespace
}  // namespace gmd::test
