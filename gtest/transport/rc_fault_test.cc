// gmd_rc when the peer dies: a peer process (gtest/transport/rc_peer.cc) serves as the target, this
// process is the initiator; the peer is killed with SIGKILL while puts, gets or a flush are
// outstanding. The survivor's completions must carry an error, its error handler run once for the
// endpoint, pending requests come back through pending_purge, and nothing hang (progressUntil's limit
// is the guard: reaching it fails the test; how long detection took is printed, never asserted).
//
// Two kinds of death: the process killed (its kernel closes the side channel: detected at once) and a
// silent one (the peer's sockets are kept open by a holder process, as when a host vanishes: only the
// RC QP's retries can tell, after about UCX_GMD_RC_TIMEOUT * (UCX_GMD_RC_RETRY_COUNT + 1)).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "md/abi/config_parser.h"

extern char** environ;

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();
constexpr std::size_t kBuf = 1 << 20;  // the peer's buffer; each operation moves all of it

std::vector<std::uint8_t> unhex(const std::string& s) {
  std::vector<std::uint8_t> v;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) {
    v.push_back(static_cast<std::uint8_t>(std::stoul(s.substr(i, 2), nullptr, 16)));
  }
  return v;
}

// The peer process, with pipes to its stdin and stdout.
class Peer {
 public:
  bool start(const std::string& dev, std::string* error) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    const std::string bytes = std::to_string(kBuf);
    char* argv[] = {const_cast<char*>(GMD_RC_PEER_PATH), const_cast<char*>(dev.c_str()),
                    const_cast<char*>(bytes.c_str()), nullptr};
    const int rc = posix_spawn(&pid_, GMD_RC_PEER_PATH, &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    if (rc != 0) {
      *error = std::string("posix_spawn: ") + std::strerror(rc);
      return false;
    }
    std::istringstream line(readLine());
    std::string dev_hex, iface_hex, rkey_hex;
    unsigned long long addr = 0;
    line >> dev_hex >> iface_hex >> addr >> rkey_hex >> holder_;
    if (!line) {
      *error = "the peer did not start (see its stderr)";
      return false;
    }
    dev_addr = unhex(dev_hex);
    iface_addr = unhex(iface_hex);
    rkey_packed = unhex(rkey_hex);
    remote_addr = addr;
    return true;
  }
  // The holder takes the peer's sockets: a kill then leaves the side channels open.
  bool hold() {
    std::fputs("hold\n", to_);
    std::fflush(to_);
    return readLine().rfind("held", 0) == 0;
  }
  void kill9() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  ~Peer() {
    kill9();
    if (holder_ > 0) ::kill(holder_, SIGKILL);  // reparented: reaped by init
    if (to_ != nullptr) std::fclose(to_);
    if (from_ != nullptr) std::fclose(from_);
  }

  std::vector<std::uint8_t> dev_addr, iface_addr, rkey_packed;
  std::uint64_t remote_addr = 0;

