// A gmd_rc endpoint: one active RC QP towards a peer iface, the operations UCT posts on it, its
// completion ring, flush waiters and pending queue.
//
// Lifecycle: created connecting by Iface::createEp (its Connector runs the handshake, see
// md/rc/rc_connect.h), ready once the QP reached RTS, failed after a failed work request or
// connection (every operation then returns the error). Destruction is deferred by the iface while
// work requests of the endpoint are still in the send CQ.
//
// Thread safety: used by the iface's thread only (UCT's contract: an iface and its endpoints are
// used by one thread at a time).
#pragma once

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "md/rc/rc_connect.h"

namespace gmd::md::rc {

class Iface;
class Ep;

struct EpHandle {
  uct_ep_t super;  // first: libuct reads it
  Ep* self;
};

class Ep {
 public:
  static Ep* from(uct_ep_h ep) noexcept { return reinterpret_cast<EpHandle*>(ep)->self; }
  uct_ep_h handle() noexcept { return &handle_.super; }

  ucs_status_t rdma(ibv_wr_opcode opcode, const uct_iov_t* iov, std::size_t iovcnt,
                    std::uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t* comp) noexcept;
  ucs_status_t pendingAdd(uct_pending_req_t* req, unsigned flags) noexcept;
  void pendingPurge(uct_pending_purge_callback_t cb, void* arg) noexcept;
  ucs_status_t flush(unsigned flags, uct_completion_t* comp) noexcept;
  ucs_status_t fence() noexcept;

 private:
  friend class Iface;
  enum class State { kConnecting, kReady, kFailed };
  struct FlushWaiter {
    std::uint64_t sn;
    uct_completion_t* comp;
  };

  explicit Ep(Iface* iface);
  ~Ep();
  // Room for the next operation: need_slots_ work requests (more than one for a get split into
  // several READs, see Iface::readSize).
  bool canPost() const noexcept;
  ucs_status_t postOne(ibv_wr_opcode opcode, ibv_sge* sge, int nsge, std::uint64_t remote_addr,
                       std::uint32_t rkey, uct_completion_t* comp) noexcept;
  // One send completion of this endpoint (the oldest outstanding work request), with its status.
  void completeOne(ucs_status_t status) noexcept;
  // Enters the failed state with `status` (first failure wins); true when this call failed it.
  bool fail(ucs_status_t status) noexcept;

  EpHandle handle_{};
  Iface* iface_;
  ibv_qp* qp_ = nullptr;
  Connector connector_;
  std::uint32_t psn_ = 0;
  State state_ = State::kConnecting;
  ucs_status_t error_ = UCS_OK;
  bool error_reported_ = false;
  // Completions of posted work requests, oldest first (RC completes in order).
  std::vector<uct_completion_t*> ring_;
  std::size_t ring_head_ = 0;
  std::size_t inflight_ = 0;
  std::uint64_t posted_ = 0;
  std::uint64_t completed_ = 0;
  std::size_t need_slots_ = 1;  // work requests the last refused operation needs
  std::deque<FlushWaiter> flushes_;
  std::deque<uct_pending_req_t*> pending_;
  bool in_pending_list_ = false;
  bool fence_ = false;
  unsigned fence_epoch_ = 0;
  bool destroyed_ = false;
};

}  // namespace gmd::md::rc
