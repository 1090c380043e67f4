// Verbs plumbing shared by gmd_rc's two connection sides: port and GID selection, the address the
// connection listener is reached at, and RC QP state transitions.
//
// Thread safety: stateless functions over verbs calls (thread-safe); a QP is modified by one thread
// at a time.
#pragma once

#include <infiniband/verbs.h>
#include <ucs/type/status.h>

#include <cstdint>
#include <string>

#include "md/rc/rc_config.h"
#include "md/rc/rc_wire.h"

namespace gmd::md::rc {

// What a port offers, queried once per iface.
struct PortInfo {
  std::uint8_t num = 1;
  ibv_port_attr attr{};
  int gid_index = 0;
  ibv_gid gid{};
  bool ethernet = false;
  std::uint32_t oob_ipv4_be = 0;  // address the listener is reached at
};

// Port attributes, the GID to use (RoCE: `gid_index`, or when that is UCS_ULUNITS_AUTO the RoCEv2
// IPv4-mapped GID first, then any RoCEv2, then RoCEv1; InfiniBand: index 0 unless configured) and the
// IPv4 address of the listener (RoCE: the GID's own IPv4 address; else the first IPv4 address of an
// up, non-loopback interface; else loopback). Logs and returns a status on failure.
ucs_status_t queryPort(ibv_context* ctx, const std::string& dev, std::uint8_t port,
                       unsigned long gid_index, PortInfo* info) noexcept;

// The handshake describing our side of `qp`.
Handshake localHandshake(const PortInfo& port, const ibv_qp* qp, std::uint32_t psn) noexcept;

// Where a QP's completions go and what it receives into.
struct QpQueues {
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  ibv_srq* srq = nullptr;  // every gmd_rc QP receives into its iface's shared receive queue
};

// A RC QP on `pd`; nullptr (errno set) on failure. `max_inline` bytes may be sent inline; the device
// may grant more, which *inline_out (when given) receives.
ibv_qp* createQp(ibv_pd* pd, const QpQueues& q, const QpSettings& s, unsigned max_send_wr,
                 unsigned max_inline, unsigned* inline_out = nullptr) noexcept;

// RESET → INIT → RTR → RTS, connected to `remote`. `responder` QPs accept RDMA WRITE/READ/atomics from
// the peer; requester QPs accept nothing. On failure returns UCS_ERR_IO_ERROR with a reason in *why.
ucs_status_t connectQp(ibv_qp* qp, const PortInfo& port, const QpSettings& s, bool responder,
                       const Handshake& remote, std::uint32_t local_psn, std::string* why) noexcept;

// A random 24-bit packet sequence number.
std::uint32_t randomPsn() noexcept;

}  // namespace gmd::md::rc