 private:
  std::string readLine() {
    char buf[4096];
    if (from_ == nullptr || std::fgets(buf, sizeof(buf), from_) == nullptr) return {};
    return buf;
  }
  pid_t pid_ = -1;
  pid_t holder_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

struct Comp {
  Comp() {
    c.func = [](uct_completion_t* self) {
      auto* me = reinterpret_cast<Comp*>(self);
      ++me->calls;
      me->last = self->status;
      me->at = std::chrono::steady_clock::now();
    };
    c.count = 1;
    c.status = UCS_OK;
  }
  uct_completion_t c;  // first: the callback casts back
  int calls = 0;
  ucs_status_t last = UCS_OK;
  std::chrono::steady_clock::time_point at{};
};

struct Pending {
  uct_pending_req_t req;  // first
  int dispatched = 0;
  int purged = 0;
};

class GmdRcFault : public ::testing::TestWithParam<bool> {  // param: peer on another device
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    const auto devs = rdmaDeviceNames();
    if (GetParam() && devs.size() < 2) GTEST_SKIP() << "needs two RDMA devices";
    comp_ = findComponent("gmd");
    ASSERT_NE(nullptr, comp_);
    std::string err;
    ASSERT_TRUE(peer_.start(devs[0], &err)) << err;
    ASSERT_EQ(UCS_OK, uct_rkey_unpack(comp_, peer_.rkey_packed.data(), &rkey_));
    unpacked_ = true;
    ASSERT_EQ(UCS_OK, ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async_));
    ASSERT_EQ(UCS_OK, uct_worker_create(async_, UCS_THREAD_MODE_SINGLE, &worker_));
    const std::string dev = GetParam() ? devs[1] : devs[0];
    ucs_status_t st;
    md_ = openMd(comp_, dev, &st);
    ASSERT_NE(nullptr, md_) << ucs_status_string(st);
    uct_iface_config_t* ic = nullptr;
    ASSERT_EQ(UCS_OK, uct_md_iface_config_read(md_, "gmd_rc", nullptr, nullptr, &ic));
    for (const auto& [name, value] : config_) {
      ASSERT_EQ(UCS_OK, ucx::configModify(ic, "GMD_RC_", name, value)) << name;
    }
    const std::string port = dev + ":1";
    uct_iface_params_t p{};
    p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
                   UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG;
    p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    p.mode.device.tl_name = "gmd_rc";
    p.mode.device.dev_name = port.c_str();
    p.err_handler = [](void* arg, uct_ep_h ep, ucs_status_t status) -> ucs_status_t {
      auto* self = static_cast<GmdRcFault*>(arg);
      self->failed_.push_back(ep);
      self->failed_status_ = status;
      self->failed_at_ = std::chrono::steady_clock::now();
      // What UCP does: hand the pending requests back with the error.
      uct_ep_pending_purge(ep, [](uct_pending_req_t* r, void*) {
        ++reinterpret_cast<Pending*>(r)->purged;
      }, nullptr);
      return UCS_OK;
    };
    p.err_handler_arg = this;
    st = uct_iface_open(md_, worker_, &p, ic, &iface_);
    uct_config_release(ic);
    ASSERT_EQ(UCS_OK, st) << ucs_status_string(st);
    uct_iface_progress_enable(iface_, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_iface_attr_t attr{};
    ASSERT_EQ(UCS_OK, uct_iface_query(iface_, &attr));
    EXPECT_TRUE(attr.cap.flags & UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE);
    EXPECT_TRUE(attr.cap.flags & UCT_IFACE_FLAG_EP_CHECK);
    uct_ep_params_t ep{};
    ep.field_mask =
        UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep.iface = iface_;
    ep.dev_addr = reinterpret_cast<const uct_device_addr_t*>(peer_.dev_addr.data());
    ep.iface_addr = reinterpret_cast<const uct_iface_addr_t*>(peer_.iface_addr.data());
    ASSERT_EQ(UCS_OK, uct_ep_create(&ep, &ep_));
    local_ = std::make_unique<Mapping>(kBuf);
    ASSERT_NE(nullptr, local_->addr);
    ASSERT_EQ(UCS_OK, uct_md_mem_reg(md_, local_->addr, kBuf, UCT_MD_MEM_ACCESS_RMA, &memh_));
    // One put through, so the connection is up and the peer serves.
    fillPattern(local_->addr, kBuf, 7);
    Comp first;
    ASSERT_EQ(UCS_INPROGRESS, issue(true, &first.c));
    ASSERT_TRUE(progressUntil([&] { return first.calls > 0; }));
    ASSERT_EQ(UCS_OK, first.last);
  }

  void TearDown() override {
    if (ep_ != nullptr) uct_ep_destroy(ep_);
    if (memh_ != nullptr) uct_md_mem_dereg(md_, memh_);
    local_.reset();
    if (iface_ != nullptr) uct_iface_close(iface_);
    if (md_ != nullptr) uct_md_close(md_);
    if (worker_ != nullptr) uct_worker_destroy(worker_);
    if (async_ != nullptr) ucs_async_context_destroy(async_);
    if (unpacked_) uct_rkey_release(comp_, &rkey_);
  }

