#include "md/rc/rc_iface.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <string>

#include "md/abi/edge.h"
#include "md/md.h"
#include "md/rc/rc_listener.h"

namespace gmd::md::rc {
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

// Send CQ entries beyond TX_CQ_LEN, for the zero-length WRITEs a destroyed endpoint may need.
constexpr long kCqReserve = 64;
// am_short messages up to this size go through a bounce buffer when they cannot go inline.
constexpr std::size_t kShortViaBounce = 256;
// Largest am_zcopy header (UCP's headers are a few tens of bytes).
constexpr std::size_t kMaxAmHeader = 128;

// The handler of an AM id nobody set: drop the message.
ucs_status_t stubAmHandler(void* arg, void*, size_t length, unsigned) noexcept {
  ucs_warn("gmd_rc: dropped an active message with id %u (%zu bytes): no handler",
           static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(arg)), length);
  return UCS_OK;
}

// UCP weighs transports by the latency, bandwidth and overhead they report and, before it selects
// lanes, closes every iface that another one on the same device dominates (all its capabilities,
// overhead <=, bandwidth >=, latency <= with ties broken by priority). gmd_rc therefore reports
// the port's figures exactly as UCX's own IB transports derive them from the port attributes
// (signalling rate, width, encoding, per-packet headers; RoCE adds 200 ns and its own headers),
// plus 1 ns per endpoint (one QP each, as UCX's rc_verbs) and rc_verbs' 75 ns software overhead
// (UCX_GMD_RC_OVERHEAD), with a priority above any device's, so that on equal figures UCP keeps
// gmd_rc and closes rc_verbs.
struct PortModel {
  double latency;    // seconds, one way, before UCX_GMD_RC_LATENCY
  double bandwidth;  // bytes per second
};

PortModel portModel(const ibv_port_attr& a, bool ethernet, std::size_t seg_size) noexcept {
  // Header bytes per packet (InfiniBand Architecture Specification): base transport header,
  // RDMA extended header (the largest transport header gmd_rc sends), invariant and variant CRC,
  // delimiters; local route header on InfiniBand, global route and Ethernet headers on RoCE.
  constexpr std::size_t kBth = 12, kReth = 16, kIcrc = 4, kVcrc = 2, kDelim = 2, kLrh = 8,
                        kGrh = 40, kEth = 14;
  int width = 1;  // active_width codes 1, 2, 4, 8, 16 are 1x, 4x, 8x, 12x, 2x
  switch (a.active_width) {
    case 1: width = 1; break;
    case 2: width = 4; break;
    case 4: width = 8; break;
    case 8: width = 12; break;
    case 16: width = 2; break;
    default: break;  // unknown: 1x, as UCX assumes
  }
  double latency = 5000e-9, signal_rate = 2.5e9, encoding = 8.0 / 10.0;  // SDR and unknown
  switch (a.active_speed) {
    case 2: latency = 2500e-9; signal_rate = 5.0e9; break;  // DDR
    case 4:                                                  // QDR, or 10/40 GbE on RoCE
      latency = 1300e-9;
      signal_rate = ethernet ? 10.3125e9 : 10.0e9;
      encoding = ethernet ? 64.0 / 66.0 : 8.0 / 10.0;
      break;
    case 8: latency = 700e-9; signal_rate = 10.3125e9; encoding = 64.0 / 66.0; break;  // FDR10
    case 16: latency = 700e-9; signal_rate = 14.0625e9; encoding = 64.0 / 66.0; break;  // FDR
    case 32: latency = 600e-9; signal_rate = 25.78125e9; encoding = 64.0 / 66.0; break;  // EDR
    case 64: latency = 600e-9; signal_rate = 25.78125e9 * 2; encoding = 64.0 / 66.0; break;
    case 128: latency = 600e-9; signal_rate = 100e9; encoding = 64.0 / 66.0; break;  // NDR
    default: break;
  }
  // Same operations in the same order as UCX, so that equal ports give bit-equal figures.
  const double wire_speed = (width * signal_rate * encoding) / 8.0;
  const std::size_t mtu = std::min(mtuBytes(a.active_mtu), seg_size);
  std::size_t extra = kBth + kReth + kIcrc + kVcrc + kDelim;
  if (ethernet) {
    extra += kGrh + kEth;
    latency += 200e-9;
  } else {
    extra += kLrh;
  }
  return {latency, (wire_speed * static_cast<double>(mtu)) / static_cast<double>(mtu + extra)};
}

