// A UCP program for gtest/transport/ucp_fault_check.sh: a survivor whose peer is killed with
// SIGKILL in the middle of tag sends (rendezvous, as in tag_bw) or gets, over whatever UCX_TLS
// selects (the check runs it over gmd_rc alone).
//
//   gmd_ucp_fault serve ADDRFILE BYTES
//     A peer: TAG and RMA, a buffer of BYTES filled with a known pattern and mapped for RMA, tag
//     receives posted again and again; "<pid> <worker address hex> <buffer address> <rkey hex>" is
//     written to ADDRFILE (complete once it exists). Serves until killed.
//   gmd_ucp_fault client tag|get|idle ADDRFILE1 ADDRFILE2 BYTES
//     Connects to peer 1 with UCP_ERR_HANDLING_MODE_PEER and an error callback, keeps a window of
//     tag sends or gets of BYTES outstanding, kills peer 1 (SIGKILL) once some have completed, and
//     keeps posting until the error callback ran. Then every request must have completed exactly
//     once (OK before the kill, or with an error; at least one with an error), the callback must
//     have run once, for that endpoint, with an error status. `idle` sends some tags, then kills
//     peer 1 with nothing outstanding: no request can fail, the transport (or UCP's keepalive,
//     which the check runs every second) must report the endpoint. Finally it closes the failed
//     endpoint, connects to peer 2 and runs the same traffic there, which must all succeed (gets
//     bytes checked). Prints "[ detected ] STATUS T s after SIGKILL" and one "PASS"/"FAIL: ..."
//     line per check; exits 0 when every check passed, 1 otherwise. The hang guard is 120 s per
//     phase.
#include <signal.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr ucp_tag_t kTag = 0x6d64;
constexpr double kGuardSeconds = 120;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s%s\n", ok ? "PASS: " : "FAIL: ", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

std::string hex(const void* p, std::size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

std::vector<unsigned char> unhex(const std::string& s) {
  std::vector<unsigned char> v;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) {
    v.push_back(static_cast<unsigned char>(std::stoul(s.substr(i, 2), nullptr, 16)));
  }
  return v;
}

unsigned char patternByte(std::size_t i) { return static_cast<unsigned char>((i * 131 + 7) >> 3); }

void* mapBuffer(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

struct Ucp {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  bool open() {
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
    ucp_config_t* cfg = nullptr;
    if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK) return false;
    const ucs_status_t st = ucp_init(&p, cfg, &context);
    ucp_config_release(cfg);
    if (st != UCS_OK) return false;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    return ucp_worker_create(context, &wp, &worker) == UCS_OK;
  }
  ~Ucp() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
};

// --- The peer
// --------------------------------------------------------------------------------------

struct Recv {
  bool done = false;
};

int serve(const char* addr_file, std::size_t bytes) {
  Ucp ucp;
  if (!ucp.open()) return std::fprintf(stderr, "serve: UCP init failed\n"), 2;
  auto* buf = static_cast<unsigned char*>(mapBuffer(bytes));
  auto* rbuf = static_cast<unsigned char*>(mapBuffer(bytes));
  if (buf == nullptr || rbuf == nullptr) return std::fprintf(stderr, "serve: mmap\n"), 2;
  for (std::size_t i = 0; i < bytes; ++i) buf[i] = patternByte(i);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = buf;
  mp.length = bytes;
  ucp_mem_h memh = nullptr;
  void* rkey = nullptr;
  std::size_t rkey_len = 0;
  ucp_address_t* addr = nullptr;
  std::size_t addr_len = 0;
  if (ucp_mem_map(ucp.context, &mp, &memh) != UCS_OK ||
      ucp_rkey_pack(ucp.context, memh, &rkey, &rkey_len) != UCS_OK ||
      ucp_worker_get_address(ucp.worker, &addr, &addr_len) != UCS_OK) {
    return std::fprintf(stderr, "serve: map, rkey or address failed\n"), 2;
  }
  const std::string tmp = std::string(addr_file) + ".tmp";
  {
    std::ofstream f(tmp);
    f << getpid() << ' ' << hex(addr, addr_len) << ' ' << reinterpret_cast<std::uintptr_t>(buf)
      << ' ' << hex(rkey, rkey_len) << '\n';
    if (!f) return std::fprintf(stderr, "serve: cannot write %s\n", tmp.c_str()), 2;
  }
  if (std::rename(tmp.c_str(), addr_file) != 0) return std::fprintf(stderr, "serve: rename\n"), 2;
  ucp_rkey_buffer_release(rkey);
  ucp_worker_release_address(ucp.worker, addr);

  // Receive forever; the check kills this process.
  for (;;) {
    Recv r;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv = [](void*, ucs_status_t, const ucp_tag_recv_info_t*, void* user) {
      static_cast<Recv*>(user)->done = true;
    };
    rp.user_data = &r;
    void* req = ucp_tag_recv_nbx(ucp.worker, rbuf, bytes, kTag, ~ucp_tag_t{0}, &rp);
    if (UCS_PTR_IS_ERR(req)) return std::fprintf(stderr, "serve: tag_recv failed\n"), 2;
    if (req == nullptr) continue;
    while (!r.done) ucp_worker_progress(ucp.worker);
    ucp_request_free(req);
  }
}