  bool progressUntil(const std::function<bool()>& done, double seconds = 120) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!done()) {
      uct_worker_progress(worker_);
      if (std::chrono::steady_clock::now() > end) return false;
    }
    return true;
  }

  // One put or get of the whole buffer; UCS_ERR_NO_RESOURCE is returned as is.
  ucs_status_t post(bool put, uct_completion_t* c) {
    uct_iov_t iov{local_->addr, kBuf, memh_, 0, 1};
    return put ? uct_ep_put_zcopy(ep_, &iov, 1, peer_.remote_addr, rkey_.rkey, c)
               : uct_ep_get_zcopy(ep_, &iov, 1, peer_.remote_addr, rkey_.rkey, c);
  }
  ucs_status_t issue(bool put, uct_completion_t* c) {
    ucs_status_t st;
    progressUntil([&] { return (st = post(put, c)) != UCS_ERR_NO_RESOURCE; });
    return st;
  }

  // Posts up to `count` operations (fewer when the send queue fills: UCS_ERR_NO_RESOURCE); with
  // a full queue, a pending request waits behind them.
  void loadUp(bool put, std::size_t count) {
    comps_ = std::vector<Comp>(count + 1);  // the last one for late()
    for (std::size_t i = 0; i < count; ++i) {
      const ucs_status_t st = post(put, &comps_[i].c);
      if (st == UCS_ERR_NO_RESOURCE) break;
      ASSERT_EQ(UCS_INPROGRESS, st);
      ++posted_;
    }
    ASSERT_GT(posted_, 0u);
    pending_.req.func = [](uct_pending_req_t* r) -> ucs_status_t {
      ++reinterpret_cast<Pending*>(r)->dispatched;
      return UCS_OK;
    };
    pending_added_ = uct_ep_pending_add(ep_, &pending_.req, 0) == UCS_OK;
  }

  // After the peer is dead: one more operation (if the queue has room), which cannot reach it.
  void late(bool put) {
    const ucs_status_t st = post(put, &comps_[posted_].c);
    if (st == UCS_ERR_NO_RESOURCE) return;  // a full queue: the pending request stands for it
    ASSERT_EQ(UCS_INPROGRESS, st) << ucs_status_string(st);
    late_ = posted_++;
  }

  // Kills the peer (waiting until it is gone, so its QPs are destroyed: work completed by then
  // completed legitimately), posts a late operation, then waits for every completion, the flush
  // and the error handler.
  void killAndExpectErrors(bool put, Comp* flush, ucs_status_t expected) {
    const auto killed = std::chrono::steady_clock::now();
    peer_.kill9();
    ASSERT_NO_FATAL_FAILURE(late(put));
    ASSERT_TRUE(late_ != kNone || pending_added_) << "nothing outstanding after the kill";
    const bool done = progressUntil([&] {
      for (std::size_t i = 0; i < posted_; ++i) {
        if (comps_[i].calls == 0) return false;
      }
      return (flush == nullptr || flush->calls > 0) && !failed_.empty();
    });
    ASSERT_TRUE(done) << "hang: not every operation completed after the peer was killed ("
                      << failed_.size() << " error handler calls)";
    // Each operation completes once: OK if the peer acknowledged it before dying, else with the
    // endpoint's error; the late one always with the error.
    std::size_t errors = 0;
    for (std::size_t i = 0; i < posted_; ++i) {
      EXPECT_EQ(1, comps_[i].calls) << "operation " << i;
      if (comps_[i].last != UCS_OK) {
        ++errors;
        EXPECT_EQ(expected, comps_[i].last) << "operation " << i << ": "
                                            << ucs_status_string(comps_[i].last);
      }
    }
    if (late_ != kNone) {
      EXPECT_EQ(expected, comps_[late_].last) << "an operation posted after the peer died: "
                                              << ucs_status_string(comps_[late_].last);
    }
    if (flush != nullptr) {
      EXPECT_EQ(1, flush->calls);
      // The flush covers the operations before it: an error if any of them failed.
      bool before_failed = false;
      for (std::size_t i = 0; i < posted_; ++i) {
        before_failed |= i != late_ && comps_[i].last != UCS_OK;
      }
      if (before_failed) {
        EXPECT_EQ(expected, flush->last) << ucs_status_string(flush->last);
      }
    }
    // Called once, for our endpoint, with the status of the failure.
    for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
    ASSERT_EQ(1u, failed_.size()) << "error handler calls";
    EXPECT_EQ(ep_, failed_[0]);
    EXPECT_EQ(expected, failed_status_) << ucs_status_string(failed_status_);
    if (pending_added_) {
      EXPECT_EQ(1, pending_.purged) << "pending request not handed back by pending_purge";
      EXPECT_EQ(0, pending_.dispatched) << "pending request dispatched on a dead endpoint";
    }
    // The endpoint refuses work afterwards; flush has nothing in flight.
    Comp after;
    EXPECT_EQ(expected, post(true, &after.c));
    EXPECT_EQ(UCS_OK, uct_ep_flush(ep_, 0, nullptr));
    const double secs = std::chrono::duration<double>(failed_at_ - killed).count();
    std::printf("[ detected ] %s %.3f s after SIGKILL (%zu of %zu operations failed%s)\n",
                ucs_status_string(failed_status_), secs, errors, posted_,
                pending_added_ ? ", pending request purged" : "");
    RecordProperty("detection_seconds", std::to_string(secs));
  }

  static constexpr std::size_t kNone = ~std::size_t{0};
  std::vector<std::pair<const char*, const char*>> config_;
  Peer peer_;
  uct_component_h comp_ = nullptr;
  uct_rkey_bundle_t rkey_{};
  bool unpacked_ = false;
  ucs_async_context_t* async_ = nullptr;
  uct_worker_h worker_ = nullptr;
  uct_md_h md_ = nullptr;
  uct_iface_h iface_ = nullptr;
  uct_ep_h ep_ = nullptr;
  std::unique_ptr<Mapping> local_;
  uct_mem_h memh_ = nullptr;
  std::vector<Comp> comps_;
  std::size_t posted_ = 0;
  std::size_t late_ = kNone;
  Pending pending_{};
  bool pending_added_ = false;
  std::vector<uct_ep_h> failed_;
  ucs_status_t failed_status_ = UCS_OK;
  std::chrono::steady_clock::time_point failed_at_{};
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcFault, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