// Above the priority UCX gives any device (its table tops out well below this).
constexpr std::uint8_t kPriority = 255;
// Latency added per endpoint, as UCX's rc_verbs reports (one QP each).
constexpr double kLatencyPerEp = 1e-9;

// uct_iface_params_t's receive alignment (fields present in every UCX gmd supports, 1.13 on): an
// alignment is a power of two (not 0) and an offset needs an alignment, else UCS_ERR_INVALID_PARAM
// and one error line. An offset at or above the alignment is taken modulo it (the same placement),
// with a diag line, as UCX's transports let it pass: UCP passes its AM header's 8 bytes whatever
// alignment its user asked for.
ucs_status_t amAlignment(const uct_iface_params_t* params, std::size_t* align,
                         std::size_t* offset) noexcept {
  const bool has_align = (params->field_mask & UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT) != 0;
  const bool has_offset = (params->field_mask & UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET) != 0;
  *align = 1;
  *offset = 0;
  if (!has_align) {
    if (has_offset) {
      ucs_error("gmd_rc: am_align_offset %zu given without am_alignment", params->am_align_offset);
      return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
  }
  const std::size_t a = params->am_alignment;
  if (a == 0 || (a & (a - 1)) != 0) {
    ucs_error("gmd_rc: am_alignment %zu is not a power of two", a);
    return UCS_ERR_INVALID_PARAM;
  }
  std::size_t o = has_offset ? params->am_align_offset : 0;
  if (o >= a) {
    ucs_diag("gmd_rc: am_align_offset %zu is not below am_alignment %zu: %zu has the same effect",
             o, a, o % a);
    o %= a;
  }
  *align = a;
  *offset = o;
  return UCS_OK;
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
  std::size_t am_align = 1, am_align_offset = 0;
  if (ucs_status_t st = amAlignment(params, &am_align, &am_align_offset); st != UCS_OK) return st;
  const auto& config = *reinterpret_cast<const IfaceConfig*>(uct_config);
  std::unique_ptr<Iface> iface(new (std::nothrow) Iface());
  if (!iface) return UCS_ERR_NO_MEMORY;

  ucx::BaseIface& base = iface->handle_.base;
  iface->handle_.self = iface.get();
  base.super.ops = ifaceOps();
  base.internal_ops = ifaceInternalOps();
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
  for (unsigned id = 0; id < UCT_AM_ID_MAX; ++id) {
    base.am[id] = {stubAmHandler, reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)), 0};
  }
  if (params->field_mask & UCT_IFACE_PARAM_FIELD_RX_HEADROOM) {
    iface->rx_headroom_ = params->rx_headroom;
  }
  iface->am_align_ = am_align;
  iface->am_align_offset_ = am_align_offset;

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
  if (ucs_status_t st = queryPort(md->context(), md->name(), port_num, config.gid_index, &port_);
      st != UCS_OK) {
    return st;
  }
  if (ucs_status_t st = deriveLimits(config, md->deviceAttr(), port_.attr, dev_name, &limits_);
      st != UCS_OK) {
    return st;
  }
  // Each endpoint is a QP of the device (and one more on the peer's): never more than it has.
  handle_.base.config.max_num_eps =
      std::min<std::size_t>(handle_.base.config.max_num_eps,
                            static_cast<std::size_t>(std::max(md->deviceAttr().max_qp, 1)));
  connect_timeout_ = config.connect_timeout;
  latency_ = config.latency;
  overhead_ = config.overhead;

  channel_ = ibv_create_comp_channel(md->context());
  if (channel_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_comp_channel: %s", dev_name, std::strerror(errno));
    return UCS_ERR_NO_RESOURCE;
  }
  if (const int fl = fcntl(channel_->fd, F_GETFL);
      fl < 0 || fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    ucs_error("gmd_rc %s: cannot make the event fd non-blocking: %s", dev_name,
              std::strerror(errno));
    return UCS_ERR_IO_ERROR;
  }
  cq_ = ibv_create_cq(md->context(), static_cast<int>(limits_.cq_len + kCqReserve), nullptr,
                      channel_, 0);
  if (cq_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_cq: %s", dev_name, std::strerror(errno));
    return UCS_ERR_NO_RESOURCE;
  }
  tx_free_ = limits_.cq_len;
  try {
    send_backlog_.reserve(16);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  // The receive path keeps the name for its logs: the MD's, which lives as long as the iface
  // (dev_name is the caller's and may go once uct_iface_open returns).
  if (ucs_status_t st = recv_.init(this, &handle_.base, md->context(), &md->events(), md->pd(),
                                   channel_, limits_, rx_headroom_, am_align_, am_align_offset_,
                                   name());
      st != UCS_OK) {
    return st;
  }
  // A little slack after each: a packer that writes past max_bcopy is refused, not fatal.
  if (ucs_status_t st = bounce_.init(md->pd(), limits_.tx_bounce, limits_.seg_size + 64,
                                     "send bounce buffers", dev_name);
      st != UCS_OK) {
    return st;
  }
  // What the device really sends inline: ask a throw-away QP (retry without inline if refused).
  unsigned got = 0;
  const QpQueues queues{cq_, recv_.cq(), recv_.srq()};
  ibv_qp* probe = createQp(md->pd(), queues, limits_.qp, 1, limits_.tx_max_inline, &got);
  if (probe == nullptr && limits_.tx_max_inline > 0) {
    limits_.tx_max_inline = 0;
    probe = createQp(md->pd(), queues, limits_.qp, 1, 0, &got);
  }
  if (probe == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_qp: %s", dev_name, std::strerror(errno));
    return UCS_ERR_NO_RESOURCE;
  }
  ibv_destroy_qp(probe);
  tx_inline_ = std::min<std::size_t>(got, limits_.tx_max_inline);
  if (ucs_status_t st = peer_watch_.init(dev_name); st != UCS_OK) return st;

  try {
    // Passive QPs send only grants, completed on the receive CQ (md/rc/rc_recv.h).
    const QpQueues passive{recv_.cq(), recv_.cq(), recv_.srq()};
    listener_ = std::make_unique<Listener>(dev_name, md->pd(), passive, &recv_.handoff(), port_,
                                           limits_.qp);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  if (ucs_status_t st = listener_->start(&listen_port_be_); st != UCS_OK) return st;
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &port_.oob_ipv4_be, ip, sizeof(ip));
  ucs_debug("gmd_rc %s: gid index %d, mtu %zu, RDMA READs of at most %zu bytes, listening on %s:%u",
            dev_name, port_.gid_index, mtuBytes(port_.attr.active_mtu), limits_.max_read, ip,
            ntohs(listen_port_be_));
  return UCS_OK;
}

