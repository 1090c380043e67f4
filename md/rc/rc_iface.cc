#include "md/rc/rc_iface.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucs/debug/log_def.h>
#include <ucs/sys/string.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "md/md.h"
#include "md/rc/rc_listener.h"
#include "md/rc/rc_qp.h"
#include "rcache/rcache.h"

namespace gmd::md::rc {

ucs_config_field_t kIfaceConfigTable[] = {
    {"", "", nullptr, offsetof(IfaceConfig, super), UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},
    {"TX_QUEUE_LEN", "256", "Work requests in flight per endpoint (send queue length of its QP).",
     offsetof(IfaceConfig, tx_queue_len), UCS_CONFIG_TYPE_UINT},
    {"TX_CQ_LEN", "4096", "Work requests in flight per iface (length of its completion queue).",
     offsetof(IfaceConfig, tx_cq_len), UCS_CONFIG_TYPE_UINT},
    {"MAX_IOV", "8", "Maximal number of iov entries of one put/get (capped by the device).",
     offsetof(IfaceConfig, max_iov), UCS_CONFIG_TYPE_UINT},
    {"MAX_RD_ATOMIC", "4", "RDMA READs in flight per endpoint (capped by the device).",
     offsetof(IfaceConfig, max_rd_atomic), UCS_CONFIG_TYPE_UINT},
    {"MAX_READ", "auto",
     "Bytes of one RDMA READ work request; a larger get_zcopy is posted as several READs\n"
     "that complete together. auto: the port's maximal message size; on soft-RoCE (rxe) 256k\n"
     "divided by MAX_RD_ATOMIC, since rxe sends READ responses without flow control and a burst\n"
     "longer than the receiving CPU's packet backlog (net.core.netdev_max_backlog) loses\n"
     "packets, each loss costing one TIMEOUT.",
     offsetof(IfaceConfig, max_read), UCS_CONFIG_TYPE_MEMUNITS},
    {"GID_INDEX", "auto",
     "GID table index of the port. auto: on RoCE the RoCEv2 GID of an IPv4 address, then any\n"
     "RoCEv2 GID, then RoCEv1; on InfiniBand index 0.",
     offsetof(IfaceConfig, gid_index), UCS_CONFIG_TYPE_ULUNITS},
    {"TIMEOUT", "1s", "Transport retransmission timeout of the RC QPs (rounded up to 4.096us*2^n).",
     offsetof(IfaceConfig, timeout), UCS_CONFIG_TYPE_TIME},
    {"RETRY_COUNT", "7", "Transport retries before an endpoint fails (at most 7).",
     offsetof(IfaceConfig, retry_count), UCS_CONFIG_TYPE_UINT},
    {"CONNECT_TIMEOUT", "30s",
     "How long an endpoint may take to connect (TCP handshake with the peer's iface) before it\n"
     "fails with UCS_ERR_UNREACHABLE.",
     offsetof(IfaceConfig, connect_timeout), UCS_CONFIG_TYPE_TIME},
    {"LATENCY", "700ns", "One-way latency reported to UCX for lane selection.",
     offsetof(IfaceConfig, latency), UCS_CONFIG_TYPE_TIME},
    {"OVERHEAD", "75ns", "Per-operation software overhead reported to UCX.",
     offsetof(IfaceConfig, overhead), UCS_CONFIG_TYPE_TIME},
    {nullptr},
};

ucs_status_t parsePortName(const char* dev_name, const char* md_name, std::uint8_t* port) noexcept {
  const char* colon = std::strrchr(dev_name, ':');
  if (colon == nullptr || static_cast<std::size_t>(colon - dev_name) != std::strlen(md_name) ||
      std::strncmp(dev_name, md_name, std::strlen(md_name)) != 0) {
    return UCS_ERR_NO_DEVICE;
  }
  char* end = nullptr;
  const unsigned long n = std::strtoul(colon + 1, &end, 10);
  if (end == colon + 1 || *end != '\0' || n == 0 || n > 255) return UCS_ERR_NO_DEVICE;
  *port = static_cast<std::uint8_t>(n);
  return UCS_OK;
}

namespace {

ucs_status_t wcStatus(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return UCS_OK;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR: return UCS_ERR_ENDPOINT_TIMEOUT;
    case IBV_WC_WR_FLUSH_ERR: return UCS_ERR_CANCELED;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_REM_OP_ERR: return UCS_ERR_IO_ERROR;
    default: return UCS_ERR_CONNECTION_RESET;
  }
}

// Upper bound of SGEs per work request (the stack arrays of Ep::rdma).
constexpr unsigned kMaxSge = 32;

// rdma_rxe (soft-RoCE) reports this vendor id.
constexpr std::uint32_t kSoftRoceVendorId = 0xffffff;
// READ response bytes one QP may have in flight on soft-RoCE: 256 packets at a 1 KiB MTU, a quarter
// of Linux's default receive backlog of 1000 packets per CPU.
constexpr std::size_t kSoftRoceReadBytesInFlight = 256 * 1024;

// The default of UCX_GMD_RC_MAX_READ. Hardware: one READ per get, however large. Soft-RoCE: rxe's
// responder emits a READ's response packets back to back from a tasklet, with no flow control,
// into the receive backlog of its CPU through the netdev (veth, or a NIC looped back); whatever the
// backlog cannot hold is dropped. rxe's requester then discards the rest of that response and
// waits for its retransmission timer, so every overflow costs one QP timeout (1 s by default):
// UCP rendezvous with get_zcopy moved 1 MiB per second. READs of this size, at most
// max_rd_atomic of them outstanding, keep the burst far below the backlog.
std::size_t defaultReadSize(const ibv_device_attr& dev, std::size_t mtu, unsigned max_rd_atomic,
                            std::uint64_t max_msg) {
  if (dev.vendor_id != kSoftRoceVendorId) return static_cast<std::size_t>(max_msg);
  // rxe rounds max_rd_atomic up to a power of two.
  const std::size_t reads = std::bit_ceil(std::max(max_rd_atomic, 1u));
  std::size_t size = kSoftRoceReadBytesInFlight / reads;
  size = std::max(mtu, size / mtu * mtu);
  return static_cast<std::size_t>(std::min<std::uint64_t>(size, max_msg));
}

// Records `status` in `comp` and calls it when its count reaches zero.
void complete(uct_completion_t* comp, ucs_status_t status) {
  if (comp == nullptr) return;
  if (status != UCS_OK) comp->status = status;
  if (--comp->count == 0) comp->func(comp);
}

template <typename T>
void eraseValue(std::vector<T>& v, const T& x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
}

}  // namespace