// 32 puts of 1 MiB (half the send queue) and a flush behind them.
TEST_P(GmdRcFault, KilledPeerFailsOutstandingPutsAndFlush) {
  ASSERT_NO_FATAL_FAILURE(loadUp(true, 32));
  Comp flush;
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_flush(ep_, 0, &flush.c));
  killAndExpectErrors(true, &flush, UCS_ERR_CONNECTION_RESET);
}

// 8 gets of 1 MiB (each several READs on soft-RoCE) and a flush.
TEST_P(GmdRcFault, KilledPeerFailsOutstandingGetsAndFlush) {
  ASSERT_NO_FATAL_FAILURE(loadUp(false, 8));
  Comp flush;
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_flush(ep_, 0, &flush.c));
  killAndExpectErrors(false, &flush, UCS_ERR_CONNECTION_RESET);
}

// A full send queue and a pending request: the error handler's pending_purge hands it back.
TEST_P(GmdRcFault, KilledPeerPurgesPendingRequests) {
  ASSERT_NO_FATAL_FAILURE(loadUp(true, 1000));
  ASSERT_TRUE(pending_added_) << "the send queue did not fill";
  killAndExpectErrors(true, nullptr, UCS_ERR_CONNECTION_RESET);
}

// An idle endpoint whose peer went away is reported at once (UCP may be waiting for an answer with
// nothing outstanding at UCT), once: uct_ep_check afterwards reports nothing new. On a live peer,
// uct_ep_check's probe succeeds silently.
TEST_P(GmdRcFault, EpCheckPassesOnALivePeerAndFailsOnADeadOne) {
  ASSERT_EQ(UCS_OK, uct_ep_check(ep_, 0, nullptr));
  Comp flush;
  ucs_status_t st = uct_ep_flush(ep_, 0, &flush.c);
  if (st == UCS_INPROGRESS) {
    ASSERT_TRUE(progressUntil([&] { return flush.calls > 0; }));
  }
  EXPECT_EQ(UCS_OK, st == UCS_INPROGRESS ? flush.last : st) << "the probe failed on a live peer";
  EXPECT_TRUE(failed_.empty()) << "error handler called for a live peer";

  const auto killed = std::chrono::steady_clock::now();
  peer_.kill9();
  ASSERT_TRUE(progressUntil([&] { return !failed_.empty(); })) << "an idle endpoint's dead peer";
  EXPECT_EQ(UCS_ERR_CONNECTION_RESET, failed_status_);
  std::printf("[ detected ] idle endpoint: %.3f s after SIGKILL\n",
              std::chrono::duration<double>(failed_at_ - killed).count());
  EXPECT_EQ(UCS_OK, uct_ep_check(ep_, 0, nullptr));
  for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
  EXPECT_EQ(1u, failed_.size()) << "error handler calls";
}