const char* Iface::name() const noexcept { return md_->name().c_str(); }

Iface::~Iface() {
  if (handle_.base.worker != nullptr) {
    uct_base_iface_progress_disable(handle(), UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
  }
  listener_.reset();  // stops the thread
  for (Ep* ep : eps_) release(ep);
  for (Ep* ep : destroyed_) release(ep);
  eps_.clear();
  destroyed_.clear();
  links_.clear();    // closes them
  recv_.shutdown();  // passive QPs, SRQ, receive CQ
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
}

std::size_t Iface::amMaxShort() const noexcept {
  // Inline where the device allows, else through a bounce buffer; never above a receive buffer.
  return std::min(std::max<std::size_t>(tx_inline_, kShortViaBounce), limits_.seg_size);
}

std::size_t Iface::amMaxHdr() const noexcept {
  return std::min(kMaxAmHeader, limits_.seg_size / 4);
}

std::size_t Iface::amMaxZcopy() const noexcept { return limits_.seg_size - amMaxHdr(); }

ucs_status_t Iface::query(uct_iface_attr_t* attr) noexcept {
  std::memset(attr, 0, sizeof(*attr));
  attr->cap.put.max_zcopy = limits_.max_msg;
  attr->cap.put.min_zcopy = 0;
  attr->cap.put.opt_zcopy_align = 1;
  attr->cap.put.align_mtu = mtuBytes(port_.attr.active_mtu);
  attr->cap.put.max_iov = limits_.qp.max_send_sge;
  attr->cap.get.max_zcopy = limits_.max_msg;
  attr->cap.get.min_zcopy = 0;
  attr->cap.get.opt_zcopy_align = 1;
  attr->cap.get.align_mtu = mtuBytes(port_.attr.active_mtu);
  attr->cap.get.max_iov = limits_.max_read_sge;
  // UCT counts am_short's 8-byte header in max_short (as rc_verbs): exactly what amShort accepts.
  attr->cap.am.max_short = amMaxShort();
  attr->cap.am.max_bcopy = limits_.seg_size;
  attr->cap.am.min_zcopy = 0;
  attr->cap.am.max_zcopy = amMaxZcopy();
  attr->cap.am.opt_zcopy_align = 1;
  attr->cap.am.align_mtu = mtuBytes(port_.attr.active_mtu);
  attr->cap.am.max_hdr = amMaxHdr();
  attr->cap.am.max_iov = amMaxIov();
  attr->cap.flags = UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_GET_ZCOPY | UCT_IFACE_FLAG_AM_SHORT |
                    UCT_IFACE_FLAG_AM_BCOPY | UCT_IFACE_FLAG_AM_ZCOPY | UCT_IFACE_FLAG_PENDING |
                    UCT_IFACE_FLAG_CB_SYNC | UCT_IFACE_FLAG_CONNECT_TO_IFACE |
                    // a dead peer fails outstanding work and calls the error handler once
                    // (md/rc/rc_peer_watch.h); uct_ep_check probes it
                    UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE | UCT_IFACE_FLAG_EP_CHECK;
#ifdef UCT_IFACE_FLAG_INTER_NODE
  // UCX 1.18 on: reaches other hosts. Without it UCP treats gmd_rc as intra-node (a worker's
  // net-only address leaves it out) and never closes rc_verbs for it, which has the flag.
  attr->cap.flags |= UCT_IFACE_FLAG_INTER_NODE;
#endif
  attr->cap.event_flags =
      UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV | UCT_IFACE_FLAG_EVENT_FD;
  attr->device_addr_len = kDeviceAddressSize;
  attr->iface_addr_len = kIfaceAddressSize;
  attr->ep_addr_len = 0;
  attr->max_conn_priv = 0;
  const PortModel model = portModel(port_.attr, port_.ethernet, limits_.seg_size);
  attr->latency.c = model.latency + latency_;
  attr->latency.m = kLatencyPerEp;
  attr->overhead = overhead_;
  attr->bandwidth.dedicated = 0;
  attr->bandwidth.shared = model.bandwidth;
  attr->priority = kPriority;
  attr->dev_num_paths = 1;
  attr->max_num_eps = handle_.base.config.max_num_eps;
  // --- Small RMA and atomics (md/rc/rc_rma.cc, md/rc/rc_atomic.cc) ---
  queryRma(attr);
  queryAtomics(attr);
  // --- End of small RMA and atomics ---
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
  ep->peer_dev_ = dev;
  ep->peer_iface_ = peer;
  try {
    ep->ring_.assign(limits_.qp.tx_queue_len, Ep::Slot{nullptr, -1});
    eps_.reserve(eps_.size() + 1);
    connecting_.reserve(connecting_.size() + 1);
    by_qpn_.reserve(by_qpn_.size() + 1);
  } catch (...) {
    delete ep;
    return UCS_ERR_NO_MEMORY;
  }
  ep->qp_ = createQp(md_->pd(), {cq_, recv_.cq(), recv_.srq()}, limits_.qp,
                     limits_.qp.tx_queue_len, limits_.tx_max_inline);
  if (ep->qp_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_qp: %s", name(), std::strerror(errno));
    delete ep;
    return UCS_ERR_NO_RESOURCE;
  }
  by_qpn_.emplace(ep->qp_->qp_num, ep);  // room reserved above
  ep->fc_credits_ = limits_.fc_wnd;
  ep->psn_ = randomPsn();
  ep->fence_epoch_ = fence_epoch_;
  PeerLink* link = linkTo(peer);
  if (link == nullptr) {
    release(ep);
    return UCS_ERR_UNREACHABLE;
  }
  bool queued = false;
  try {
    link->eps.reserve(link->eps.size() + 1);
    link->waiting.push_back(ep);
    queued = link->link.queue(localHandshake(port_, ep->qp_, ep->psn_));
    if (!queued) link->waiting.pop_back();
  } catch (...) {
  }
  if (!queued) {
    if (link->eps.empty()) dropLink(link);
    release(ep);
    return UCS_ERR_NO_MEMORY;
  }
  link->eps.push_back(ep);  // room reserved above
  ep->link_ = link;
  ep->connect_deadline_ = std::chrono::steady_clock::now() +
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
  ep->destroyed_ = true;
  // Tell the peer now (a release frame, or closing the link if it was the last): its listener
  // destroys the passive QP. The QP number stays ours until release(), so no new endpoint's request
  // can overtake the release with the same number.
  leaveLink(ep, true);
  // Work requests still in the CQ name this endpoint: flush them out and free it when they are in.
  // An unsignaled newest one may have completed silently: a signaled one after it retires it.
  if (ep->inflight_ > 0 && ep->qp_ != nullptr) {
    if (ep->state_ == Ep::State::kReady && ep->unsignaledTail()) ep->postNop(true);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(ep->qp_, &a, IBV_QP_STATE);
  }
  // Every outstanding completion is called (UCS_ERR_CANCELED) before uct_ep_destroy returns, after
  // the QP stopped working on the caller's buffers; the slots then hold none.
  ep->cancelOutstanding();
  if (ep->inflight_ == 0 && !in_progress_) {
    release(ep);
    return;
  }
  destroyed_.push_back(ep);
}

void Iface::release(Ep* ep) noexcept {
  // Bounce buffers of work requests that will never complete (iface close).
  while (ep->inflight_ > 0) {
    const Ep::Slot& slot = ep->ring_[ep->ring_head_];
    if (slot.bounce >= 0) bounce_.put(static_cast<std::uint32_t>(slot.bounce));
    ep->ring_head_ = (ep->ring_head_ + 1) % ep->ring_.size();
    --ep->inflight_;
    ++tx_free_;
  }
  if (ep->qp_ != nullptr) {
    by_qpn_.erase(ep->qp_->qp_num);
    if (ibv_destroy_qp(ep->qp_) != 0) ucs_warn("gmd_rc: ibv_destroy_qp: %s", std::strerror(errno));
  }
  delete ep;  // closes its socket
}

unsigned Iface::progress() noexcept {
  in_progress_ = true;
  unsigned n = recv_.progress();
  // As UCX's rc_verbs: the send CQ only when nothing was received, unless send credits run low or
  // an endpoint waits for them (a receive-heavy peer must not starve its own sends).
  if (n == 0 || starved_ || tx_free_ < static_cast<long>(limits_.cq_len / 2)) n += pollCq();
  if (!connecting_.empty() || link_output_) n += progressConnections();
  if (peer_watch_.due()) {
    n += peer_watch_.check([this](void* link) {
      linkFailed(static_cast<PeerLink*>(link), "the peer closed the connection");
    });
  }
  if (!pending_eps_.empty() && tx_free_ > 0) n += dispatchPending();
  if (!failed_.empty()) reportFailures();
  in_progress_ = false;
  if (!destroyed_.empty()) reapDestroyed();
  return n;
}

unsigned Iface::pollCq() noexcept {
  unsigned n = 0;
  if (!send_backlog_.empty()) {
    std::vector<ibv_wc> kept;
    kept.swap(send_backlog_);
    for (const ibv_wc& wc : kept) handleSendCompletion(wc);
    n += static_cast<unsigned>(kept.size());
    kept.clear();
    if (send_backlog_.empty()) send_backlog_.swap(kept);  // keep the capacity
  }
  ibv_wc wc[16];
  const int k = ibv_poll_cq(cq_, 16, wc);
  if (k < 0) ucs_error("gmd_rc %s: ibv_poll_cq failed", name());
  for (int i = 0; i < k; ++i) handleSendCompletion(wc[i]);
  if (k > 0) n += static_cast<unsigned>(k);
  if (starved_ && n > 0) wakePending();
  return n;
}

void Iface::handleSendCompletion(const ibv_wc& wc) noexcept {
  const auto it = by_qpn_.find(wc.qp_num);
  if (it == by_qpn_.end()) {
    ucs_debug("gmd_rc %s: completion of unknown QP 0x%x", name(), wc.qp_num);
    return;
  }
  Ep* ep = it->second;
  ucs_status_t st = wcStatus(wc.status);
  if (st != UCS_OK && !ep->destroyed_) {
    if (ep->fail(st == UCS_ERR_CANCELED ? UCS_ERR_CONNECTION_RESET : st)) {
      ucs_log(handle_.base.config.failure_level,
              "gmd_rc %s: endpoint %p: work request failed: %s (vendor error 0x%x)", name(),
              static_cast<void*>(ep), ibv_wc_status_str(wc.status), wc.vendor_err);
    }
    st = ep->error_;
    failed(ep);
  }
  ep->retire(wc.wr_id, st);
  if (!ep->destroyed_ && !ep->in_pending_list_ && !ep->pending_.empty()) schedulePending(ep);
}

void Iface::creditsGranted(std::uint32_t qpn, unsigned credits) noexcept {
  const auto it = by_qpn_.find(qpn);
  if (it == by_qpn_.end() || it->second->destroyed_) return;
  it->second->creditsGranted(credits);
}

void Iface::starved(bool bounce) noexcept {
  starved_ = true;
  if (!bounce || bounce_starved_) return;
  bounce_starved_ = true;
  // Unsignaled work requests hold bounce buffers until a later completion: make sure one comes.
  for (Ep* ep : eps_) {
    if (ep->state_ == Ep::State::kReady && ep->unsignaledTail()) ep->postNop(false);
  }
}

void Iface::releaseBounce(std::uint32_t b) noexcept {
  bounce_.put(b);
  if (bounce_starved_) {
    bounce_starved_ = false;
    wakePending();
  }
}

void Iface::wakePending() noexcept {
  starved_ = false;
  for (Ep* ep : eps_) {
    if (!ep->pending_.empty() && !ep->in_pending_list_ && ep->canPost()) schedulePending(ep);
  }
}

void Iface::reapDestroyed() noexcept {
  auto it = std::partition(destroyed_.begin(), destroyed_.end(),
                           [](Ep* ep) { return ep->inflight_ > 0; });
  for (auto i = it; i != destroyed_.end(); ++i) release(*i);
  destroyed_.erase(it, destroyed_.end());
}

ucs_status_t Iface::eventFd(int* fd) noexcept {
  *fd = channel_->fd;
  return UCS_OK;
}

bool Iface::hasWork() const noexcept {
  if (!send_backlog_.empty() || !connecting_.empty() || link_output_ || !failed_.empty() ||
      recv_.hasWork()) {
    return true;
  }
  for (const Ep* ep : pending_eps_) {
    if (ep->canPost()) return true;
  }
  return false;
}

ucs_status_t Iface::eventArm(unsigned events) noexcept {
  // Consume the notifications that woke the caller (each CQ needs re-arming after one).
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  while (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
  if (hasWork()) return UCS_ERR_BUSY;
  if (events & UCT_EVENT_SEND_COMP) {
    if (ibv_req_notify_cq(cq_, 0) != 0) {
      ucs_error("gmd_rc %s: ibv_req_notify_cq: %s", name(), std::strerror(errno));
      return UCS_ERR_IO_ERROR;
    }
    ibv_wc wc[16];
    const int k = ibv_poll_cq(cq_, 16, wc);
    for (int i = 0; i < k; ++i) send_backlog_.push_back(wc[i]);  // capacity 16 reserved
    if (k > 0) return UCS_ERR_BUSY;
  }
  if ((events & (UCT_EVENT_RECV | UCT_EVENT_RECV_SIG)) && recv_.arm()) return UCS_ERR_BUSY;
  return UCS_OK;
}

ucs_status_t Iface::flush(unsigned flags, uct_completion_t* comp) noexcept {
  if (comp != nullptr) return UCS_ERR_UNSUPPORTED;
  (void)flags;
  if (!connecting_.empty()) return UCS_INPROGRESS;
  bool busy = false;
  for (Ep* ep : eps_) {
    // A failed endpoint's pending requests wait for pending_purge, not for the network.
    if (ep->inflight_ == 0 && (ep->pending_.empty() || ep->error_ != UCS_OK)) continue;
    busy = true;
    // An unsignaled newest work request would never report back: follow it with one that does.
    if (ep->state_ == Ep::State::kReady && ep->unsignaledTail()) ep->postNop(false);
  }
  return busy ? UCS_INPROGRESS : UCS_OK;
}

ucs_status_t Iface::fence() noexcept {
  ++fence_epoch_;
  return UCS_OK;
}

}  // namespace gmd::md::rc
