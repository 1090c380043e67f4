// The accepting side of gmd_rc connections: one TCP listener and one thread per iface.
//
// Each TCP connection comes from one peer iface and carries the handshakes of all its endpoints to
// this iface (md/rc/rc_connect.h, Link). For each connect frame the thread creates a passive RC QP
// on the iface's protection domain (receiving into the iface's shared receive queue), connects it
// to the requester's QP (RTR, RTS), hands it to the iface (md/rc/rc_recv.h, Handoff) and answers
// with its QP number. A release frame, or the peer closing the connection (its endpoints all gone,
// its process or iface gone), hands the passive QPs back to the iface, which owns and destroys
// them.
//
// Thread safety: start() and the destructor from the iface's thread; everything else runs on the
// listener thread. Verbs calls are thread-safe; Handoff is the only state shared with the iface.
#pragma once

#include <infiniband/verbs.h>
#include <ucs/type/status.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "md/rc/rc_qp.h"
#include "md/rc/rc_recv.h"

namespace gmd::md::rc {

class Listener {
 public:
  // `pd`, `queues` and `handoff` are the iface's (its receive path's).
  Listener(std::string name, ibv_pd* pd, const QpQueues& queues, Handoff* handoff,
           const PortInfo& port, const QpSettings& s);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Binds an ephemeral TCP port on every IPv4 address and starts the thread.
  ucs_status_t start(std::uint16_t* port_be) noexcept;

 private:
  struct Passive {
    std::uint32_t requester_qpn;  // the endpoint's QP, which names it in a release frame
    ibv_qp* qp;
  };
  struct Conn {
    int fd;
    std::vector<Passive> qps;
  };
  void run() noexcept;
  void accept() noexcept;
  // Reads and serves one frame of conns_[i]; false when the connection is to be closed.
  bool serve(Conn& c) noexcept;
  // A connect frame: the passive QP and the answer.
  bool connectFrame(Conn& c, const Handshake& request) noexcept;
  void closeConn(std::size_t i) noexcept;

  std::string name_;
  ibv_pd* pd_;
  QpQueues queues_;
  Handoff* handoff_;
  PortInfo port_;
  QpSettings settings_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor asks the thread to stop
  std::thread thread_;
  std::vector<Conn> conns_;  // listener thread only (and the destructor after join)
};

}  // namespace gmd::md::rc
