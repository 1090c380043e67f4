// A gmd_rc endpoint: one active RC QP towards a peer iface, the operations UCT posts on it, its
// ring of posted work requests, flush waiters, pending queue and active-message credits.
// Zero-copy RMA, flush and the pending queue are in rc_ep.cc; active messages in rc_am.cc; put_short,
// put/get_bcopy in rc_rma.cc; 64-bit atomics in rc_atomic.cc.
//
// Work requests: each gets a sequence number (its wr_id) and a ring slot holding its completion and
// bounce buffer. Only some are signaled: those with a completion, every signal_interval-th, the one
// that fills the ring, and those using a bounce buffer while the pool runs low. A completion retires
// every slot up to its sequence number (RC completes in order; an error completes every later work
// request with a flush error). flush() and destruction post a signaled zero-length RDMA WRITE when
// the newest work request is unsignaled, so that the ring always empties.
//
// Pending queue: while it holds requests, every operation returns UCS_ERR_NO_RESOURCE except those
// the requests' own callbacks post when Iface::dispatchPending calls them (as UCX's rc transports:
// resources and a non-empty pending queue never coexist outside dispatch). Otherwise a new operation
// could overtake a request already queued: UCP's multi-fragment messages would interleave, and a
// receiver holding the unexpected fragments of several half-received messages runs out of receive
// buffers for good (UCP protocols v2, eager zero-copy of 1 MiB tag sends, UCX 1.18).
//
// Credits (sender side): FC_WND_SIZE active messages may be unacknowledged. Once half are used the
// next message asks for a grant (a bit in its immediate data, md/rc/rc_wire.h); the peer's receive
// path answers with one grant for everything it consumed. Without credits an AM returns
// UCS_ERR_NO_RESOURCE and the pending queue waits for the grant.
//
// Lifecycle: created connecting by Iface::createEp (its handshake goes over the link to the peer
// iface, see md/rc/rc_connect.h), ready once the QP reached RTS, failed after a failed work request
// or connection (every operation then returns the error). uct_ep_destroy calls every outstanding
// completion (operations, then flushes waiting for them) with UCS_ERR_CANCELED before it returns,
// as UCT requires and rc_verbs does; freeing the endpoint is deferred by the iface while its work
// requests are still in the send CQ, and when they come back they call nothing.
//
// Thread safety: used by the iface's thread only (UCT's contract: an iface and its endpoints are
// used by one thread at a time).
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>
#include <uct/api/uct.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "md/rc/rc_connect.h"

namespace gmd::md::rc {

class Iface;
class Ep;

// UCT iov entries of gmd memory handles → SGEs appended at sge[*nsge], bytes added to *total.
// UCS_ERR_INVALID_PARAM for an entry without a memory handle, UCS_ERR_UNSUPPORTED for strides.
ucs_status_t iovToSge(const uct_iov_t* iov, std::size_t iovcnt, ibv_sge* sge, int* nsge,
                      std::uint64_t* total) noexcept;

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
  ucs_status_t amShort(std::uint8_t id, std::uint64_t header, const void* payload,
                       unsigned length) noexcept;
  ucs_status_t amShortIov(std::uint8_t id, const uct_iov_t* iov, std::size_t iovcnt) noexcept;
  ssize_t amBcopy(std::uint8_t id, uct_pack_callback_t pack, void* arg, unsigned flags) noexcept;
  ucs_status_t amZcopy(std::uint8_t id, const void* header, unsigned header_length,
                       const uct_iov_t* iov, std::size_t iovcnt, unsigned flags,
                       uct_completion_t* comp) noexcept;
  // --- Small RMA (md/rc/rc_rma.cc) and atomics (md/rc/rc_atomic.cc) ---
  ucs_status_t putShort(const void* buffer, unsigned length, std::uint64_t remote_addr,
                        uct_rkey_t rkey) noexcept;
  ssize_t putBcopy(uct_pack_callback_t pack, void* arg, std::uint64_t remote_addr,
                   uct_rkey_t rkey) noexcept;
  ucs_status_t getBcopy(uct_unpack_callback_t unpack, void* arg, std::size_t length,
                        std::uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t* comp) noexcept;
  ucs_status_t atomic64Post(unsigned opcode, std::uint64_t value, std::uint64_t remote_addr,
                            uct_rkey_t rkey) noexcept;
  ucs_status_t atomic64Fetch(unsigned opcode, std::uint64_t value, std::uint64_t* result,
                             std::uint64_t remote_addr, uct_rkey_t rkey,
                             uct_completion_t* comp) noexcept;
  ucs_status_t atomicCswap64(std::uint64_t compare, std::uint64_t swap, std::uint64_t remote_addr,
                             uct_rkey_t rkey, std::uint64_t* result, uct_completion_t* comp) noexcept;
  // --- End of small RMA and atomics ---
  ucs_status_t pendingAdd(uct_pending_req_t* req, unsigned flags) noexcept;
  void pendingPurge(uct_pending_purge_callback_t cb, void* arg) noexcept;
  ucs_status_t flush(unsigned flags, uct_completion_t* comp) noexcept;
  ucs_status_t fence() noexcept;
  // Whether this endpoint was created for the peer at these addresses (UCX >= 1.16 asks in wireup).
  bool connectedTo(const uct_device_addr_t* dev_addr,
                   const uct_iface_addr_t* iface_addr) const noexcept;
  // uct_ep_check: UCS_OK, and the error handler runs (once) if the peer is gone: at once when the
  // endpoint already failed (its peer closed the side channel, say), else after a zero-length RDMA
  // WRITE probe failed its retries. UCS_ERR_NO_RESOURCE when the probe has no room now.
  ucs_status_t check(unsigned flags, uct_completion_t* comp) noexcept;

