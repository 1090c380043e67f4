// gmd_rc: a UCT transport of reliable-connected verbs QPs on a gmd MD's protection domain.
//
// Connection model (connect-to-iface, no auxiliary transport): every iface runs a small TCP
// listener whose IPv4 address and port are the iface address; the device address carries the port's
// GID/LID. uct_ep_create(iface address, device address) creates an RC QP and connects it
// asynchronously: a non-blocking TCP connect, then the handshake (QP number, PSN, GID, MTU, see
// md/rc/rc_wire.h). The listener thread of the peer creates a "passive" QP for the endpoint, brings
// it to RTS and answers; progress then brings the endpoint's QP to RTS. Until then put/get return
// UCS_ERR_NO_RESOURCE and callers use the pending queue. All endpoints to one peer iface share one
// TCP connection (a Link), open while any of them lives: a destroyed endpoint's passive QP is
// released by a frame on it, and when it closes (last endpoint gone, process dead) the peer
// destroys them all.
//
// Active messages travel as SEND_WITH_IMM from an endpoint's QP to the peer's passive QP, into the
// peer iface's shared receive queue (md/rc/rc_recv.h); credits come back the other way.
//
// Events: both CQs report to one completion channel, whose fd is the iface's event fd.
// uct_iface_event_arm drains the channel, returns UCS_ERR_BUSY when work is waiting (completions
// not yet handled, endpoints connecting, pending requests that can go, hand-offs, grants), else
// arms the requested CQs and polls them once more: a completion that slipped in before the arm is
// kept for the next progress and answered with UCS_ERR_BUSY, so no wake-up is lost.
//
// Files: rc_config.* (UCX_GMD_RC_* and derived limits), rc_iface.* (this: the iface, its send CQ,
// progress, events, UCX-facing attributes; rc_iface_links.cc its connections' progress, the links
// to peer ifaces and peer failure), rc_ep.* (endpoint operations; rc_am.cc its active
// messages, rc_rma.cc put_short and put/get bcopy, rc_atomic.cc 64-bit atomics), rc_connect.* and
// rc_listener.* (connection set-up, both sides), rc_recv.* (receive path), rc_pool.* (registered
// buffers), rc_qp.* / rc_gid.h (verbs plumbing), rc_wire.* (formats), rc_transport.cc (the UCX ops
// tables).
//
// Thread safety: an iface and its endpoints are used by one thread at a time (UCT's contract); the
// listener thread touches only the passive QPs and its sockets.
#pragma once

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "md/rc/rc_config.h"
#include "md/rc/rc_ep.h"
#include "md/rc/rc_peer_watch.h"
#include "md/rc/rc_pool.h"
#include "md/rc/rc_qp.h"
#include "md/rc/rc_recv.h"
#include "md/ucx_abi.h"

namespace gmd::md {
class Md;
}

namespace gmd::md::rc {

class Listener;

// Removes every x from v (the iface's endpoint lists are short and unordered).
template <typename T>
void eraseValue(std::vector<T>& v, const T& x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
}

struct IfaceHandle {
  ucx::BaseIface base;  // first: libuct reads it
  Iface* self;
};

class Iface {
 public:
  static ucs_status_t open(uct_md_h md, uct_worker_h worker, const uct_iface_params_t* params,
                           const uct_iface_config_t* config, uct_iface_h* iface_p) noexcept;
  ~Iface();
  static Iface* from(uct_iface_h iface) noexcept {
    return reinterpret_cast<IfaceHandle*>(iface)->self;
  }
  uct_iface_h handle() noexcept { return &handle_.base.super; }

  ucs_status_t query(uct_iface_attr_t* attr) noexcept;
  ucs_status_t deviceAddress(uct_device_addr_t* addr) noexcept;
  ucs_status_t ifaceAddress(uct_iface_addr_t* addr) noexcept;
  int isReachable(const uct_device_addr_t* dev_addr, const uct_iface_addr_t* iface_addr) noexcept;
  ucs_status_t createEp(const uct_ep_params_t* params, uct_ep_h* ep_p) noexcept;
  void destroyEp(Ep* ep) noexcept;
  unsigned progress() noexcept;
  ucs_status_t flush(unsigned flags, uct_completion_t* comp) noexcept;
  ucs_status_t fence() noexcept;
  ucs_status_t eventFd(int* fd) noexcept;
  ucs_status_t eventArm(unsigned events) noexcept;

  // For the receive path: `credits` granted to the endpoint whose QP is `qpn`.
  void creditsGranted(std::uint32_t qpn, unsigned credits) noexcept;

