// gmd_ep_scale: endpoint creation rate and the memory and descriptors each endpoint costs, for any
// UCT transport, in one process that holds both ends (bench/ep_bench.sh runs it for gmd_rc and
// rc_verbs in the same VM run; docs/transport.md has the figures).
//
//   gmd_ep_scale TL SERVER_DEV CLIENT_DEV [N]     (N endpoints, default 512)
//
// Opens TL on both devices (the server and client ifaces share one worker), then creates N
// endpoints from the client iface to the server iface and sends one 8-byte active message over
// each; an endpoint counts once the server has received its message. For a connect-to-iface
// transport (gmd_rc) that is uct_ep_create with the server's iface address; for a connect-to-ep one
// (rc_verbs) the pair of endpoints, each connected to the other's address (what UCP's wire-up does
// for it). Before the timing, one endpoint (pair) is made and used, so per-peer costs (gmd_rc's
// connection to the peer iface, the first QP's buffers) are in the baseline and the figures are
// per additional endpoint. Prints one line:
//
//   ep_scale tl=TL eps=N seconds=S rate=R/s rss_kib=K rss_kib_per_ep=K pinned_kib=P
//   pinned_kib_per_ep=P fds_before=F fds_after=F
//
// rss is the process's resident set and pinned its VmPin (both from /proc/self/status; VmPin is
// memory the RDMA driver pinned for queues and registrations), fds the open descriptors. Both ends
// are in the process, so each figure covers an endpoint and its peer's side. Exit status 0 on
// success, 1 with a message on stderr otherwise. Single-threaded: the worker is
// UCS_THREAD_MODE_SINGLE and only main() touches it.
#include <fcntl.h>
#include <sys/resource.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/uct_pair.h"

namespace {

using gmd::bench::connectPair;
using gmd::bench::die;
using gmd::bench::closeTwoIfaces;
using gmd::bench::openTwoIfaces;
using gmd::bench::Pair;
using gmd::bench::Side;
using gmd::bench::TwoIfaces;

constexpr std::uint8_t kAmId = 5;
constexpr std::size_t kDefaultEps = 512;
constexpr double kTimeoutSecs = 300;

// Open descriptors: those below the descriptor limit that fcntl knows.
int openFds() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return -1;
  int n = 0;
  for (rlim_t fd = 0; fd < lim.rlim_cur && fd < 65536; ++fd) {
    n += fcntl(static_cast<int>(fd), F_GETFD) != -1;
  }
  return n;
}

// A "Vm...:" figure of /proc/self/status in KiB (VmRSS: resident, VmPin: pinned); -1 if absent.
long statusKiB(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  const std::size_t len = std::strlen(field);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
      kib = std::strtol(line + len + 1, nullptr, 10);
    }
  }
  std::fclose(f);
  return kib;
}

std::size_t received = 0;

ucs_status_t onMessage(void*, void*, size_t, unsigned) {
  ++received;
  return UCS_OK;
}

class Bench {
 public:
  Bench(uct_worker_h worker, Side& server, Side& client)
      : worker_(worker), server_(server), client_(client) {}

  Pair connect() { return connectPair(server_, client_); }

  // One active message from the client end; retried (progressing) while out of resources.
  void send(const Pair& p) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const ucs_status_t st = uct_ep_am_short(p.client, kAmId, 0, nullptr, 0);
      if (st == UCS_OK) return;
      if (st != UCS_ERR_NO_RESOURCE) die("uct_ep_am_short", st);
      progressOrDie(start);
    }
  }

  void waitReceived(std::size_t n) {
    const auto start = std::chrono::steady_clock::now();
    while (received < n) progressOrDie(start);
  }

  void close(const Pair& p) {
    for (uct_ep_h ep : {p.client, p.server}) {
      if (ep == nullptr) continue;
      const auto start = std::chrono::steady_clock::now();
      ucs_status_t st;
      while ((st = uct_ep_flush(ep, 0, nullptr)) == UCS_INPROGRESS || st == UCS_ERR_NO_RESOURCE) {
        progressOrDie(start);
      }
      uct_ep_destroy(ep);
    }
  }

 private:
  void progressOrDie(std::chrono::steady_clock::time_point start) {
    uct_worker_progress(worker_);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kTimeoutSecs) {
      die("no progress within " + std::to_string(static_cast<int>(kTimeoutSecs)) + " s");
    }
  }

  uct_worker_h worker_;
  Side& server_;
  Side& client_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::fprintf(stderr, "usage: gmd_ep_scale TL SERVER_DEV CLIENT_DEV [N]\n");
    return 1;
  }
  const char* tl = argv[1];
  const std::size_t n = argc == 5 ? std::strtoul(argv[4], nullptr, 10) : kDefaultEps;
  if (n == 0) die("N must be positive");
  TwoIfaces uct = openTwoIfaces(tl, argv[2], argv[3]);
  uct_worker_h worker = uct.worker;
  Side& server = uct.server;
  Side& client = uct.client;
  ucs_status_t st = UCS_OK;
  st = uct_iface_set_am_handler(server.iface, kAmId, onMessage, nullptr, 0);
  if (st != UCS_OK) die("uct_iface_set_am_handler", st);
  if (client.attr.max_num_eps < n + 1) {
    std::fprintf(stderr, "gmd_ep_scale: note: %s reports max_num_eps %zu, fewer than %zu\n", tl,
                 client.attr.max_num_eps, n + 1);
  }
  Bench bench(worker, server, client);

  // The baseline: one endpoint made and used.
  const Pair first = bench.connect();
  bench.send(first);
  bench.waitReceived(1);
  const int fds_before = openFds();
  const long rss_before = statusKiB("VmRSS");
  const long pin_before = statusKiB("VmPin");

  const auto start = std::chrono::steady_clock::now();
  std::vector<Pair> pairs;
  pairs.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    pairs.push_back(bench.connect());
    bench.send(pairs.back());
  }
  bench.waitReceived(n + 1);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int fds_after = openFds();
  const long rss = statusKiB("VmRSS") - rss_before;
  const long pin = statusKiB("VmPin") - pin_before;
  std::printf(
      "ep_scale tl=%s eps=%zu seconds=%.3f rate=%.0f/s rss_kib=%ld rss_kib_per_ep=%.1f "
      "pinned_kib=%ld pinned_kib_per_ep=%.1f fds_before=%d fds_after=%d\n",
      tl, n, secs, n / secs, rss, static_cast<double>(rss) / n, pin, static_cast<double>(pin) / n,
      fds_before, fds_after);
  std::fflush(stdout);

  for (const Pair& p : pairs) bench.close(p);
  bench.close(first);
  closeTwoIfaces(&uct);
  return 0;
}