// --- Iface ---------------------------------------------------------------------------------------

ucs_status_t Iface::open(uct_md_h uct_md, uct_worker_h worker, const uct_iface_params_t* params,
                         const uct_iface_config_t* uct_config, uct_iface_h* iface_p) noexcept {
  // The device name comes with the open mode (UCT_IFACE_PARAM_FIELD_DEVICE is not always set).
  if (!(params->field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE) ||
      !(params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE) || params->mode.device.dev_name == nullptr) {
    ucs_error("gmd_rc: only device mode interfaces are supported");
    return UCS_ERR_UNSUPPORTED;
  }
  const auto& config = *reinterpret_cast<const IfaceConfig*>(uct_config);
  std::unique_ptr<Iface> iface(new (std::nothrow) Iface());
  if (!iface) return UCS_ERR_NO_MEMORY;

  ucx::BaseIface& base = iface->handle_.base;
  iface->handle_.self = iface.get();
  base.super.ops = ifaceOps();
  base.internal_ops = &uct_base_iface_internal_ops;
  base.md = uct_md;
  base.worker = worker;
  base.prog.id = UCS_CALLBACKQ_ID_NULL;
  base.prog.refcount = 0;
  base.progress_flags = 0;
  if (params->field_mask & UCT_IFACE_PARAM_FIELD_ERR_HANDLER) {
    base.err_handler = params->err_handler;
  }
  if (params->field_mask & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG) {
    base.err_handler_arg = params->err_handler_arg;
  }
  if (params->field_mask & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS) {
    base.err_handler_flags = params->err_handler_flags;
  }
  base.config.num_alloc_methods = 0;
  for (unsigned i = 0; i < config.super.alloc_methods.count && i < UCT_ALLOC_METHOD_LAST; ++i) {
    base.config.alloc_methods[base.config.num_alloc_methods++] =
        config.super.alloc_methods.methods[i];
  }
  base.config.failure_level = static_cast<ucs_log_level_t>(config.super.failure);
  base.config.max_num_eps = config.super.max_num_eps;

  const ucs_status_t st =
      iface->init(Md::from(uct_md), params->mode.device.dev_name, config);
  if (st != UCS_OK) return st;
  *iface_p = iface.release()->handle();
  return UCS_OK;
}

