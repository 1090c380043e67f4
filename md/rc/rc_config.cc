#include "md/rc/rc_config.h"

#include <ucs/sys/string.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "md/rc/rc_wire.h"

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

namespace {

// rdma_rxe (soft-RoCE) reports this vendor id.
constexpr std::uint32_t kSoftRoceVendorId = 0xffffff;
// READ response bytes one QP may have in flight on soft-RoCE: 256 packets at a 1 KiB MTU, a quarter
// of Linux's default receive backlog of 1000 packets per CPU.
constexpr std::size_t kSoftRoceReadBytesInFlight = 256 * 1024;

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

ucs_status_t deriveLimits(const IfaceConfig& config, const ibv_device_attr& dev,
                          const ibv_port_attr& port, const char* dev_name, Limits* limits) noexcept {
  if (config.tx_queue_len == 0 || config.tx_cq_len == 0 || config.max_iov == 0 ||
      config.retry_count > 7) {
    ucs_error("gmd_rc %s: UCX_GMD_RC_TX_QUEUE_LEN, _TX_CQ_LEN and _MAX_IOV must be positive and "
              "UCX_GMD_RC_RETRY_COUNT at most 7",
              dev_name);
    return UCS_ERR_INVALID_PARAM;
  }
  if (config.max_read == 0) {
    ucs_error("gmd_rc %s: UCX_GMD_RC_MAX_READ must be positive", dev_name);
    return UCS_ERR_INVALID_PARAM;
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
  } else {
    l.max_read = static_cast<std::size_t>(std::min<std::uint64_t>(config.max_read, l.max_msg));
  }
  l.cq_len = std::min<unsigned>(config.tx_cq_len, static_cast<unsigned>(std::max(dev.max_cqe, 1)));
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
