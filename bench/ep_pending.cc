// gmd_ep_pending: many endpoints from one iface to one peer iface, each kept full by a pending
// request, for any UCT transport (bench/pending_bench.sh runs it for gmd_rc and rc_verbs in the
// same VM run; docs/transport.md, "Pending requests on many endpoints", has the figures).
//
//   gmd_ep_pending TL SERVER_DEV CLIENT_DEV [EPS [ROUNDS]]   (default 16 endpoints, 10000 rounds)
//
// Opens TL on both devices (one worker), makes EPS endpoints from the client iface to the server
// iface (bench/uct_pair.h), sends one 8-byte-header active message over each and waits for them
// (connected), then fills every endpoint with am_short until it is refused and gives it a pending
// request. Dispatched, a request sends one am_short and stays queued (UCS_INPROGRESS; refused, it
// returns UCS_ERR_NO_RESOURCE and waits for its next turn). A round is progress until some
// request has sent; ROUNDS rounds are timed. Prints one line:
//
//   ep_pending tl=TL eps=N rounds=R seconds=S sends=T min=A max=B filled=F
//
// sends: messages the pending requests sent, min/max: the least and most any one endpoint's
// request sent, filled: messages sent before the requests were queued. Every message is waited for
// at the server before the endpoints go. Exit status 0 on success, 1 with a message on stderr
// otherwise (also when a round makes no progress within 60 s). Single-threaded.
#include <uct/api/uct.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
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

constexpr std::uint8_t kAmId = 6;
constexpr double kRoundTimeoutSecs = 60;

std::uint64_t received = 0;

ucs_status_t onMessage(void*, void*, size_t, unsigned) {
  ++received;
  return UCS_OK;
}

struct Repeater {
  uct_pending_req_t uct;  // first: the callback casts back
  uct_ep_h ep = nullptr;
  std::uint64_t sent = 0;
};

std::uint64_t total = 0;

ucs_status_t repeat(uct_pending_req_t* self) {
  auto* r = reinterpret_cast<Repeater*>(self);
  const ucs_status_t st = uct_ep_am_short(r->ep, kAmId, 0, nullptr, 0);
  if (st != UCS_OK) return st;
  ++r->sent;
  ++total;
  return UCS_INPROGRESS;
}

template <typename Done>
void progressUntil(uct_worker_h worker, Done done, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    uct_worker_progress(worker);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kRoundTimeoutSecs) {
      die(std::string("no progress within 60 s: ") + what);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr, "usage: gmd_ep_pending TL SERVER_DEV CLIENT_DEV [EPS [ROUNDS]]\n");
    return 1;
  }
  const char* tl = argv[1];
  const std::size_t n = argc >= 5 ? std::strtoul(argv[4], nullptr, 10) : 16;
  const long rounds = argc >= 6 ? std::strtol(argv[5], nullptr, 10) : 10000;
  if (n == 0 || rounds <= 0) die("EPS and ROUNDS must be positive");
  TwoIfaces uct = openTwoIfaces(tl, argv[2], argv[3]);
  uct_worker_h worker = uct.worker;
  const Side& server = uct.server;
  const Side& client = uct.client;
  ucs_status_t st = UCS_OK;
  st = uct_iface_set_am_handler(server.iface, kAmId, onMessage, nullptr, 0);
  if (st != UCS_OK) die("uct_iface_set_am_handler", st);
  if (!(client.attr.cap.flags & UCT_IFACE_FLAG_PENDING)) die(std::string(tl) + " has no pending");

  std::vector<Pair> pairs(n);
  for (Pair& p : pairs) {
    p = connectPair(server, client);
    progressUntil(
        worker,
        [&] {
          return (st = uct_ep_am_short(p.client, kAmId, 0, nullptr, 0)) != UCS_ERR_NO_RESOURCE;
        },
        "connecting");
    if (st != UCS_OK) die("uct_ep_am_short", st);
  }
  progressUntil(
      worker, [&] { return received == n; }, "first messages");

  std::uint64_t filled = 0;
  for (Pair& p : pairs) {
    while ((st = uct_ep_am_short(p.client, kAmId, 0, nullptr, 0)) == UCS_OK) ++filled;
    if (st != UCS_ERR_NO_RESOURCE) die("uct_ep_am_short (filling)", st);
  }
  std::vector<Repeater> reqs(n);
  for (std::size_t i = 0; i < n; ++i) {
    reqs[i].uct.func = repeat;
    reqs[i].ep = pairs[i].client;
    if ((st = uct_ep_pending_add(pairs[i].client, &reqs[i].uct, 0)) != UCS_OK) {
      die("uct_ep_pending_add", st);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  for (long r = 0; r < rounds; ++r) {
    const std::uint64_t before = total;
    progressUntil(
        worker, [&] { return total > before; }, "a round");
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (Pair& p : pairs) uct_ep_pending_purge(p.client, nullptr, nullptr);
  std::uint64_t lo = std::numeric_limits<std::uint64_t>::max(), hi = 0;
  for (const Repeater& r : reqs) {
    lo = std::min(lo, r.sent);
    hi = std::max(hi, r.sent);
  }
  std::printf(
      "ep_pending tl=%s eps=%zu rounds=%ld seconds=%.3f sends=%llu min=%llu max=%llu "
      "filled=%llu\n",
      tl, n, rounds, secs, static_cast<unsigned long long>(total),
      static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi),
      static_cast<unsigned long long>(filled));
  std::fflush(stdout);
  const std::uint64_t expected = n + filled + total;
  const auto wait = std::chrono::steady_clock::now();
  while (received != expected) {
    uct_worker_progress(worker);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - wait).count() >
        kRoundTimeoutSecs) {
      die("within 60 s, " + std::to_string(received) + " of " + std::to_string(expected) +
          " messages arrived");
    }
  }

  // Every message has arrived: the endpoints go without a flush (rc_verbs' flush of an endpoint
  // whose pending requests were purged did not complete here).
  for (const Pair& p : pairs) {
    for (uct_ep_h ep : {p.client, p.server}) {
      if (ep != nullptr) uct_ep_destroy(ep);
    }
  }
  closeTwoIfaces(&uct);
  return 0;
}