ucs_status_t Iface::init(Md* md, const char* dev_name, const IfaceConfig& config) noexcept {
  md_ = md;
  std::uint8_t port_num = 0;
  if (parsePortName(dev_name, md->name().c_str(), &port_num) != UCS_OK) {
    ucs_error("gmd_rc: device '%s' is not a port of memory domain %s", dev_name,
              md->name().c_str());
    return UCS_ERR_NO_DEVICE;
  }
  if (config.tx_queue_len == 0 || config.tx_cq_len == 0 || config.max_iov == 0 ||
      config.retry_count > 7) {
    ucs_error("gmd_rc %s: UCX_GMD_RC_TX_QUEUE_LEN, _TX_CQ_LEN and _MAX_IOV must be positive and "
              "UCX_GMD_RC_RETRY_COUNT at most 7",
              dev_name);
    return UCS_ERR_INVALID_PARAM;
  }
  if (ucs_status_t st = queryPort(md->context(), md->name(), port_num, config.gid_index, &port_);
      st != UCS_OK) {
    return st;
  }
  const ibv_device_attr& dev = md->deviceAttr();
  settings_.tx_queue_len =
      std::min<unsigned>(config.tx_queue_len, static_cast<unsigned>(std::max(dev.max_qp_wr, 1)));
  settings_.max_send_sge = std::min<unsigned>(
      {config.max_iov, static_cast<unsigned>(std::max(dev.max_sge, 1)), kMaxSge});
  max_read_sge_ = std::min<std::size_t>(
      settings_.max_send_sge, static_cast<std::size_t>(std::max(dev.max_sge_rd, 1)));
  settings_.max_rd_atomic = std::max(
      1u, std::min<unsigned>(config.max_rd_atomic, static_cast<unsigned>(dev.max_qp_init_rd_atom)));
  settings_.max_dest_rd_atomic =
      std::max(1u, static_cast<unsigned>(std::max(dev.max_qp_rd_atom, 1)));
  settings_.timeout = verbsTimeout(config.timeout);
  settings_.retry_count = static_cast<std::uint8_t>(config.retry_count);
  max_msg_ = port_.attr.max_msg_sz;
  if (config.max_read == 0) {
    ucs_error("gmd_rc %s: UCX_GMD_RC_MAX_READ must be positive", dev_name);
    return UCS_ERR_INVALID_PARAM;
  }
  if (config.max_read == UCS_MEMUNITS_AUTO) {
    max_read_ = defaultReadSize(dev, mtuBytes(port_.attr.active_mtu), settings_.max_rd_atomic,
                                max_msg_);
  } else {
    max_read_ = static_cast<std::size_t>(std::min<std::uint64_t>(config.max_read, max_msg_));
  }
  connect_timeout_ = config.connect_timeout;
  latency_ = config.latency;
  overhead_ = config.overhead;

  cq_len_ = std::min<unsigned>(config.tx_cq_len, static_cast<unsigned>(std::max(dev.max_cqe, 1)));
  cq_ = ibv_create_cq(md->context(), static_cast<int>(cq_len_), nullptr, nullptr, 0);
  passive_cq_ = ibv_create_cq(md->context(), 16, nullptr, nullptr, 0);
  if (cq_ == nullptr || passive_cq_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_cq: %s", dev_name, std::strerror(errno));
    return UCS_ERR_NO_RESOURCE;
  }
  tx_free_ = cq_len_;

  try {
    listener_ = std::make_unique<Listener>(dev_name, md->pd(), passive_cq_, port_, settings_);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  if (ucs_status_t st = listener_->start(&listen_port_be_); st != UCS_OK) return st;
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &port_.oob_ipv4_be, ip, sizeof(ip));
  ucs_debug("gmd_rc %s: gid index %d, mtu %zu, RDMA READs of at most %zu bytes, listening on %s:%u",
            dev_name, port_.gid_index, mtuBytes(port_.attr.active_mtu), max_read_, ip,
            ntohs(listen_port_be_));
  return UCS_OK;
}

