#include "md/rc/rc_peer_watch.h"

#include <sys/epoll.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gmd::md::rc {

PeerWatch::~PeerWatch() {
  if (epfd_ >= 0) close(epfd_);
}

ucs_status_t PeerWatch::init(const char* name) noexcept {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) {
    ucs_error("gmd_rc %s: epoll_create1: %s", name, std::strerror(errno));
    return UCS_ERR_IO_ERROR;
  }
  return UCS_OK;
}

bool PeerWatch::add(int fd, void* owner) noexcept {
  epoll_event ev{};
  ev.events = EPOLLRDHUP;  // EPOLLHUP and EPOLLERR are always reported
  ev.data.ptr = owner;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    // Not fatal: the endpoint still fails through its QP's retries.
    ucs_diag("gmd_rc: cannot watch a side channel: %s", std::strerror(errno));
    return false;
  }
  ++watched_;
  return true;
}

void PeerWatch::remove(int fd) noexcept {
  if (fd >= 0 && epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr) == 0) --watched_;
}

bool PeerWatch::due() noexcept {
  if (watched_ == 0) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_) return false;
  next_ = now + kCheckInterval;
  return true;
}

unsigned PeerWatch::collect(void** owners) noexcept {
  epoll_event ev[kBatch];
  const int n = epoll_wait(epfd_, ev, static_cast<int>(kBatch), 0);
  if (n <= 0) return 0;
  for (int i = 0; i < n; ++i) owners[i] = ev[i].data.ptr;
  return static_cast<unsigned>(n);
}

}  // namespace gmd::md::rc
