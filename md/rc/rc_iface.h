// gmd_rc: a UCT transport of reliable-connected verbs QPs on a gmd MD's protection domain.
//
// Connection model (connect-to-iface, no auxiliary transport): every iface runs a small TCP listener
// whose IPv4 address and port are the iface address; the device address carries the port's GID/LID.
// uct_ep_create(iface address, device address) creates an RC QP and connects it asynchronously: a
// non-blocking TCP connect, then the handshake (QP number, PSN, GID, MTU, see md/rc/rc_wire.h). The
// listener thread of the peer creates a "passive" QP for the endpoint, brings it to RTS and answers;
// progress then brings the endpoint's QP to RTS. Until then put/get return UCS_ERR_NO_RESOURCE and
// callers use the pending queue. The TCP connection stays open for the endpoint's lifetime: when the
// peer's endpoint goes away (or its process dies) the passive QP is destroyed.
//
// Thread safety: an iface and its endpoints are used by one thread at a time (UCT's contract); the
// listener thread touches only the passive QPs and its sockets.
#pragma once

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "md/rc/rc_wire.h"
#include "md/ucx_abi.h"

namespace gmd::md {
class Md;
}

namespace gmd::md::rc {

inline constexpr const char* kTransportName = "gmd_rc";

// UCX_GMD_RC_* (uct_iface_config_table's fields come first: UCX_GMD_RC_ALLOC, ...).
struct IfaceConfig {
  ucx::IfaceConfigBase super;
  unsigned tx_queue_len;      // TX_QUEUE_LEN: work requests in flight per endpoint
  unsigned tx_cq_len;         // TX_CQ_LEN: completions in flight per iface
  unsigned max_iov;           // MAX_IOV
  unsigned max_rd_atomic;     // MAX_RD_ATOMIC: RDMA READs in flight per endpoint
  std::size_t max_read;       // MAX_READ: bytes of one RDMA READ work request (UCS_MEMUNITS_AUTO)
  unsigned long gid_index;    // GID_INDEX (UCS_ULUNITS_AUTO: choose)
  double timeout;             // TIMEOUT: transport retransmission timeout, seconds
  unsigned retry_count;       // RETRY_COUNT
  double connect_timeout;     // CONNECT_TIMEOUT, seconds
  double latency;             // LATENCY reported to UCX, seconds
  double overhead;            // OVERHEAD reported to UCX, seconds
};
extern ucs_config_field_t kIfaceConfigTable[];
inline constexpr const char* kIfaceConfigPrefix = "GMD_RC_";

// What a port offers, queried once per iface.
struct PortInfo {
  std::uint8_t num = 1;
  ibv_port_attr attr{};
  int gid_index = 0;
  ibv_gid gid{};
  bool ethernet = false;
  std::uint32_t oob_ipv4_be = 0;  // address the listener is reached at
};

// "rxe0:1" → port 1 of the MD's device; UCS_ERR_NO_DEVICE for another device or a bad port.
ucs_status_t parsePortName(const char* dev_name, const char* md_name, std::uint8_t* port) noexcept;

// The QP settings both sides use (from the config and the device limits).
struct QpSettings {
  unsigned tx_queue_len = 0;
  unsigned max_send_sge = 1;
  unsigned max_rd_atomic = 1;       // initiator depth (active QPs)
  unsigned max_dest_rd_atomic = 1;  // responder resources (passive QPs)
  std::uint8_t timeout = 14;
  std::uint8_t retry_count = 7;
};

class Iface;
class Listener;

struct IfaceHandle {
  ucx::BaseIface base;  // first: libuct reads it
  Iface* self;
};

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
  bool full() const noexcept { return inflight_ == ring_.size(); }
  ucs_status_t postOne(ibv_wr_opcode opcode, ibv_sge* sge, int nsge, std::uint64_t remote_addr,
                       std::uint32_t rkey, uct_completion_t* comp) noexcept;

  EpHandle handle_{};
  Iface* iface_;
  ibv_qp* qp_ = nullptr;
  int fd_ = -1;
  State state_ = State::kConnecting;
  bool request_sent_ = false;
  std::size_t io_done_ = 0;
  std::uint8_t io_buf_[kHandshakeSize] = {};
  std::uint32_t psn_ = 0;
  std::chrono::steady_clock::time_point deadline_{};
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

  unsigned fenceEpoch() const noexcept { return fence_epoch_; }
  bool hasTxCredit() const noexcept { return tx_free_ > 0; }
  std::size_t maxIov(ibv_wr_opcode opcode) const noexcept {
    return opcode == IBV_WR_RDMA_READ ? max_read_sge_ : settings_.max_send_sge;
  }
  // Bytes per RDMA READ work request: a get_zcopy larger than this is posted as several READs,
  // completed together (UCX_GMD_RC_MAX_READ; defaultReadSize in md/rc/rc_iface.cc explains the
  // soft-RoCE default).
  std::size_t readSize() const noexcept { return max_read_; }

 private:
  friend class Ep;
  Iface() = default;
  ucs_status_t init(Md* md, const char* dev_name, const IfaceConfig& config) noexcept;
  unsigned pollCq() noexcept;
  unsigned progressConnections() noexcept;
  void stepConnection(Ep* ep, short revents) noexcept;
  void connectionFailed(Ep* ep, ucs_status_t status, const char* why) noexcept;
  void connectionReady(Ep* ep, const Handshake& reply) noexcept;
  void schedulePending(Ep* ep) noexcept;
  unsigned dispatchPending() noexcept;
  void reportFailures() noexcept;
  void reapDestroyed() noexcept;
  void release(Ep* ep) noexcept;  // deletes it, destroying its QP and socket

  IfaceHandle handle_{};
  Md* md_ = nullptr;
  PortInfo port_{};
  QpSettings settings_{};
  std::size_t max_read_sge_ = 1;
  std::size_t max_read_ = 0;
  std::uint64_t max_msg_ = 0;
  ibv_cq* cq_ = nullptr;
  ibv_cq* passive_cq_ = nullptr;
  unsigned cq_len_ = 0;
  unsigned tx_free_ = 0;
  double connect_timeout_ = 0;
  double latency_ = 0;
  double overhead_ = 0;
  std::uint16_t listen_port_be_ = 0;
  unsigned fence_epoch_ = 0;
  bool in_progress_ = false;
  unsigned idle_calls_ = 0;
  std::vector<Ep*> eps_;         // live endpoints
  std::vector<Ep*> connecting_;  // subset still connecting
  std::deque<Ep*> pending_eps_;  // endpoints with pending requests
  std::vector<Ep*> failed_;      // endpoints whose failure the error handler has not seen
  std::vector<Ep*> destroyed_;   // destroyed endpoints still holding work requests or in progress
  std::unique_ptr<Listener> listener_;
};

// The transport descriptor registered into component gmd (md/component.cc), and its iface operations
// (md/rc/rc_transport.cc).
ucx::Transport* transport() noexcept;
const uct_iface_ops_t& ifaceOps() noexcept;

}  // namespace gmd::md::rc