Iface::~Iface() {
  if (handle_.base.worker != nullptr) {
    uct_base_iface_progress_disable(handle(), UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
  }
  listener_.reset();  // stops the thread; destroys passive QPs
  for (Ep* ep : eps_) release(ep);
  for (Ep* ep : destroyed_) release(ep);
  eps_.clear();
  destroyed_.clear();
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (passive_cq_ != nullptr) ibv_destroy_cq(passive_cq_);
}

ucs_status_t Iface::query(uct_iface_attr_t* attr) noexcept {
  std::memset(attr, 0, sizeof(*attr));
  attr->cap.put.max_zcopy = max_msg_;
  attr->cap.put.min_zcopy = 0;
  attr->cap.put.opt_zcopy_align = 1;
  attr->cap.put.align_mtu = mtuBytes(port_.attr.active_mtu);
  attr->cap.put.max_iov = settings_.max_send_sge;
  attr->cap.get.max_zcopy = max_msg_;
  attr->cap.get.min_zcopy = 0;
  attr->cap.get.opt_zcopy_align = 1;
  attr->cap.get.align_mtu = mtuBytes(port_.attr.active_mtu);
  attr->cap.get.max_iov = max_read_sge_;
  attr->cap.am.max_iov = 1;
  attr->cap.flags = UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_GET_ZCOPY | UCT_IFACE_FLAG_PENDING |
                    UCT_IFACE_FLAG_CONNECT_TO_IFACE;
  attr->cap.event_flags = 0;
  attr->device_addr_len = kDeviceAddressSize;
  attr->iface_addr_len = kIfaceAddressSize;
  attr->ep_addr_len = 0;
  attr->max_conn_priv = 0;
  attr->latency.c = latency_;
  attr->latency.m = 0;
  attr->overhead = overhead_;
  double bw = portBandwidth(port_.attr.active_width, port_.attr.active_speed);
  if (bw == 0) bw = 1e9;  // a port that does not say: assume 10 Gb/s-class
  attr->bandwidth.dedicated = 0;
  attr->bandwidth.shared = bw;
  attr->priority = 0;
  attr->dev_num_paths = 1;
  attr->max_num_eps = handle_.base.config.max_num_eps;
  return UCS_OK;
}

ucs_status_t Iface::deviceAddress(uct_device_addr_t* addr) noexcept {
  DeviceAddress a;
  a.ethernet = port_.ethernet;
  a.lid = port_.attr.lid;
  a.gid = port_.gid;
  packDeviceAddress(a, addr);
  return UCS_OK;
}

ucs_status_t Iface::ifaceAddress(uct_iface_addr_t* addr) noexcept {
  IfaceAddress a;
  a.ipv4_be = port_.oob_ipv4_be;
  a.port_be = listen_port_be_;
  packIfaceAddress(a, addr);
  return UCS_OK;
}

int Iface::isReachable(const uct_device_addr_t* dev_addr,
                       const uct_iface_addr_t* iface_addr) noexcept {
  DeviceAddress d;
  IfaceAddress i;
  if (dev_addr == nullptr || iface_addr == nullptr) return 0;
  if (unpackDeviceAddress(dev_addr, &d) != UCS_OK || unpackIfaceAddress(iface_addr, &i) != UCS_OK) {
    return 0;
  }
  if (d.ethernet != port_.ethernet) return 0;
  // InfiniBand without a router between subnets: same subnet prefix only.
  if (!port_.ethernet && std::memcmp(d.gid.raw, port_.gid.raw, 8) != 0) return 0;
  return 1;
}

ucs_status_t Iface::createEp(const uct_ep_params_t* params, uct_ep_h* ep_p) noexcept {
  constexpr std::uint64_t kNeed = UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
  if ((params->field_mask & kNeed) != kNeed) {
    ucs_error("gmd_rc: endpoints connect to an iface: device and iface addresses are required");
    return UCS_ERR_INVALID_PARAM;
  }
  DeviceAddress dev;
  IfaceAddress peer;
  if (unpackDeviceAddress(params->dev_addr, &dev) != UCS_OK ||
      unpackIfaceAddress(params->iface_addr, &peer) != UCS_OK) {
    ucs_error("gmd_rc: malformed peer address");
    return UCS_ERR_INVALID_ADDR;
  }
  if (eps_.size() >= handle_.base.config.max_num_eps) {
    ucs_error("gmd_rc: too many endpoints (UCX_GMD_RC_MAX_NUM_EPS=%zu)",
              handle_.base.config.max_num_eps);
    return UCS_ERR_EXCEEDS_LIMIT;
  }

  Ep* ep = new (std::nothrow) Ep(this);
  if (ep == nullptr) return UCS_ERR_NO_MEMORY;
  try {
    ep->ring_.assign(settings_.tx_queue_len, nullptr);
    eps_.reserve(eps_.size() + 1);
    connecting_.reserve(connecting_.size() + 1);
  } catch (...) {
    delete ep;
    return UCS_ERR_NO_MEMORY;
  }
  ep->qp_ = createQp(md_->pd(), cq_, settings_, settings_.tx_queue_len);
  if (ep->qp_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_qp: %s", md_->name().c_str(), std::strerror(errno));
    delete ep;
    return UCS_ERR_NO_RESOURCE;
  }
  ep->psn_ = randomPsn();
  ep->fence_epoch_ = fence_epoch_;
  ep->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (ep->fd_ < 0) {
    ucs_error("gmd_rc: socket: %s", std::strerror(errno));
    release(ep);
    return UCS_ERR_IO_ERROR;
  }
  const int one = 1;
  setsockopt(ep->fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = peer.ipv4_be;
  sa.sin_port = peer.port_be;
  if (connect(ep->fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 &&
      errno != EINPROGRESS) {
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &peer.ipv4_be, ip, sizeof(ip));
    ucs_error("gmd_rc: cannot connect to %s:%u: %s", ip, ntohs(peer.port_be),
              std::strerror(errno));
    release(ep);
    return UCS_ERR_UNREACHABLE;
  }
  packHandshake(localHandshake(port_, ep->qp_, ep->psn_), ep->io_buf_);
  ep->deadline_ = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(connect_timeout_));
  eps_.push_back(ep);
  connecting_.push_back(ep);
  *ep_p = ep->handle();
  return UCS_OK;
}

void Iface::destroyEp(Ep* ep) noexcept {
  eraseValue(eps_, ep);
  eraseValue(connecting_, ep);
  eraseValue(failed_, ep);
  if (ep->in_pending_list_) {
    pending_eps_.erase(std::remove(pending_eps_.begin(), pending_eps_.end(), ep),
                       pending_eps_.end());
    ep->in_pending_list_ = false;
  }
  ep->pending_.clear();
  ep->flushes_.clear();
  ep->destroyed_ = true;
  // Close the socket now: the peer's listener destroys its QP.
  if (ep->fd_ >= 0) {
    close(ep->fd_);
    ep->fd_ = -1;
  }
  if (ep->inflight_ == 0 && !in_progress_) {
    release(ep);
    return;
  }
  // Work requests still in the CQ name this endpoint: flush them out and free it when they are in.
  if (ep->inflight_ > 0 && ep->qp_ != nullptr) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(ep->qp_, &a, IBV_QP_STATE);
  }
  destroyed_.push_back(ep);
}

