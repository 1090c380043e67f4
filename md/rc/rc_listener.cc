#include "md/rc/rc_listener.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "md/rc/rc_connect.h"
#include "md/rc/rc_qp.h"
#include "md/rc/rc_recv.h"

namespace gmd::md::rc {
namespace {

// How long the thread waits for the rest of a frame that has begun to arrive, and for an answer
// to leave.
constexpr int kFrameTimeoutSec = 10;

}  // namespace

Listener::Listener(std::string name, ibv_pd* pd, const QpQueues& queues, Handoff* handoff,
                   const PortInfo& port, const QpSettings& s)
    : name_(std::move(name)), pd_(pd), queues_(queues), handoff_(handoff), port_(port),
      settings_(s) {}

Listener::~Listener() {
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
      ucs_warn("gmd_rc %s: cannot wake the listener thread: %s", name_.c_str(),
               std::strerror(errno));
    }
    thread_.join();
  }
  while (!conns_.empty()) closeConn(conns_.size() - 1);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

ucs_status_t Listener::start(std::uint16_t* port_be) noexcept {
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (wake_fd_ < 0 || listen_fd_ < 0) {
    ucs_error("gmd_rc %s: cannot create the connection listener: %s", name_.c_str(),
              std::strerror(errno));
    return UCS_ERR_IO_ERROR;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 128) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ucs_error("gmd_rc %s: cannot listen for connections: %s", name_.c_str(), std::strerror(errno));
    return UCS_ERR_IO_ERROR;
  }
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    ucs_error("gmd_rc %s: cannot start the listener thread", name_.c_str());
    return UCS_ERR_NO_RESOURCE;
  }
  *port_be = addr.sin_port;
  return UCS_OK;
}

void Listener::run() noexcept {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const Conn& c : conns_) fds.push_back({c.fd, POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      ucs_error("gmd_rc %s: listener poll: %s", name_.c_str(), std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    // Connections first (indexes shift when one closes), newest last.
    for (std::size_t i = fds.size(); i-- > 2;) {
      if (fds[i].revents != 0 && !serve(conns_[i - 2])) closeConn(i - 2);
    }
    if (fds[1].revents & POLLIN) accept();
  }
}

void Listener::accept() noexcept {
  const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
      ucs_warn("gmd_rc %s: accept: %s", name_.c_str(), std::strerror(errno));
    }
    return;
  }
  timeval tv{kFrameTimeoutSec, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  try {
    conns_.push_back({fd, {}});
  } catch (...) {
    close(fd);
  }
}

bool Listener::serve(Conn& c) noexcept {
  std::uint8_t buf[kHandshakeSize];
  std::size_t got = 0;
  switch (socketIo(c.fd, IoDirection::kRecv, buf, sizeof(buf), &got)) {
    case IoResult::kDone:
      break;
    case IoResult::kClosed:
      return false;  // the peer's endpoints, process or iface are gone
    case IoResult::kAgain:
      ucs_diag("gmd_rc %s: a peer sent %zu bytes of a frame and stopped", name_.c_str(), got);
      return false;
    case IoResult::kError:
      return false;  // reset: as closed
  }
  Handshake frame;
  if (const ucs_status_t st = unpackHandshake(buf, &frame); st != UCS_OK) {
    ucs_error("gmd_rc %s: closing a connection that sent a malformed frame", name_.c_str());
    return false;
  }
  if (frame.kind == FrameKind::kConnect) return connectFrame(c, frame);
  // A release: the endpoint is gone, its passive QP goes to the iface to drain and destroy.
  for (std::size_t i = 0; i < c.qps.size(); ++i) {
    if (c.qps[i].requester_qpn == frame.qpn) {
      handoff_->closed(c.qps[i].qp);
      c.qps[i] = c.qps.back();
      c.qps.pop_back();
      return true;
    }
  }
  ucs_debug("gmd_rc %s: release of QP 0x%x, which has no passive QP here", name_.c_str(),
            frame.qpn);
  return true;
}

bool Listener::connectFrame(Conn& c, const Handshake& request) noexcept {
  Handshake reply = localHandshake(port_, nullptr, 0);
  reply.status = 1;
  std::string why;
  ibv_qp* qp = nullptr;
  try {
    c.qps.reserve(c.qps.size() + 1);
  } catch (...) {
    why = "out of memory";
  }
  if (!why.empty()) {
    // why says it
  } else if (request.ethernet != port_.ethernet) {
    why = "link layers differ (RoCE vs InfiniBand)";
  } else if ((qp = createQp(pd_, queues_, settings_, RecvPath::kPeerSendQueue, 0)) == nullptr) {
    why = std::string("ibv_create_qp: ") + std::strerror(errno);
  } else {
    const std::uint32_t psn = randomPsn();
    if (connectQp(qp, port_, settings_, true, request, psn, &why) != UCS_OK) {
      // why says it
    } else if (!handoff_->accepted(qp)) {  // before the reply: no message can precede it
      why = "out of memory";
    } else {
      reply = localHandshake(port_, qp, psn);
    }
  }
  if (reply.status != 0) {
    ucs_error("gmd_rc %s: refusing a connection: %s", name_.c_str(), why.c_str());
    if (qp != nullptr) ibv_destroy_qp(qp);
    qp = nullptr;
  }
  std::uint8_t buf[kHandshakeSize];
  packHandshake(reply, buf);
  std::size_t sent = 0;
  if (qp != nullptr) c.qps.push_back({request.qpn, qp});  // room reserved above
  return socketIo(c.fd, IoDirection::kSend, buf, sizeof(buf), &sent) == IoResult::kDone;
}

void Listener::closeConn(std::size_t i) noexcept {
  Conn c = std::move(conns_[i]);
  conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
  for (const Passive& p : c.qps) handoff_->closed(p.qp);  // the iface drains and destroys them
  close(c.fd);
}

}  // namespace gmd::md::rc