// --- The survivor
// ----------------------------------------------------------------------------------

struct PeerInfo {
  pid_t pid = -1;
  std::vector<unsigned char> address, rkey;
  std::uint64_t buffer = 0;
};

bool readPeer(const char* file, PeerInfo* info) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (access(file, R_OK) != 0) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::ifstream f(file);
  std::string addr, rkey;
  unsigned long long buffer = 0;
  f >> info->pid >> addr >> buffer >> rkey;
  if (!f) return false;
  info->address = unhex(addr);
  info->rkey = unhex(rkey);
  info->buffer = buffer;
  return true;
}

struct ErrorSeen {
  int calls = 0;
  ucp_ep_h ep = nullptr;
  ucs_status_t status = UCS_OK;
  Clock::time_point at{};
};

struct Op {
  int calls = 0;
  ucs_status_t status = UCS_OK;
  void* req = nullptr;
  std::size_t slot = 0;
  bool async = false;    // it was outstanding (not completed or refused at once)
  bool at_kill = false;  // it was still outstanding when the peer was killed
};

class Client {
 public:
  Client(Ucp* ucp, bool tag, std::size_t bytes) : ucp_(ucp), tag_(tag), bytes_(bytes) {}

  bool connect(const PeerInfo& peer, ErrorSeen* seen) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer.address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void* arg, ucp_ep_h e, ucs_status_t st) {
      auto* s = static_cast<ErrorSeen*>(arg);
      ++s->calls;
      s->ep = e;
      s->status = st;
      s->at = Clock::now();
    };
    ep.err_handler.arg = seen;
    if (ucp_ep_create(ucp_->worker, &ep, &ep_) != UCS_OK) return false;
    if (!tag_ && ucp_ep_rkey_unpack(ep_, peer.rkey.data(), &rkey_) != UCS_OK) return false;
    remote_ = peer.buffer;
    return true;
  }

  // Posts one operation from local buffer op->slot; one completed or refused at once (the endpoint
  // failed) has op->calls set.
  void post(Op* op) {
    unsigned char* local = local_.data() + op->slot * bytes_;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.user_data = op;
    p.cb.send = [](void*, ucs_status_t st, void* user) {
      auto* o = static_cast<Op*>(user);
      ++o->calls;
      o->status = st;
    };
    if (tag_) {
      op->req = ucp_tag_send_nbx(ep_, local, bytes_, kTag, &p);
    } else {
      std::memset(local, 0, bytes_);
      op->req = ucp_get_nbx(ep_, local, bytes_, remote_, rkey_, &p);
    }
    op->async = UCS_PTR_IS_PTR(op->req);
    if (op->req == nullptr) {  // completed in place
      ++op->calls;
      op->status = UCS_OK;
    } else if (UCS_PTR_IS_ERR(op->req)) {
      ++op->calls;
      op->status = UCS_PTR_STATUS(op->req);
      op->req = nullptr;
    }
  }

  // A get that completed OK must have brought the peer's pattern.
  bool bytesRight(const Op& op) const {
    if (tag_) return true;
    const unsigned char* local = local_.data() + op.slot * bytes_;
    for (std::size_t i = 0; i < bytes_; ++i) {
      if (local[i] != patternByte(i)) return false;
    }
    return true;
  }

  // Runs `total` operations with `window` outstanding; calls at_ok(n) after the n-th OK completion
  // (it may kill the peer) and stops posting once stop() is true. Returns false on a hang.
  template <typename AtOk, typename Stop>
  bool traffic(std::size_t window, std::size_t total, AtOk at_ok, Stop stop, std::vector<Op>* ops) {
    local_.assign(window * bytes_, 0x5a);
    ops->clear();
    ops->reserve(total);
    std::vector<long> busy(window, -1);
    std::size_t ok = 0;
    const auto end = Clock::now() + std::chrono::duration<double>(kGuardSeconds);
    for (;;) {
      ucp_worker_progress(ucp_->worker);
      bool any_busy = false;
      for (std::size_t s = 0; s < window; ++s) {
        if (busy[s] >= 0) {
          Op& op = (*ops)[static_cast<std::size_t>(busy[s])];
          if (op.calls == 0) {
            any_busy = true;
            continue;
          }
          if (op.req != nullptr) ucp_request_free(op.req);
          op.req = nullptr;
          busy[s] = -1;
          if (op.status == UCS_OK) {
            if (!bytesRight(op)) wrong_bytes_++;
            at_ok(++ok);
          }
        }
        if (ops->size() < total && !stop()) {
          ops->push_back(Op{});
          Op& op = ops->back();
          op.slot = s;
          post(&op);
          if (op.calls == 0) {
            busy[s] = static_cast<long>(ops->size() - 1);
            any_busy = true;
          } else if (op.status == UCS_OK) {
            at_ok(++ok);
          }
        }
      }
      if (!any_busy && (ops->size() >= total || stop())) return true;
      if (Clock::now() > end) return false;
    }
  }

  void closeEp(bool force) {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    rkey_ = nullptr;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(ep_, &p);
    if (UCS_PTR_IS_PTR(req)) {
      const auto end = Clock::now() + std::chrono::duration<double>(kGuardSeconds);
      while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < end) {
        ucp_worker_progress(ucp_->worker);
      }
      check(ucp_request_check_status(req) != UCS_INPROGRESS, "endpoint close completes");
      ucp_request_free(req);
    }
    ep_ = nullptr;
  }

  ucp_ep_h ep() const { return ep_; }
  std::size_t wrongBytes() const { return wrong_bytes_; }

 private:
  Ucp* ucp_;
  bool tag_;
  std::size_t bytes_;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  std::uint64_t remote_ = 0;
  std::vector<unsigned char> local_;
  std::size_t wrong_bytes_ = 0;
};

