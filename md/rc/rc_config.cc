#include "md/rc/rc_config.h"

#include <ucs/sys/string.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "md/rc/rc_wire.h"

namespace gmd::md::rc {

ucs_config_field_t kIfaceConfigTable[] = {
    {"", "", nullptr, offsetof(IfaceConfig, super), UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},
    {"TX_QUEUE_LEN", "256", "Work requests in flight per endpoint (send queue length of its QP).",
     offsetof(IfaceConfig, tx_queue_len), UCS_CONFIG_TYPE_UINT},
    {"TX_CQ_LEN", "4096",
     "Work requests in flight per iface (length of its completion queue; at most 256 on\n"
     "soft-RoCE, whose receive backlog drops what a longer burst brings).",
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
    {"TIMEOUT", "1s",
     "Transport retransmission timeout of the RC QPs (rounded up to 4.096us*2^n, at most\n"
     "4.096us*2^31 = 8796s). An endpoint whose peer stopped answering fails after about\n"
     "TIMEOUT * (RETRY_COUNT + 1).",
     offsetof(IfaceConfig, timeout), UCS_CONFIG_TYPE_TIME},
    {"RETRY_COUNT", "6",
     "Transport retries before an endpoint fails, 0..6 (7, allowed by verbs, means\n"
     "\"retry forever\" on soft-RoCE: a dead peer would never be noticed).",
     offsetof(IfaceConfig, retry_count), UCS_CONFIG_TYPE_UINT},
    {"CONNECT_TIMEOUT", "30s",
     "How long an endpoint may take to connect (TCP handshake with the peer's iface) before it\n"
     "fails with UCS_ERR_UNREACHABLE.",
     offsetof(IfaceConfig, connect_timeout), UCS_CONFIG_TYPE_TIME},
    {"LATENCY", "0",
     "Added to the one-way latency reported to UCX for lane selection, which is the port's as\n"
     "UCX's own IB transports compute it (from its speed and link layer).",
     offsetof(IfaceConfig, latency), UCS_CONFIG_TYPE_TIME},
    {"OVERHEAD", "75ns", "Per-operation software overhead reported to UCX.",
     offsetof(IfaceConfig, overhead), UCS_CONFIG_TYPE_TIME},
    {"RX_QUEUE_LEN", "1024",
     "Receive buffers posted to the iface's shared receive queue (capped by the device). All\n"
     "endpoints of all peers draw on it; FC_WND_SIZE keeps one sender from taking it all.",
     offsetof(IfaceConfig, rx_queue_len), UCS_CONFIG_TYPE_UINT},
    {"SEG_SIZE", "8k",
     "Bytes of one receive buffer: the largest active message (am_bcopy, am_zcopy header and\n"
     "payload) any peer may send to this iface. Both sides must use the same value.",
     offsetof(IfaceConfig, seg_size), UCS_CONFIG_TYPE_MEMUNITS},
    {"FC_WND_SIZE", "256",
     "Active messages an endpoint may have sent before the receiver grants more credits\n"
     "(it grants at half the window). 0 < FC_WND_SIZE <= 32768.",
     offsetof(IfaceConfig, fc_wnd_size), UCS_CONFIG_TYPE_UINT},
    {"TX_BOUNCE", "256",
     "Registered send buffers of SEG_SIZE per iface, for am_bcopy, am_zcopy headers and\n"
     "am_short messages too long to go inline.",
     offsetof(IfaceConfig, tx_bounce), UCS_CONFIG_TYPE_UINT},
    {"TX_MAX_INLINE", "128",
     "Bytes of an am_short (8-byte header included) copied into the work request itself\n"
     "(capped by the device; 0: never inline).",
     offsetof(IfaceConfig, tx_max_inline), UCS_CONFIG_TYPE_UINT},
    {nullptr},
};

namespace {

// rdma_rxe (soft-RoCE) reports this vendor id.
constexpr std::uint32_t kSoftRoceVendorId = 0xffffff;
// READ response bytes one QP may have in flight on soft-RoCE: 256 packets at a 1 KiB MTU, a quarter
// of Linux's default receive backlog of 1000 packets per CPU.
constexpr std::size_t kSoftRoceReadBytesInFlight = 256 * 1024;
// Work requests one iface may have in flight on soft-RoCE: a quarter of that backlog as well. rxe
// runs a user QP's requester in the ibv_post_send call, which emits every queued send back to back;
// on one device the responder's packets and ACKs of all the iface's QPs share the backlog.
constexpr unsigned kSoftRoceSendsInFlight = 256;

}  // namespace

// Hardware: one READ per get, however large. Soft-RoCE: rxe's responder emits a READ's response
// packets back to back from a tasklet, with no flow control, into the receive backlog of its CPU
// through the netdev (veth, or a NIC looped back); whatever the backlog cannot hold is dropped.
// rxe's requester then discards the rest of that response and waits for its retransmission timer,
// so every overflow costs one QP timeout (1 s by default): UCP rendezvous with get_zcopy moved 1 MiB
// per second. READs of this size, at most max_rd_atomic of them outstanding, keep the burst far
// below the backlog.
std::size_t defaultReadSize(const ibv_device_attr& dev, std::size_t mtu, unsigned max_rd_atomic,
                            std::uint64_t max_msg) noexcept {
  if (dev.vendor_id != kSoftRoceVendorId) return static_cast<std::size_t>(max_msg);
  // rxe rounds max_rd_atomic up to a power of two.
  const std::size_t reads = std::bit_ceil(std::max(max_rd_atomic, 1u));
  std::size_t size = kSoftRoceReadBytesInFlight / reads;
  size = std::max(mtu, size / mtu * mtu);
  return static_cast<std::size_t>(std::min<std::uint64_t>(size, max_msg));
}

// --- Validation of the UCX_GMD_RC_* values ------------------------------------------------------
// One check per variable, in table order: a value UCX's parser accepted (a negative number reads as a
// huge unsigned one) but that makes no sense, or that the hardware cannot honour, is refused with a
// message naming the variable and what is accepted.

namespace {

// 4.096 us * 2^31: the longest local ACK timeout verbs can express.
constexpr double kMaxVerbsTimeoutSec = 4.096e-6 * 2147483648.0;
constexpr unsigned kMaxRetryCount = 6;
constexpr unsigned kMaxRdAtomic = 255;  // ibv_qp_attr::max_rd_atomic is 8 bits
constexpr double kMaxCostSec = 1.0;     // LATENCY, OVERHEAD
constexpr unsigned kMaxBounce = 65536;  // TX_BOUNCE: 512 MiB of 8 KiB buffers
constexpr unsigned kMaxInline = 1024;   // TX_MAX_INLINE: far above what devices offer

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%gs", s);
  return buf;
}

ucs_status_t refuse(std::string* error, const char* name, const std::string& value,
                    const std::string& accepted) {
  *error = std::string("UCX_GMD_RC_") + name + "=" + value + ": accepted " + accepted;
  return UCS_ERR_INVALID_PARAM;
}

}  // namespace

ucs_status_t validateConfig(const IfaceConfig& c, const ibv_device_attr& dev,
                            const ibv_port_attr& port, std::string* error) noexcept {
  try {
    const auto max_qp = static_cast<unsigned long>(std::max(dev.max_qp, 1));
    if (c.super.max_num_eps == 0 ||
        (c.super.max_num_eps != UCS_ULUNITS_INF && c.super.max_num_eps > max_qp)) {
      return refuse(error, "MAX_NUM_EPS", std::to_string(c.super.max_num_eps),
                    "inf or 1.." + std::to_string(max_qp) + " (the device's QPs)");
    }
    const auto max_wr = static_cast<unsigned>(std::max(dev.max_qp_wr, 1));
    if (c.tx_queue_len == 0 || c.tx_queue_len > max_wr) {
      return refuse(error, "TX_QUEUE_LEN", std::to_string(c.tx_queue_len),
                    "1.." + std::to_string(max_wr) + " (the device's work requests per QP)");
    }
    const auto max_cqe = static_cast<unsigned>(std::max(dev.max_cqe, 1));
    if (c.tx_cq_len == 0 || c.tx_cq_len > max_cqe) {
      return refuse(error, "TX_CQ_LEN", std::to_string(c.tx_cq_len),
                    "1.." + std::to_string(max_cqe) + " (the device's completion queue entries)");
    }
    // MAX_IOV and MAX_RD_ATOMIC are ceilings (their defaults must work on every device): the
    // device's own limit caps them; what gmd_rc can never use is refused.
    if (c.max_iov == 0 || c.max_iov > kMaxSge) {
      return refuse(error, "MAX_IOV", std::to_string(c.max_iov),
                    "1.." + std::to_string(kMaxSge) + " (capped by the device)");
    }
    if (c.max_rd_atomic == 0 || c.max_rd_atomic > kMaxRdAtomic) {
      return refuse(error, "MAX_RD_ATOMIC", std::to_string(c.max_rd_atomic),
                    "1.." + std::to_string(kMaxRdAtomic) + " (capped by the device)");
    }
    if (c.max_read != UCS_MEMUNITS_AUTO && c.max_read != UCS_MEMUNITS_INF &&
        (c.max_read == 0 || c.max_read > port.max_msg_sz)) {
      return refuse(error, "MAX_READ", std::to_string(c.max_read),
                    "auto, inf or 1.." + std::to_string(port.max_msg_sz) +
                        " bytes (the port's maximal message size)");
    }
    // GID_INDEX is checked against the port's GID table when the port is queried (queryPort).
    if (!(c.timeout > 0 && c.timeout <= kMaxVerbsTimeoutSec)) {  // false for NaN
      return refuse(error, "TIMEOUT", seconds(c.timeout),
                    "a time above 0 and at most " + seconds(kMaxVerbsTimeoutSec));
    }
    if (c.retry_count > kMaxRetryCount) {
      return refuse(error, "RETRY_COUNT", std::to_string(c.retry_count),
                    "0.." + std::to_string(kMaxRetryCount) +
                        " (7 means retry forever on soft-RoCE)");
    }
    if (!(c.connect_timeout > 0 && std::isfinite(c.connect_timeout))) {
      return refuse(error, "CONNECT_TIMEOUT", seconds(c.connect_timeout),
                    "a finite time above 0");
    }
    if (!(c.latency >= 0 && c.latency <= kMaxCostSec)) {  // false for NaN
      return refuse(error, "LATENCY", seconds(c.latency), "a time from 0 to 1s");
    }
    if (!(c.overhead >= 0 && c.overhead <= kMaxCostSec)) {
      return refuse(error, "OVERHEAD", seconds(c.overhead), "a time from 0 to 1s");
    }
    const auto max_srq = static_cast<unsigned>(std::max(dev.max_srq_wr, 2));
    if (c.rx_queue_len < 2 || c.rx_queue_len > max_srq) {
      return refuse(error, "RX_QUEUE_LEN", std::to_string(c.rx_queue_len),
                    "2.." + std::to_string(max_srq) + " (the device's shared receive queue)");
    }
    const std::size_t max_seg = std::min<std::size_t>(kMaxSegSize, port.max_msg_sz);
    if (c.seg_size < kMinSegSize || c.seg_size > max_seg) {
      return refuse(error, "SEG_SIZE", std::to_string(c.seg_size),
                    std::to_string(kMinSegSize) + ".." + std::to_string(max_seg) + " bytes");
    }
    if (c.fc_wnd_size == 0 || c.fc_wnd_size > kMaxFcWindow) {
      return refuse(error, "FC_WND_SIZE", std::to_string(c.fc_wnd_size),
                    "1.." + std::to_string(kMaxFcWindow));
    }
    if (c.tx_bounce == 0 || c.tx_bounce > kMaxBounce) {
      return refuse(error, "TX_BOUNCE", std::to_string(c.tx_bounce),
                    "1.." + std::to_string(kMaxBounce));
    }
    if (c.tx_max_inline > kMaxInline) {
      return refuse(error, "TX_MAX_INLINE", std::to_string(c.tx_max_inline),
                    "0.." + std::to_string(kMaxInline) + " bytes (capped by the device)");
    }
    return UCS_OK;
  } catch (...) {
    *error = "out of memory";
    return UCS_ERR_NO_MEMORY;
  }
}

// --- Derived limits ------------------------------------------------------------------------------

ucs_status_t deriveLimits(const IfaceConfig& config, const ibv_device_attr& dev,
                          const ibv_port_attr& port, const char* dev_name, Limits* limits) noexcept {
  std::string error;
  if (const ucs_status_t st = validateConfig(config, dev, port, &error); st != UCS_OK) {
    ucs_error("gmd_rc %s: %s", dev_name, error.c_str());
    return st;
  }
  Limits l;
  QpSettings& s = l.qp;
  s.tx_queue_len =
      std::min<unsigned>(config.tx_queue_len, static_cast<unsigned>(std::max(dev.max_qp_wr, 1)));
  s.max_send_sge = std::min<unsigned>(
      {config.max_iov, static_cast<unsigned>(std::max(dev.max_sge, 1)), kMaxSge});
  l.max_read_sge = std::min<std::size_t>(s.max_send_sge,
                                         static_cast<std::size_t>(std::max(dev.max_sge_rd, 1)));
  s.max_rd_atomic = std::max(
      1u, std::min<unsigned>(config.max_rd_atomic, static_cast<unsigned>(dev.max_qp_init_rd_atom)));
  s.max_dest_rd_atomic = std::max(1u, static_cast<unsigned>(std::max(dev.max_qp_rd_atom, 1)));
  s.timeout = verbsTimeout(config.timeout);
  s.retry_count = static_cast<std::uint8_t>(config.retry_count);
  l.max_msg = port.max_msg_sz;
  if (config.max_read == UCS_MEMUNITS_AUTO) {
    l.max_read = defaultReadSize(dev, mtuBytes(port.active_mtu), s.max_rd_atomic, l.max_msg);
  } else if (config.max_read == UCS_MEMUNITS_INF) {
    l.max_read = static_cast<std::size_t>(l.max_msg);
  } else {
    l.max_read = config.max_read;  // validated: at most max_msg
  }
  l.cq_len = std::min<unsigned>(config.tx_cq_len, static_cast<unsigned>(std::max(dev.max_cqe, 1)));
  // Soft-RoCE drops what overflows the receive backlog, and each drop costs a QP timeout (see
  // defaultReadSize): 128 endpoints to one iface on the same rxe device, 4096 am_short in flight,
  // stalled for the timeouts, up to 30 s in one ibv_post_send, until endpoints failed with "transport
  // retry counter exceeded".
  if (dev.vendor_id == kSoftRoceVendorId) l.cq_len = std::min(l.cq_len, kSoftRoceSendsInFlight);
  l.rx_queue_len = config.rx_queue_len;  // validated: within the device's limits
  l.seg_size = config.seg_size;
  l.fc_wnd = config.fc_wnd_size;
  l.tx_bounce = config.tx_bounce;
  l.tx_max_inline = config.tx_max_inline;
  // Every work request slot of an endpoint is released only by a completion at or after it:
  // signal at least every quarter of the send queue (and at most every 64).
  l.signal_interval = std::clamp(s.tx_queue_len / 4, 1u, 64u);
  *limits = l;
  return UCS_OK;
}

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

}  // namespace gmd::md::rc