void Iface::release(Ep* ep) noexcept {
  if (ep->qp_ != nullptr && ibv_destroy_qp(ep->qp_) != 0) {
    ucs_warn("gmd_rc: ibv_destroy_qp: %s", std::strerror(errno));
  }
  if (ep->fd_ >= 0) close(ep->fd_);
  delete ep;
}

unsigned Iface::progress() noexcept {
  in_progress_ = true;
  unsigned n = pollCq();
  if (!connecting_.empty()) n += progressConnections();
  if (!pending_eps_.empty() && tx_free_ > 0) n += dispatchPending();
  if (!failed_.empty()) reportFailures();
  in_progress_ = false;
  if (!destroyed_.empty()) reapDestroyed();
  return n;
}

unsigned Iface::pollCq() noexcept {
  ibv_wc wc[16];
  const int n = ibv_poll_cq(cq_, 16, wc);
  if (n <= 0) {
    if (n < 0) ucs_error("gmd_rc %s: ibv_poll_cq failed", md_->name().c_str());
    return 0;
  }
  for (int i = 0; i < n; ++i) {
    Ep* ep = reinterpret_cast<Ep*>(wc[i].wr_id);
    ++tx_free_;
    uct_completion_t* comp = ep->ring_[ep->ring_head_];
    ep->ring_head_ = (ep->ring_head_ + 1) % ep->ring_.size();
    --ep->inflight_;
    ++ep->completed_;
    if (ep->destroyed_) continue;
    ucs_status_t st = wcStatus(wc[i].status);
    if (st != UCS_OK) {
      if (ep->error_ == UCS_OK) {
        ep->error_ = st == UCS_ERR_CANCELED ? UCS_ERR_CONNECTION_RESET : st;
        ep->state_ = Ep::State::kFailed;
        ucs_log(handle_.base.config.failure_level,
                "gmd_rc %s: endpoint %p: %s failed: %s (vendor error 0x%x)", md_->name().c_str(),
                static_cast<void*>(ep), wc[i].opcode == IBV_WC_RDMA_READ ? "RDMA READ" : "RDMA WRITE",
                ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
      }
      st = ep->error_;
      if (!ep->error_reported_) {
        ep->error_reported_ = true;
        failed_.push_back(ep);
      }
    }
    // Flush waiters covered by this completion, then the operation's own completion. Callbacks
    // may post, flush or destroy this endpoint; destruction is deferred to the end of progress.
    complete(comp, st);
    while (!ep->flushes_.empty() && ep->flushes_.front().sn <= ep->completed_) {
      uct_completion_t* f = ep->flushes_.front().comp;
      ep->flushes_.pop_front();
      complete(f, ep->error_);
    }
    if (ep->in_pending_list_ == false && !ep->pending_.empty()) schedulePending(ep);
  }
  return static_cast<unsigned>(n);
}

unsigned Iface::progressConnections() noexcept {
  pollfd fds[32];
  const std::size_t n = std::min<std::size_t>(connecting_.size(), 32);
  for (std::size_t i = 0; i < n; ++i) {
    fds[i] = {connecting_[i]->fd_, static_cast<short>(connecting_[i]->request_sent_ ? POLLIN : POLLOUT), 0};
  }
  const int ready = poll(fds, n, 0);
  if (ready < 0) return 0;
  // Copy: stepConnection removes entries from connecting_.
  Ep* eps[32];
  std::copy(connecting_.begin(), connecting_.begin() + static_cast<std::ptrdiff_t>(n), eps);
  const auto now = std::chrono::steady_clock::now();
  unsigned done = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (fds[i].revents != 0) {
      stepConnection(eps[i], fds[i].revents);
      ++done;
    } else if (now > eps[i]->deadline_) {
      connectionFailed(eps[i], UCS_ERR_UNREACHABLE, "timed out (UCX_GMD_RC_CONNECT_TIMEOUT)");
    }
  }
  return done;
}

