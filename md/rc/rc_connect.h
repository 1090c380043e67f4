// The requesting side of a gmd_rc connection (md/rc/rc_listener.h is the accepting side), and the
// socket I/O both sides use.
//
// A Connector belongs to one endpoint: a non-blocking TCP connect to the peer iface's listener, our
// handshake out, the peer's handshake back (md/rc/rc_wire.h). The iface polls it from progress and,
// when it reports kReplied, brings the endpoint's QP to RTR/RTS with the reply. The socket stays open
// for the endpoint's lifetime: the peer keeps its passive QP exactly as long.
//
// Thread safety: a Connector is used by its iface's thread only (UCT's one thread per iface);
// socketIo is reentrant.
#pragma once

#include <ucs/type/status.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

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

class Connector {
 public:
  enum class Step { kWaiting, kReplied, kFailed };

  Connector() = default;
  ~Connector() { close(); }
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Opens the socket and starts the connect; `request` is sent once it is up. On failure logs (error
  // level) and returns UCS_ERR_IO_ERROR (no socket) or UCS_ERR_UNREACHABLE (connect refused at once).
  ucs_status_t start(const IfaceAddress& peer, const Handshake& request,
                     double timeout_seconds) noexcept;

  int fd() const noexcept { return fd_; }
  // What to poll the socket for now.
  short events() const noexcept;
  bool expired(std::chrono::steady_clock::time_point now) const noexcept { return now > deadline_; }

  // Advances the exchange after poll() reported the socket ready. kReplied: the peer's accepted
  // handshake is in *reply. kFailed: *why says what went wrong (a static string or strerror's).
  Step step(Handshake* reply, const char** why) noexcept;

  // Closes the socket (the peer then destroys its passive QP).
  void close() noexcept;

 private:
  int fd_ = -1;
  bool request_sent_ = false;
  std::size_t io_done_ = 0;
  std::uint8_t io_buf_[kHandshakeSize] = {};
  std::chrono::steady_clock::time_point deadline_{};
};

}  // namespace gmd::md::rc
