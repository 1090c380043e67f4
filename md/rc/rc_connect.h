// The requesting side of gmd_rc connections (md/rc/rc_listener.h is the accepting side), and the
// socket I/O both sides use.
//
// A Link is the TCP connection from an iface to one peer iface's listener, shared by every endpoint
// between the two: a non-blocking connect, then frames (md/rc/rc_wire.h) both ways. Each endpoint
// sends its handshake (kConnect) and the replies come back in the order of the requests; when an
// endpoint goes while the link stays, a kRelease frame tells the peer to destroy the endpoint's
// passive QP; closing the link releases all of them. The link stays open while endpoints use it,
// and the peer's kernel closing it tells that the peer's process or iface is gone
// (md/rc/rc_peer_watch.h). So a process holds one descriptor per peer iface it talks to, not one
// per endpoint (docs/transport.md, "Scale").
//
// Thread safety: a Link is used by its iface's thread only (UCT's one thread per iface); socketIo
// is reentrant.
#pragma once

#include <ucs/type/status.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "md/rc/rc_wire.h"

namespace gmd::md::rc {

enum class IoDirection { kSend, kRecv };
enum class IoResult {
  kDone,    // all `len` bytes moved
  kAgain,   // the socket would block (non-blocking) or its SO_SNDTIMEO/SO_RCVTIMEO passed
  kClosed,  // the peer closed the connection
  kError,   // errno says why
};

// Moves bytes [*done, len) of `buf` over `fd`, advancing *done; retries on EINTR. Sends never raise
// SIGPIPE.
IoResult socketIo(int fd, IoDirection dir, void* buf, std::size_t len, std::size_t* done) noexcept;

class Link {
 public:
  Link() = default;
  ~Link() { close(); }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Opens the socket and starts the connect. On failure logs (error level) and returns
  // UCS_ERR_IO_ERROR (no socket) or UCS_ERR_UNREACHABLE (connect refused at once).
  ucs_status_t start(const IfaceAddress& peer) noexcept;

  int fd() const noexcept { return fd_; }
  bool connected() const noexcept { return connected_; }
  // What to poll the socket for now: POLLOUT until connected and while frames wait to go out,
  // POLLIN once connected.
  short events() const noexcept;
  // Whether there is anything to do: frames to send, or replies awaited (the caller says).
  bool busy(bool awaiting_replies) const noexcept {
    return !connected_ || hasOutput() || awaiting_replies;
  }

  // Queues `frame` and, once connected, sends what the socket takes now; false when out of memory
  // or the link broke (the next step() says why).
  bool queue(const Handshake& frame) noexcept;
  bool hasOutput() const noexcept { return out_done_ < out_.size(); }

  // After poll() reported the socket ready: completes the connect, sends queued frames, reads
  // replies into replies[0, *nreplies) in order (at most kMaxRepliesPerStep; more wait for the
  // next step). false: the link failed, *why says why (a static string or strerror's).
  static constexpr std::size_t kMaxRepliesPerStep = 32;
  bool step(Handshake* replies, std::size_t* nreplies, const char** why) noexcept;

  // Closes the socket (the peer then destroys the passive QPs of every endpoint of this link).
  void close() noexcept;

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::vector<std::uint8_t> out_;  // queued frames; out_[0, out_done_) sent
  std::size_t out_done_ = 0;
  std::uint8_t in_[kHandshakeSize] = {};
  std::size_t in_done_ = 0;
};

class Ep;

// An iface's record of one link: the endpoints using it (connecting or connected) and those whose
// reply is due, in the order of their requests (nullptr: the endpoint left before its reply).
struct PeerLink {
  Link link;
  std::uint64_t key = 0;  // the peer's IPv4 address and port
  std::vector<Ep*> eps;
  std::deque<Ep*> waiting;
  bool watched = false;  // in the iface's PeerWatch (once connected)
};

}  // namespace gmd::md::rc