void Iface::stepConnection(Ep* ep, short revents) noexcept {
  if (!ep->request_sent_) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(ep->fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      connectionFailed(ep, UCS_ERR_UNREACHABLE, std::strerror(err));
      return;
    }
    while (ep->io_done_ < kHandshakeSize) {
      const ssize_t w =
          send(ep->fd_, ep->io_buf_ + ep->io_done_, kHandshakeSize - ep->io_done_, MSG_NOSIGNAL);
      if (w > 0) {
        ep->io_done_ += static_cast<std::size_t>(w);
      } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
      } else {
        connectionFailed(ep, UCS_ERR_UNREACHABLE, std::strerror(errno));
        return;
      }
    }
    ep->request_sent_ = true;
    ep->io_done_ = 0;
    return;
  }
  (void)revents;
  while (ep->io_done_ < kHandshakeSize) {
    const ssize_t r = recv(ep->fd_, ep->io_buf_ + ep->io_done_, kHandshakeSize - ep->io_done_, 0);
    if (r > 0) {
      ep->io_done_ += static_cast<std::size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      return;
    } else {
      connectionFailed(ep, UCS_ERR_UNREACHABLE,
                       r == 0 ? "the peer closed the connection" : std::strerror(errno));
      return;
    }
  }
  Handshake reply;
  if (unpackHandshake(ep->io_buf_, &reply) != UCS_OK) {
    connectionFailed(ep, UCS_ERR_UNREACHABLE, "malformed handshake reply");
    return;
  }
  if (reply.status != 0) {
    connectionFailed(ep, UCS_ERR_UNREACHABLE, "the peer refused the connection");
    return;
  }
  connectionReady(ep, reply);
}

void Iface::connectionReady(Ep* ep, const Handshake& reply) noexcept {
  std::string why;
  if (connectQp(ep->qp_, port_, settings_, false, reply, ep->psn_, &why) != UCS_OK) {
    connectionFailed(ep, UCS_ERR_UNREACHABLE, why.c_str());
    return;
  }
  eraseValue(connecting_, ep);
  ep->state_ = Ep::State::kReady;
  ucs_debug("gmd_rc %s: endpoint %p connected, QP 0x%x to 0x%x", md_->name().c_str(),
            static_cast<void*>(ep), ep->qp_->qp_num, reply.qpn);
  if (!ep->pending_.empty()) schedulePending(ep);
}

void Iface::connectionFailed(Ep* ep, ucs_status_t status, const char* why) noexcept {
  eraseValue(connecting_, ep);
  ep->state_ = Ep::State::kFailed;
  ep->error_ = status;
  ucs_error("gmd_rc %s: endpoint %p cannot connect: %s", md_->name().c_str(),
            static_cast<void*>(ep), why);
  if (!ep->error_reported_) {
    ep->error_reported_ = true;
    failed_.push_back(ep);
  }
}

void Iface::schedulePending(Ep* ep) noexcept {
  if (ep->in_pending_list_) return;
  try {
    pending_eps_.push_back(ep);
    ep->in_pending_list_ = true;
  } catch (...) {
    ucs_error("gmd_rc: out of memory scheduling pending requests");
  }
}