 private:
  friend class Iface;
  enum class State { kConnecting, kReady, kFailed };
  struct FlushWaiter {
    std::uint64_t sn;
    uct_completion_t* comp;
  };
  struct Slot {
    uct_completion_t* comp;
    std::int32_t bounce;  // send bounce buffer to release, or -1
    // Called with the bounce buffer's first `length` bytes when the work request succeeded, before
    // `comp` (get_bcopy's unpack callback, a fetching atomic's copy to the caller's result).
    uct_unpack_callback_t unpack = nullptr;
    void* unpack_arg = nullptr;
    std::uint32_t length = 0;
  };
  struct Piece {  // a source of an am_short
    const void* data;
    std::size_t length;
  };

  explicit Ep(Iface* iface);
  ~Ep();
  // Room for the next operation: need_slots_ work requests (more than one for a get split into
  // several READs, see Iface::readSize), and a credit / a bounce buffer when the last refused
  // operation needed one.
  bool canPost() const noexcept;
  // True (the caller returns UCS_ERR_NO_RESOURCE) when pending requests wait and this is not
  // one of them being dispatched; schedules their dispatch if they could go now.
  bool queuedBehindPending() noexcept;
  // The resources of one work request (need_* say which); UCS_ERR_NO_RESOURCE when short of them
  // or when pending requests wait.
  ucs_status_t reserve(bool credit, bool bounce) noexcept;
  ucs_status_t postRdma(ibv_wr_opcode opcode, ibv_sge* sge, int nsge, std::uint64_t remote_addr,
                        std::uint32_t rkey, uct_completion_t* comp) noexcept;
  // Posts `wr` (its wr_id, signaling and fence are set here) and fills its ring slot.
  ucs_status_t post(ibv_send_wr& wr, uct_completion_t* comp, std::int32_t bounce) noexcept;
  // A signaled zero-length RDMA WRITE (see above); `force` may use the CQ's reserve.
  ucs_status_t postNop(bool force) noexcept;
  // The ring slot of the work request post() filled last (md/rc/rc_rma.cc sets its unpack).
  Slot& newestSlot() noexcept { return ring_[(ring_head_ + inflight_ - 1) % ring_.size()]; }
  // An atomic work request into a bounce buffer (md/rc/rc_atomic.cc); `result` null: discarded.
  ucs_status_t postAtomic(ibv_wr_opcode opcode, std::uint64_t compare_add, std::uint64_t swap,
                          std::uint64_t remote_addr, uct_rkey_t rkey, std::uint64_t* result,
                          uct_completion_t* comp) noexcept;
  bool unsignaledTail() const noexcept { return inflight_ > 0 && last_signaled_ != posted_; }
  // A completion of work request `sn` with `status`: retires it and everything before it.
  void retire(std::uint64_t sn, ucs_status_t status) noexcept;
  // Endpoint destruction: calls every outstanding operation's completion and every flush's with
  // UCS_ERR_CANCELED, in order, once; the ring slots keep their bounce buffers (released when their
  // work requests come back) but no completion.
  void cancelOutstanding() noexcept;
  // A SEND_WITH_IMM carrying active message `id` (consumes a credit; asks for more at half).
  ucs_status_t sendAm(std::uint8_t id, ibv_sge* sge, int nsge, unsigned send_flags,
                      uct_completion_t* comp, std::int32_t bounce) noexcept;
  ucs_status_t amShortPieces(std::uint8_t id, const Piece* pieces, std::size_t n,
                             std::size_t total) noexcept;
  void creditsGranted(unsigned credits) noexcept;
  // Enters the failed state with `status` (first failure wins); true when this call failed it.
  bool fail(ucs_status_t status) noexcept;

  EpHandle handle_{};
  Iface* iface_;
  DeviceAddress peer_dev_{};  // the addresses it was created for
  IfaceAddress peer_iface_{};
  ibv_qp* qp_ = nullptr;
  PeerLink* link_ = nullptr;  // the connection to the peer iface it shares, while it uses it
  std::chrono::steady_clock::time_point connect_deadline_{};
  std::uint32_t psn_ = 0;
  State state_ = State::kConnecting;
  ucs_status_t error_ = UCS_OK;
  bool error_reported_ = false;
  // Posted work requests, oldest first (RC completes in order).
  std::vector<Slot> ring_;
  std::size_t ring_head_ = 0;
  std::size_t inflight_ = 0;
  std::uint64_t posted_ = 0;         // sequence number of the newest work request
  std::uint64_t completed_ = 0;      // ... of the newest retired one
  std::uint64_t last_signaled_ = 0;  // ... of the newest signaled one
  std::size_t need_slots_ = 1;  // work requests the last refused operation needs
  bool need_credit_ = false;    // ... whether it was an active message
  bool need_bounce_ = false;    // ... whether it needed a bounce buffer
  unsigned fc_credits_ = 0;     // active messages we may send
  bool fc_requested_ = false;   // a grant was asked for and has not come
  std::deque<FlushWaiter> flushes_;
  std::deque<uct_pending_req_t*> pending_;
  bool in_pending_list_ = false;
  bool dispatching_ = false;  // Iface::dispatchPending is in one of its pending callbacks
  bool fence_ = false;
  unsigned fence_epoch_ = 0;
  bool destroyed_ = false;
};

}  // namespace gmd::md::rc
