#include "md/rc/rc_connect.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gmd::md::rc {

IoResult socketIo(int fd, IoDirection dir, void* buf, std::size_t len, std::size_t* done) noexcept {
  auto* p = static_cast<std::uint8_t*>(buf);
  while (*done < len) {
    const ssize_t n = dir == IoDirection::kSend
                          ? send(fd, p + *done, len - *done, MSG_NOSIGNAL)
                          : recv(fd, p + *done, len - *done, 0);
    if (n > 0) {
      *done += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return IoResult::kClosed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return IoResult::kAgain;
    } else {
      return IoResult::kError;
    }
  }
  return IoResult::kDone;
}

ucs_status_t Link::start(const IfaceAddress& peer) noexcept {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    ucs_error("gmd_rc: socket: %s", std::strerror(errno));
    return UCS_ERR_IO_ERROR;
  }
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = peer.ipv4_be;
  sa.sin_port = peer.port_be;
  if (connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &peer.ipv4_be, ip, sizeof(ip));
    ucs_error("gmd_rc: cannot connect to %s:%u: %s", ip, ntohs(peer.port_be),
              std::strerror(errno));
    close();
    return UCS_ERR_UNREACHABLE;
  }
  return UCS_OK;
}

short Link::events() const noexcept {
  if (!connected_) return POLLOUT;
  return static_cast<short>(POLLIN | (out_done_ < out_.size() ? POLLOUT : 0));
}

bool Link::queue(const Handshake& frame) noexcept {
  try {
    if (out_done_ == out_.size()) {  // all sent: start over
      out_.clear();
      out_done_ = 0;
    }
    const std::size_t at = out_.size();
    out_.resize(at + kHandshakeSize);
    packHandshake(frame, out_.data() + at);
  } catch (...) {
    return false;
  }
  if (!connected_) return true;
  const IoResult r = socketIo(fd_, IoDirection::kSend, out_.data(), out_.size(), &out_done_);
  return r == IoResult::kDone || r == IoResult::kAgain;
}

bool Link::step(Handshake* replies, std::size_t* nreplies, const char** why) noexcept {
  *nreplies = 0;
  if (!connected_) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      *why = std::strerror(err);
      return false;
    }
    connected_ = true;
  }
  if (hasOutput()) {
    const IoResult r = socketIo(fd_, IoDirection::kSend, out_.data(), out_.size(), &out_done_);
    if (r == IoResult::kClosed || r == IoResult::kError) {
      *why = r == IoResult::kClosed ? "the peer closed the connection" : std::strerror(errno);
      return false;
    }
  }
  while (*nreplies < kMaxRepliesPerStep) {
    const IoResult r = socketIo(fd_, IoDirection::kRecv, in_, kHandshakeSize, &in_done_);
    if (r == IoResult::kAgain) break;
    if (r != IoResult::kDone) {
      *why = r == IoResult::kClosed ? "the peer closed the connection" : std::strerror(errno);
      return false;
    }
    in_done_ = 0;
    Handshake& h = replies[*nreplies];
    if (unpackHandshake(in_, &h) != UCS_OK || h.kind != FrameKind::kConnect) {
      *why = "malformed handshake reply";
      return false;
    }
    ++*nreplies;
  }
  return true;
}

void Link::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  connected_ = false;
}

}  // namespace gmd::md::rc