// Work requests without a completion are unsignaled: those the peer acknowledged before dying
// leave no completion behind. The flush that UCP's error handling issues (UCT_FLUSH_FLAG_CANCEL, to
// discard the endpoint) must still complete: before the fix it waited for ever, and with it every
// UCP request on the endpoint.
TEST_P(GmdRcFault, CancelFlushCompletesAfterSilentlyCompletedWork) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(UCS_OK, uct_ep_am_short(ep_, 1, 0, nullptr, 0)) << "active message " << i;
  }
  // Let the peer acknowledge them (nothing reports it: they are unsignaled).
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) uct_worker_progress(worker_);
  peer_.kill9();
  ASSERT_TRUE(progressUntil([&] { return !failed_.empty(); })) << "the dead peer was not noticed";
  Comp flush;
  const ucs_status_t st = uct_ep_flush(ep_, UCT_FLUSH_FLAG_CANCEL, &flush.c);
  if (st == UCS_INPROGRESS) {
    ASSERT_TRUE(progressUntil([&] { return flush.calls > 0; }, 60)) << "the cancelling flush hung";
    EXPECT_EQ(1, flush.calls);
  } else {
    EXPECT_EQ(UCS_OK, st) << ucs_status_string(st);
  }
  EXPECT_EQ(1u, failed_.size()) << "error handler calls";
}

// The peer's host vanishes as the network sees it: QPs gone, side channels silent. Only RC's
// retries can tell; they are finite on every provider now (RETRY_COUNT at most 6: soft-RoCE
// retries forever at 7, which the old default was).
class GmdRcSilentFault : public GmdRcFault {
 protected:
  void SetUp() override {
    config_ = {{"TIMEOUT", "100ms"}};
    GmdRcFault::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    ASSERT_TRUE(peer_.hold()) << "the holder did not take the peer's sockets";
  }
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcSilentFault, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcSilentFault, SilentlyDeadPeerFailsOutstandingPutsThroughRetries) {
  ASSERT_NO_FATAL_FAILURE(loadUp(true, 32));
  Comp flush;
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_flush(ep_, 0, &flush.c));
  killAndExpectErrors(true, &flush, UCS_ERR_ENDPOINT_TIMEOUT);
}

