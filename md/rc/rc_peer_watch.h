// Peer liveness from the side channel: every gmd_rc iface keeps a TCP connection open to each peer
// iface it has endpoints to (md/rc/rc_connect.h, Link), on which the peer writes nothing but
// handshake replies. When the peer's
// process dies or its iface closes, its kernel closes the connection: a FIN (or RST) arrives at once,
// long before RC retransmissions would give up. PeerWatch is an epoll set of those sockets that the
// iface checks from progress, at most once per kCheckInterval (one epoll_wait(0) system call), so
// the fast path pays a clock read.
//
// A peer whose host vanished sends nothing; its endpoints fail through the RC QP's retries instead
// (UCX_GMD_RC_TIMEOUT * (UCX_GMD_RC_RETRY_COUNT + 1), see docs/transport.md).
//
// Thread safety: one iface's thread (UCT's one thread per iface).
#pragma once

#include <ucs/type/status.h>

#include <chrono>
#include <cstddef>

namespace gmd::md::rc {

class PeerWatch {
 public:
  static constexpr std::chrono::milliseconds kCheckInterval{1};

  PeerWatch() = default;
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Creates the epoll set; logs (error level) and returns UCS_ERR_IO_ERROR on failure.
  ucs_status_t init(const char* name) noexcept;
  // Watches connected socket `fd` for the peer closing it; `owner` comes back from check(). Closing
  // `fd` stops the watch (epoll forgets a closed socket). false: not watched (logged at diag
  // level).
  bool add(int fd, void* owner) noexcept;
  // Stops watching `fd` (before it is closed, or once its closing was reported).
  void remove(int fd) noexcept;
  // Whether a check is due (the interval passed since the last one); cheap.
  bool due() noexcept;
  // Calls closed(owner) for every watched socket its peer closed or reset; `closed` must remove()
  // it (or close it), else it is reported again. Returns how many.
  template <typename F>
  unsigned check(F&& closed) noexcept {
    void* owners[kBatch];
    const unsigned n = collect(owners);
    for (unsigned i = 0; i < n; ++i) closed(owners[i]);
    return n;
  }

 private:
  static constexpr std::size_t kBatch = 32;
  unsigned collect(void** owners) noexcept;

  int epfd_ = -1;
  std::size_t watched_ = 0;
  std::chrono::steady_clock::time_point next_{};
};

}  // namespace gmd::md::rc
