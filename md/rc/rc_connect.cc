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
namespace {

// Where a handshake exchange stands after socketIo returned `r`, anything but kDone.
Connector::Step unfinished(IoResult r, const char** why) {
  if (r == IoResult::kAgain) return Connector::Step::kWaiting;
  *why = r == IoResult::kClosed ? "the peer closed the connection" : std::strerror(errno);
  return Connector::Step::kFailed;
}

}  // namespace

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

ucs_status_t Connector::start(const IfaceAddress& peer, const Handshake& request,
                              double timeout_seconds) noexcept {
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
  packHandshake(request, io_buf_);
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(timeout_seconds));
  return UCS_OK;
}

short Connector::events() const noexcept { return request_sent_ ? POLLIN : POLLOUT; }

Connector::Step Connector::step(Handshake* reply, const char** why) noexcept {
  if (!request_sent_) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      *why = std::strerror(err);
      return Step::kFailed;
    }
    if (const IoResult r = socketIo(fd_, IoDirection::kSend, io_buf_, kHandshakeSize, &io_done_);
        r != IoResult::kDone) {
      return unfinished(r, why);
    }
    request_sent_ = true;
    io_done_ = 0;
    return Step::kWaiting;
  }
  if (const IoResult r = socketIo(fd_, IoDirection::kRecv, io_buf_, kHandshakeSize, &io_done_);
      r != IoResult::kDone) {
    return unfinished(r, why);
  }
  if (unpackHandshake(io_buf_, reply) != UCS_OK) {
    *why = "malformed handshake reply";
    return Step::kFailed;
  }
  if (reply->status != 0) {
    *why = "the peer refused the connection";
    return Step::kFailed;
  }
  return Step::kReplied;
}

void Connector::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace gmd::md::rc
