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

// How long the thread waits for a requester that connected to send its handshake.
constexpr int kHandshakeTimeoutSec = 10;

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
      if (fds[i].revents == 0) continue;
      char byte;
      const ssize_t r = recv(fds[i].fd, &byte, 1, MSG_DONTWAIT);
      if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR))) continue;  // not a close
      closeConn(i - 2);
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
  timeval tv{kHandshakeTimeoutSec, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  std::uint8_t buf[kHandshakeSize];
  Handshake request;
  std::size_t got = 0;
  if (socketIo(fd, IoDirection::kRecv, buf, sizeof(buf), &got) != IoResult::kDone) {
    ucs_diag("gmd_rc %s: a peer connected but sent no handshake", name_.c_str());
    close(fd);
    return;
  }
  Handshake reply = localHandshake(port_, nullptr, 0);
  reply.status = 1;
  std::string why;
  ibv_qp* qp = nullptr;
  if (const ucs_status_t st = unpackHandshake(buf, &request); st != UCS_OK) {
    why = "malformed handshake";
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
  packHandshake(reply, buf);
  std::size_t sent = 0;
  if (socketIo(fd, IoDirection::kSend, buf, sizeof(buf), &sent) != IoResult::kDone ||
      reply.status != 0) {
    if (qp != nullptr) handoff_->closed(qp);
    close(fd);
    return;
  }
  try {
    conns_.push_back({fd, qp});
  } catch (...) {
    handoff_->closed(qp);
    close(fd);
  }
}

void Listener::closeConn(std::size_t i) noexcept {
  Conn c = conns_[i];
  conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
  handoff_->closed(c.qp);  // the iface drains and destroys it
  close(c.fd);
}

}  // namespace gmd::md::rc
