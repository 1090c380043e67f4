// gmd_rc's configuration: the UCX_GMD_RC_* table UCX parses, and the limits an iface derives from it,
// the device's attributes and the port's (QP settings, RDMA READ size, completion queue length).
//
// Thread safety: the table is immutable; the functions are pure.
#pragma once

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "md/ucx_abi.h"

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
  double latency;             // LATENCY added to the port's latency reported to UCX, seconds
  double overhead;            // OVERHEAD reported to UCX, seconds
  unsigned rx_queue_len;      // RX_QUEUE_LEN: receive buffers posted to the shared receive queue
  std::size_t seg_size;       // SEG_SIZE: bytes of one receive buffer (largest active message)
  unsigned fc_wnd_size;       // FC_WND_SIZE: active messages an endpoint may send unacknowledged
  unsigned tx_bounce;         // TX_BOUNCE: registered send buffers per iface (am_short/bcopy/zcopy)
  unsigned tx_max_inline;     // TX_MAX_INLINE: bytes sent inline (capped by the device)
};
extern ucs_config_field_t kIfaceConfigTable[];
inline constexpr const char* kIfaceConfigPrefix = "GMD_RC_";

// Upper bound of SGEs per work request (stack arrays of the endpoint operations).
inline constexpr unsigned kMaxSge = 32;
// Credits travel in 16 bits of a grant (md/rc/rc_wire.h); the window is at most half of that range.
inline constexpr unsigned kMaxFcWindow = 32768;
// SEG_SIZE bounds: UCP needs am.max_bcopy >= 64; a receive buffer's length is 32 bits in verbs.
inline constexpr std::size_t kMinSegSize = 256;
inline constexpr std::size_t kMaxSegSize = std::size_t{1} << 30;

// The QP settings both sides of a connection use (from the config and the device limits).
struct QpSettings {
  unsigned tx_queue_len = 0;
  unsigned max_send_sge = 1;
  unsigned max_rd_atomic = 1;       // initiator depth (active QPs)
  unsigned max_dest_rd_atomic = 1;  // responder resources (passive QPs)
  std::uint8_t timeout = 14;
  std::uint8_t retry_count = 7;
};

// Everything an iface derives from its configuration and the hardware.
struct Limits {
  QpSettings qp;
  std::size_t max_read_sge = 1;  // SGEs of an RDMA READ
  std::size_t max_read = 0;      // bytes of one RDMA READ work request
  std::uint64_t max_msg = 0;     // the port's maximal message size
  unsigned cq_len = 0;           // send completion queue entries (= the iface's send credits)
  unsigned rx_queue_len = 0;     // shared receive queue depth
  std::size_t seg_size = 0;      // receive buffer bytes (after the rx headroom)
  unsigned fc_wnd = 0;           // per-endpoint active-message credits
  unsigned tx_bounce = 0;        // send bounce buffers
  unsigned tx_max_inline = 0;    // inline bytes asked of the device
  unsigned signal_interval = 1;  // at most this many work requests in a row go unsignaled
};

// Checks every UCX_GMD_RC_* value that the parser accepted but that makes no sense or exceeds what
// the device and port offer; on UCS_ERR_INVALID_PARAM *error is one line naming the variable, its
// value and what is accepted (GID_INDEX is checked by queryPort in md/rc/rc_qp.h). Does not log.
ucs_status_t validateConfig(const IfaceConfig& config, const ibv_device_attr& dev,
                            const ibv_port_attr& port, std::string* error) noexcept;

// Validates `config` (validateConfig; logs its line at error level: a misconfiguration, refused when
// the iface opens) and derives the limits.
ucs_status_t deriveLimits(const IfaceConfig& config, const ibv_device_attr& dev,
                          const ibv_port_attr& port, const char* dev_name, Limits* limits) noexcept;

// The default of UCX_GMD_RC_MAX_READ for a device (see the comment in rc_config.cc).
std::size_t defaultReadSize(const ibv_device_attr& dev, std::size_t mtu, unsigned max_rd_atomic,
                            std::uint64_t max_msg) noexcept;

// "rxe0:1" → port 1 of the MD's device; UCS_ERR_NO_DEVICE for another device or a bad port.
ucs_status_t parsePortName(const char* dev_name, const char* md_name, std::uint8_t* port) noexcept;

}  // namespace gmd::md::rc