  const char* name() const noexcept;
  unsigned fenceEpoch() const noexcept { return fence_epoch_; }
  bool hasTxCredit() const noexcept { return tx_free_ > 0; }
  std::size_t maxIov(ibv_wr_opcode opcode) const noexcept {
    return opcode == IBV_WR_RDMA_READ ? limits_.max_read_sge : limits_.qp.max_send_sge;
  }
  // Bytes per RDMA READ work request: a get_zcopy larger than this is posted as several READs,
  // completed together (UCX_GMD_RC_MAX_READ; defaultReadSize in md/rc/rc_config.cc explains the
  // soft-RoCE default).
  std::size_t readSize() const noexcept { return limits_.max_read; }
  // Active-message limits (also what query() reports). amMaxShort is a whole am_short message:
  // its 8-byte header and payload (am_short_iov: the iovecs' total), as UCT defines max_short.
  std::size_t amMaxShort() const noexcept;
  std::size_t amMaxIov() const noexcept { return limits_.qp.max_send_sge - 1; }
  std::size_t amMaxHdr() const noexcept;
  std::size_t amMaxZcopy() const noexcept;  // am_zcopy's payload, the header not counted
  std::size_t txInline() const noexcept { return tx_inline_; }
  // --- Small RMA and atomics (md/rc/rc_rma.cc, md/rc/rc_atomic.cc) ---
  // put_short / put_bcopy / get_bcopy limits (also what query() reports).
  std::size_t putMaxShort() const noexcept;
  std::size_t putMaxBcopy() const noexcept;
  std::size_t getMaxBcopy() const noexcept;
  // Whether the device offers verbs atomics (ibv_device_attr.atomic_cap).
  bool hasAtomics() const noexcept;
  // query()'s put/get short and bcopy fields and flags, and its atomic fields and flags.
  void queryRma(uct_iface_attr_t* attr) const noexcept;
  void queryAtomics(uct_iface_attr_t* attr) const noexcept;
  // --- End of small RMA and atomics ---

 private:
  friend class Ep;
  Iface() = default;
  ucs_status_t init(Md* md, const char* dev_name, const IfaceConfig& config) noexcept;
  unsigned pollCq() noexcept;
  unsigned progressConnections() noexcept;
  void connectionReady(Ep* ep, const Handshake& reply) noexcept;
  // --- Links (md/rc/rc_connect.h) ---
  PeerLink* linkTo(const IfaceAddress& peer) noexcept;  // existing or new (nullptr: failed, logged)
  void leaveLink(Ep* ep, bool release) noexcept;        // `release`: its passive QP may exist
  void linkFailed(PeerLink* link, const char* why) noexcept;  // fails or warns its endpoints
  void dropLink(PeerLink* link) noexcept;                     // closes and forgets it
  void connectionFailed(Ep* ep, ucs_status_t status, const char* why) noexcept;
  void failed(Ep* ep) noexcept;  // queue the error handler call for a just-failed endpoint
  // An endpoint was refused for lack of iface resources (CQ credits, bounce buffers when
  // `bounce`): remember to wake the pending queues when they come back.
  void starved(bool bounce) noexcept;
  void releaseBounce(std::uint32_t b) noexcept;
  void wakePending() noexcept;
  void handleSendCompletion(const ibv_wc& wc) noexcept;
  bool hasWork() const noexcept;
  void schedulePending(Ep* ep) noexcept;
  unsigned dispatchPending() noexcept;
  void reportFailures() noexcept;
  void reapDestroyed() noexcept;
  // --- Peer failure (side channel closed; see md/rc/rc_peer_watch.h) ---
  void peerClosed(Ep* ep) noexcept;     // its link closed by the peer
  void failPeerGone(Ep* ep) noexcept;
  void release(Ep* ep) noexcept;  // deletes it, destroying its QP and socket

  IfaceHandle handle_{};
  Md* md_ = nullptr;
  PortInfo port_{};
  Limits limits_{};
  ibv_comp_channel* channel_ = nullptr;  // both CQs: the event fd
  ibv_cq* cq_ = nullptr;  // send completions of every endpoint
  long tx_free_ = 0;      // send CQ credits (below zero by at most kCqReserve: see postNop)
  bool starved_ = false;
  bool bounce_starved_ = false;
  std::vector<ibv_wc> send_backlog_;  // completions eventArm polled
  BufferPool bounce_;  // send bounce buffers
  std::size_t tx_inline_ = 0;
  std::size_t rx_headroom_ = 0;
  // uct_iface_params_t am_alignment / am_align_offset: a received message's data + offset is
  // aligned to am_align_ (1: no requirement).
  std::size_t am_align_ = 1;
  std::size_t am_align_offset_ = 0;
  RecvPath recv_;
  double connect_timeout_ = 0;
  double latency_ = 0;
  double overhead_ = 0;
  std::uint16_t listen_port_be_ = 0;
  unsigned fence_epoch_ = 0;
  bool in_progress_ = false;
  std::vector<Ep*> eps_;         // live endpoints
  std::unordered_map<std::uint32_t, Ep*> by_qpn_;  // live and destroyed ones, by QP number
  std::vector<Ep*> connecting_;  // subset still connecting
  std::deque<Ep*> pending_eps_;  // endpoints with pending requests
  std::vector<Ep*> failed_;      // endpoints whose failure the error handler has not seen
  std::vector<Ep*> destroyed_;   // destroyed endpoints still holding work requests or in progress
  std::unordered_map<std::uint64_t, std::unique_ptr<PeerLink>> links_;  // by PeerLink::key
  bool link_output_ = false;  // some link may have frames to send (progressConnections)
  PeerWatch peer_watch_;
  std::unique_ptr<Listener> listener_;
};

// The transport descriptor registered into component gmd (md/component.cc), and its iface
// operations (md/rc/rc_transport.cc).
ucx::Transport* transport() noexcept;
const uct_iface_ops_t& ifaceOps() noexcept;

}  // namespace gmd::md::rc
