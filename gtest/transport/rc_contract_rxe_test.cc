// gmd_rc against the UCT contract where UCX's own rc_verbs sets the example, through the public UCT
// API on real RDMA devices (soft-RoCE in the VM), rxe1 → rxe0 and rxe0 → rxe0: am.max_short counts
// the 8-byte header.
#include <gtest/gtest.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

}  // namespace
}  // namespace gmd::test