unsigned Iface::dispatchPending() noexcept {
  unsigned n = 0;
  std::size_t rounds = pending_eps_.size();
  while (rounds-- > 0 && !pending_eps_.empty() && tx_free_ > 0) {
    Ep* ep = pending_eps_.front();
    pending_eps_.pop_front();
    ep->in_pending_list_ = false;
    bool keep = false;
    while (!ep->pending_.empty()) {
      // Out of credits: a completion reschedules it; connecting: connectionReady() does; failed:
      // the user purges.
      if (!ep->canPost()) break;
      uct_pending_req_t* req = ep->pending_.front();
      const ucs_status_t st = req->func(req);
      if (ep->destroyed_) break;
      if (st == UCS_OK) {
        ep->pending_.pop_front();
        ++n;
      } else if (st == UCS_INPROGRESS) {
        ++n;
        keep = true;
        break;
      } else {
        break;
      }
    }
    if (keep && !ep->destroyed_) schedulePending(ep);
  }
  return n;
}

void Iface::reportFailures() noexcept {
  std::vector<Ep*> failed;
  failed.swap(failed_);
  for (Ep* ep : failed) {
    if (ep->destroyed_) continue;
    if (handle_.base.err_handler == nullptr) continue;  // logged where it failed
    uct_iface_handle_ep_err(handle(), ep->handle(), ep->error_);
  }
}

void Iface::reapDestroyed() noexcept {
  auto it = std::partition(destroyed_.begin(), destroyed_.end(),
                           [](Ep* ep) { return ep->inflight_ > 0; });
  for (auto i = it; i != destroyed_.end(); ++i) release(*i);
  destroyed_.erase(it, destroyed_.end());
}

ucs_status_t Iface::flush(unsigned flags, uct_completion_t* comp) noexcept {
  if (comp != nullptr) return UCS_ERR_UNSUPPORTED;
  (void)flags;
  if (!connecting_.empty()) return UCS_INPROGRESS;
  for (Ep* ep : eps_) {
    if (ep->inflight_ > 0 || !ep->pending_.empty()) return UCS_INPROGRESS;
  }
  return UCS_OK;
}

ucs_status_t Iface::fence() noexcept {
  ++fence_epoch_;
  return UCS_OK;
}

// --- Ep ------------------------------------------------------------------------------------------

Ep::Ep(Iface* iface) : iface_(iface) {
  handle_.super.iface = iface->handle();
  handle_.self = this;
}

Ep::~Ep() = default;

bool Ep::canPost() const noexcept {
  return state_ == State::kReady && ring_.size() - inflight_ >= need_slots_ &&
         iface_->tx_free_ >= need_slots_;
}

ucs_status_t Ep::rdma(ibv_wr_opcode opcode, const uct_iov_t* iov, std::size_t iovcnt,
                      std::uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t* comp) noexcept {
  if (error_ != UCS_OK) return error_;
  if (state_ != State::kReady) return UCS_ERR_NO_RESOURCE;
  if (iovcnt > iface_->maxIov(opcode)) {
    ucs_error("gmd_rc: %zu iov entries, at most %zu", iovcnt, iface_->maxIov(opcode));
    return UCS_ERR_INVALID_PARAM;
  }
  ibv_sge sge[kMaxSge];
  int nsge = 0;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < iovcnt; ++i) {
    const std::size_t len = iov[i].length * iov[i].count;
    if (len == 0) continue;
    if (iov[i].memh == UCT_MEM_HANDLE_NULL) {
      ucs_error("gmd_rc: zero-copy buffer %p without a memory handle", iov[i].buffer);
      return UCS_ERR_INVALID_PARAM;
    }
    if (iov[i].count > 1 && iov[i].stride != iov[i].length && iov[i].stride != 0) {
      ucs_error("gmd_rc: strided iov entries are not supported");
      return UCS_ERR_UNSUPPORTED;
    }
    sge[nsge].addr = reinterpret_cast<std::uintptr_t>(iov[i].buffer);
    sge[nsge].length = static_cast<std::uint32_t>(len);
    sge[nsge].lkey = static_cast<const rcache::Region*>(iov[i].memh)->registration().lkey;
    ++nsge;
    total += len;
  }
  if (nsge == 0) return UCS_OK;
  if (total > iface_->max_msg_) {
    ucs_error("gmd_rc: %llu bytes exceed the port's maximal message size %llu",
              static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(iface_->max_msg_));
    return UCS_ERR_INVALID_PARAM;
  }

  // A READ larger than the iface's READ size goes out as several work requests; only the last
  // carries the caller's completion (RC completes them in order, and a failure of any fails the
  // endpoint, so the last one's status is the operation's).
  std::uint64_t part = total;
  std::size_t nwr = 1;
  if (opcode == IBV_WR_RDMA_READ && total > iface_->readSize()) {
    const std::size_t most = std::min<std::size_t>(ring_.size(), iface_->cq_len_);
    part = iface_->readSize();
    nwr = static_cast<std::size_t>((total + part - 1) / part);
    if (nwr > most) {  // a short send queue: fewer, larger READs
      part = (total + most - 1) / most;
      nwr = static_cast<std::size_t>((total + part - 1) / part);
    }
  }
  need_slots_ = nwr;  // what pendingAdd/dispatch wait for when refused now
  if (!canPost()) return UCS_ERR_NO_RESOURCE;
  need_slots_ = 1;
  const auto rkey32 = static_cast<std::uint32_t>(rkey);
  if (nwr == 1) return postOne(opcode, sge, nsge, remote_addr, rkey32, comp);

  ibv_sge piece[kMaxSge];
  int cur = 0;             // sge[cur] is being split
  std::uint32_t used = 0;  // bytes of sge[cur] already posted
  std::uint64_t done = 0;
  for (std::size_t w = 0; w < nwr; ++w) {
    std::uint64_t want = std::min(part, total - done);
    const std::uint64_t len = want;
    int n = 0;
    while (want > 0) {
      const auto take =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(want, sge[cur].length - used));
      piece[n] = sge[cur];
      piece[n].addr += used;
      piece[n].length = take;
      ++n;
      used += take;
      want -= take;
      if (used == sge[cur].length) {
        ++cur;
        used = 0;
      }
    }
    const ucs_status_t st = postOne(opcode, piece, n, remote_addr + done, rkey32,
                                    w + 1 == nwr ? comp : nullptr);
    if (st != UCS_INPROGRESS) {
      // The READs already posted complete without a callback; the operation as a whole failed.
      return w == 0 ? st : UCS_ERR_IO_ERROR;
    }
    done += len;
  }
  return UCS_INPROGRESS;
}