TEST_P(GmdRcSilentFault, EpCheckProbeFailsOnASilentlyDeadPeer) {
  peer_.kill9();
  EXPECT_EQ(UCS_OK, uct_ep_check(ep_, 0, nullptr));
  ASSERT_TRUE(progressUntil([&] { return !failed_.empty(); })) << "the probe never failed";
  EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT, failed_status_);
  for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
  EXPECT_EQ(1u, failed_.size()) << "error handler calls";
}

}  // namespace
}  // namespace gmd::test

namespace gmd::test {
namespace {

// Can gmd_rc lose a completion while the transport retransmits? Many small gets (13 KiB, as in the
// report of a get that never completed under load) with a short transport timeout, so that rxe
// retransmits READ requests and resends responses often; with lossy links (tc netem on the veth pair,
// where the guest has it) the same test exercises lost READ responses. Every get must complete
// exactly once, with OK and every byte right, or with the endpoint's error if retries ran out; the
// progress limit is the hang guard.
class GmdRcStress : public GmdRcFault {
 protected:
  void SetUp() override {
    config_ = {{"TIMEOUT", "10ms"}};
    GmdRcFault::SetUp();
  }
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcStress, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcStress, ManySmallGetsUnderRetransmissionEachCompleteOnce) {
  constexpr std::size_t kGet = 13 * 1024;
  constexpr std::size_t kSlots = kBuf / kGet;  // distinct local targets, reused round robin
  constexpr std::size_t kGets = 3000;
  // The peer's buffer holds pattern 7 from SetUp's put; gets read slices of it back.
  std::vector<Comp> comps(kGets);
  std::vector<int> busy(kSlots, -1);  // get using the slot
  std::size_t issued = 0, ok = 0, failed = 0;
  auto finished = [&](std::size_t i) { return comps[i].calls > 0; };
  std::vector<std::uint8_t> shadow(kBuf);  // the peer's buffer: SetUp's put wrote pattern 7
  fillPattern(shadow.data(), kBuf, 7);
  const auto start = std::chrono::steady_clock::now();
  const bool done = progressUntil(
      [&] {
        // Reap: check bytes of completed gets, free their slot.
        for (std::size_t s = 0; s < kSlots; ++s) {
          const int i = busy[s];
          if (i < 0 || !finished(static_cast<std::size_t>(i))) continue;
          EXPECT_EQ(1, comps[i].calls) << "get " << i;
          if (comps[i].last == UCS_OK) {
            ++ok;
            // Same bytes as slice s of the peer's buffer.
            EXPECT_EQ(0, std::memcmp(local_->addr + s * kGet, shadow.data() + s * kGet, kGet))
                << "get " << i << " completed OK with wrong bytes";
          } else {
            ++failed;
          }
          busy[s] = -1;
        }
        // Issue into free slots.
        for (std::size_t s = 0; s < kSlots && issued < kGets; ++s) {
          if (busy[s] >= 0) continue;
          uct_iov_t iov{local_->addr + s * kGet, kGet, memh_, 0, 1};
          std::memset(local_->addr + s * kGet, 0, kGet);
          const ucs_status_t st = uct_ep_get_zcopy(ep_, &iov, 1, peer_.remote_addr + s * kGet,
                                                   rkey_.rkey, &comps[issued].c);
          if (st == UCS_ERR_NO_RESOURCE) break;
          if (st != UCS_INPROGRESS) {  // the endpoint failed: what is left is refused at once
            ++failed;
            comps[issued].calls = 1;
            ++issued;
            continue;
          }
          busy[s] = static_cast<int>(issued++);
        }
        if (issued < kGets) return false;
        for (int b : busy) {
          if (b >= 0) return false;
        }
        return true;
      },
      600);
  ASSERT_TRUE(done) << "hang: " << issued << " gets issued, " << ok << " OK, " << failed
                    << " failed; the rest never completed";
  EXPECT_EQ(kGets, ok + failed);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ stress   ] %zu gets of %zu B: %zu OK, %zu failed (%s), %.1f s\n", kGets, kGet, ok,
              failed, failed > 0 ? ucs_status_string(failed_status_) : "-", secs);
}

}  // namespace
}  // namespace gmd::test