int client(const char* mode, const char* file1, const char* file2, std::size_t bytes) {
  const bool idle = std::strcmp(mode, "idle") == 0;
  const bool tag = idle || std::strcmp(mode, "tag") == 0;
  if (!tag && std::strcmp(mode, "get") != 0) {
    return std::fprintf(stderr, "mode: tag, get or idle\n"), 2;
  }
  Ucp ucp;
  if (!ucp.open()) return std::fprintf(stderr, "client: UCP init failed\n"), 2;
  PeerInfo p1, p2;
  if (!readPeer(file1, &p1)) return std::fprintf(stderr, "client: no peer 1 (%s)\n", file1), 2;

  // Phase 1: the peer dies under traffic (tag, get), or while the endpoint is idle (idle: no
  // request fails; the transport or UCP's keepalive must report it).
  constexpr std::size_t kWindow = 8, kKillAfter = 16, kMost = 100000;
  ErrorSeen seen1;
  Client c1(&ucp, tag, bytes);
  check(c1.connect(p1, &seen1),
        std::string("connect to peer 1 with peer error handling (") + mode + ")");
  Clock::time_point killed{};
  std::vector<Op> ops;
  auto killPeer = [&] {
    killed = Clock::now();
    kill(p1.pid, SIGKILL);
    for (Op& op : ops) op.at_kill = op.calls == 0;
  };
  if (idle) {
    const bool done = c1.traffic(
        kWindow, kKillAfter, [](std::size_t) {}, [] { return false; }, &ops);
    check(done && std::all_of(ops.begin(), ops.end(),
                              [](const Op& op) { return op.calls == 1 && op.status == UCS_OK; }),
          "16 tag sends to peer 1 completed OK");
    killPeer();
    const auto end = Clock::now() + std::chrono::duration<double>(kGuardSeconds);
    while (seen1.calls == 0 && Clock::now() < end) ucp_worker_progress(ucp.worker);
    check(seen1.calls > 0, "the idle endpoint's dead peer was reported within " +
                               std::to_string(static_cast<int>(kGuardSeconds)) + " s");
    const auto settle = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < settle) ucp_worker_progress(ucp.worker);
  } else {
    const bool done = c1.traffic(
        kWindow, kMost,
        [&](std::size_t ok) {
          if (ok == kKillAfter) killPeer();
        },
        [&] { return seen1.calls > 0; }, &ops);
    check(done, "every request on the dead peer completed (no hang within " +
                    std::to_string(static_cast<int>(kGuardSeconds)) + " s)");
    // Let late callbacks (a second error handler call would be one) arrive.
    const auto settle = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < settle) ucp_worker_progress(ucp.worker);
    std::size_t ok = 0, errors = 0, async_errors = 0, twice = 0;
    ucs_status_t first_error = UCS_OK;
    for (const Op& op : ops) {
      if (op.calls > 1) ++twice;
      if (op.calls == 0) continue;
      if (op.status == UCS_OK) {
        ++ok;
      } else {
        if (first_error == UCS_OK) first_error = op.status;
        ++errors;
        async_errors += op.async;
      }
    }
    const auto never = static_cast<std::size_t>(
        std::count_if(ops.begin(), ops.end(), [](const Op& op) { return op.calls == 0; }));
    std::printf(
        "peer 1: %zu requests, %zu OK, %zu failed (%s; %zu of them outstanding first), %zu "
        "never completed\n",
        ops.size(), ok, errors, ucs_status_string(first_error), async_errors, never);
    check(killed != Clock::time_point{}, "peer 1 was killed during traffic");
    check(never == 0 && twice == 0, "each request completed exactly once");
    if (tag) {
      // A rendezvous send needs its receiver: one outstanding at the kill cannot end OK unless the
      // peer fetched it before it died.
      check(async_errors > 0, "outstanding requests completed with an error");
    } else {
      // The target of a get is passive: its NIC may serve every outstanding read before the dead
      // process's device context is torn down, and such a get rightly ends OK (with the right
      // bytes, checked below). What is asserted is that none hangs and each ends once.
      std::size_t at_kill_ok = 0, at_kill_err = 0;
      for (const Op& op : ops) {
        if (op.at_kill && op.calls > 0) (op.status == UCS_OK ? at_kill_ok : at_kill_err)++;
      }
      std::printf("gets outstanding at the kill: %zu ended OK, %zu with an error\n", at_kill_ok,
                  at_kill_err);
    }
    check(c1.wrongBytes() == 0, "gets that completed OK brought the right bytes");
    // Whatever raced the kill, the failed endpoint now refuses: a request posted after its error
    // was reported ends with an error, at once or through its callback, and never OK.
    Op late;
    late.slot = 0;
    c1.post(&late);
    const auto end = Clock::now() + std::chrono::duration<double>(kGuardSeconds);
    while (late.calls == 0 && Clock::now() < end) ucp_worker_progress(ucp.worker);
    if (late.req != nullptr) ucp_request_free(late.req);
    check(late.calls == 1 && UCS_STATUS_IS_ERR(late.status),
          std::string("a request posted after the error ends with an error: ") +
              (late.calls == 0 ? "never completed" : ucs_status_string(late.status)));
  }
  check(seen1.calls == 1, "the error callback ran once (" + std::to_string(seen1.calls) + ")");
  check(seen1.ep == c1.ep(), "the error callback named the endpoint to peer 1");
  check(UCS_STATUS_IS_ERR(seen1.status),
        std::string("the error callback's status is an error: ") + ucs_status_string(seen1.status));
  if (seen1.calls > 0 && killed != Clock::time_point{}) {
    std::printf("[ detected ] %s %.3f s after SIGKILL\n", ucs_status_string(seen1.status),
                std::chrono::duration<double>(seen1.at - killed).count());
  }
  c1.closeEp(true);

  // Phase 2: a new peer, on the same worker.
  if (!readPeer(file2, &p2)) return std::fprintf(stderr, "client: no peer 2 (%s)\n", file2), 2;
  ErrorSeen seen2;
  Client c2(&ucp, tag, bytes);
  check(c2.connect(p2, &seen2), "connect to a new peer after the failure");
  const bool done2 = c2.traffic(
      kWindow, 64, [](std::size_t) {}, [] { return false; }, &ops);
  std::size_t ok2 = 0;
  for (const Op& op : ops) ok2 += op.calls == 1 && op.status == UCS_OK;
  check(done2 && ok2 == 64,
        "64 requests to the new peer completed OK (" + std::to_string(ok2) + ")");
  check(c2.wrongBytes() == 0, "gets from the new peer brought the right bytes");
  check(seen2.calls == 0 && seen1.calls == 1, "no error callback for the new peer");
  c2.closeEp(false);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "serve") == 0) {
    return serve(argv[2], std::strtoull(argv[3], nullptr, 0));
  }
  if (argc == 6 && std::strcmp(argv[1], "client") == 0) {
    return client(argv[2], argv[3], argv[4], std::strtoull(argv[5], nullptr, 0));
  }
  std::fprintf(stderr,
               "usage: gmd_ucp_fault serve ADDRFILE BYTES\n"
               "       gmd_ucp_fault client tag|get|idle ADDRFILE1 ADDRFILE2 BYTES\n");
  return 2;
}