ucs_status_t Ep::postOne(ibv_wr_opcode opcode, ibv_sge* sge, int nsge, std::uint64_t remote_addr,
                         std::uint32_t rkey, uct_completion_t* comp) noexcept {
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = reinterpret_cast<std::uintptr_t>(this);
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = opcode;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (fence_ || fence_epoch_ != iface_->fenceEpoch()) {
    wr.send_flags |= IBV_SEND_FENCE;
    fence_ = false;
    fence_epoch_ = iface_->fenceEpoch();
  }
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    ucs_error("gmd_rc: ibv_post_send: %s", std::strerror(rc));
    return rc == ENOMEM ? UCS_ERR_NO_RESOURCE : UCS_ERR_IO_ERROR;
  }
  ring_[(ring_head_ + inflight_) % ring_.size()] = comp;
  ++inflight_;
  ++posted_;
  --iface_->tx_free_;
  return UCS_INPROGRESS;
}

ucs_status_t Ep::pendingAdd(uct_pending_req_t* req, unsigned) noexcept {
  if (pending_.empty() && (canPost() || state_ == State::kFailed)) return UCS_ERR_BUSY;
  try {
    pending_.push_back(req);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  if (canPost()) iface_->schedulePending(this);
  return UCS_OK;
}

void Ep::pendingPurge(uct_pending_purge_callback_t cb, void* arg) noexcept {
  std::deque<uct_pending_req_t*> reqs;
  reqs.swap(pending_);
  for (uct_pending_req_t* req : reqs) {
    if (cb != nullptr) cb(req, arg);
  }
}

ucs_status_t Ep::flush(unsigned flags, uct_completion_t* comp) noexcept {
  if (flags & UCT_FLUSH_FLAG_CANCEL) {
    pending_.clear();
    if (inflight_ > 0 && qp_ != nullptr) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      ibv_modify_qp(qp_, &a, IBV_QP_STATE);
      if (error_ == UCS_OK) {
        error_ = UCS_ERR_CANCELED;
        state_ = State::kFailed;
        error_reported_ = true;  // the caller asked for it
      }
    }
  } else if (!pending_.empty()) {
    return UCS_ERR_NO_RESOURCE;
  }
  if (inflight_ == 0) return UCS_OK;
  if (comp != nullptr) {
    try {
      flushes_.push_back({posted_, comp});
    } catch (...) {
      return UCS_ERR_NO_MEMORY;
    }
  }
  return UCS_INPROGRESS;
}

ucs_status_t Ep::fence() noexcept {
  fence_ = true;
  return UCS_OK;
}

}  // namespace gmd::md::rc
