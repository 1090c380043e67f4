// What gmd_rc puts on the wire outside RDMA: the device and iface addresses UCX carries between
// peers, and the connection handshake exchanged over the iface's TCP socket. Fixed little-endian
// layouts with a version byte, packed and checked here; no state, no I/O (unit-tested in
// gtest/transport/).
#pragma once

#include <infiniband/verbs.h>
#include <ucs/type/status.h>

#include <cstddef>
#include <cstdint>

namespace gmd::md::rc {

inline constexpr std::uint8_t kWireVersion = 1;

// Device address (20 bytes): how to reach the port through the fabric.
//   byte 0      version
//   byte 1      flags: bit 0 = Ethernet link layer (RoCE, GRH always), else InfiniBand
//   bytes 2-3   LID (InfiniBand), little-endian
//   bytes 4-19  GID
struct DeviceAddress {
  bool ethernet = false;
  std::uint16_t lid = 0;
  ibv_gid gid{};
};
inline constexpr std::size_t kDeviceAddressSize = 20;
void packDeviceAddress(const DeviceAddress& a, void* buffer) noexcept;
ucs_status_t unpackDeviceAddress(const void* buffer, DeviceAddress* a) noexcept;

// Iface address (8 bytes): where the iface's connection listener accepts handshakes.
//   byte 0      version
//   byte 1      reserved, zero
//   bytes 2-3   TCP port, network byte order
//   bytes 4-7   IPv4 address, network byte order
struct IfaceAddress {
  std::uint32_t ipv4_be = 0;
  std::uint16_t port_be = 0;
};
inline constexpr std::size_t kIfaceAddressSize = 8;
void packIfaceAddress(const IfaceAddress& a, void* buffer) noexcept;
ucs_status_t unpackIfaceAddress(const void* buffer, IfaceAddress* a) noexcept;

// A frame on the connection from an iface to a peer iface's listener (40 bytes), which all the
// endpoints between the two share (md/rc/rc_connect.h). kConnect: the connecting side sends its QP,
// the accepting side answers with its own after its QP reached RTS (status 0), or with a nonzero
// status and no QP; the answers come in the order of the requests. kRelease (no answer): the
// endpoint whose QP is `qpn` is gone, the accepting side destroys the passive QP it made for it.
//   bytes 0-3   magic "GMRC"
//   byte 4      version
//   byte 5      status (0 = ok)
//   byte 6      path MTU (enum ibv_mtu) the sender's port runs
//   byte 7      flags, as in the device address
//   bytes 8-11  QP number
//   bytes 12-15 initial packet sequence number (24 bits)
//   bytes 16-17 LID
//   byte 18     kind: 0 connect, 1 release
//   byte 19     reserved, zero
//   bytes 20-35 GID
//   bytes 36-39 reserved, zero
enum class FrameKind : std::uint8_t { kConnect = 0, kRelease = 1 };
struct Handshake {
  FrameKind kind = FrameKind::kConnect;
  std::uint8_t status = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  bool ethernet = false;
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  std::uint16_t lid = 0;
  ibv_gid gid{};
};
inline constexpr std::size_t kHandshakeSize = 40;
void packHandshake(const Handshake& h, void* buffer) noexcept;
// UCS_ERR_INVALID_PARAM for a buffer that is not a gmd_rc handshake, UCS_ERR_UNSUPPORTED for
// another version.
ucs_status_t unpackHandshake(const void* buffer, Handshake* h) noexcept;

// Immediate data of the SEND_WITH_IMM messages gmd_rc's QPs exchange (32 bits, carried in network
// byte order by verbs: pack/unpack work on host-order values). An active message's payload is the
// SEND's payload as is; its id travels here.
//   bits 0-7    kind: an active message id (below UCT_AM_ID_MAX), or kImmGrant
//   bits 8-23   credits granted (kImmGrant only; zero otherwise)
//   bit 24      the sender asks for credits (active messages only)
//   bits 25-31  reserved, zero
// A grant is a zero-length SEND from a passive QP back to the endpoint whose messages it received,
// returning one credit per message received since the last grant.
inline constexpr std::uint8_t kImmGrant = 0xff;
struct Imm {
  std::uint8_t kind = 0;
  std::uint16_t credits = 0;
  bool request = false;
};
std::uint32_t packImm(const Imm& imm) noexcept;
// UCS_ERR_INVALID_PARAM for reserved bits set, a kind that is neither an AM id nor a grant, or
// credits on an active message, or a request on a grant.
ucs_status_t unpackImm(std::uint32_t value, Imm* imm) noexcept;

// The MTU both ends can run.
ibv_mtu commonMtu(ibv_mtu a, ibv_mtu b) noexcept;
// Bytes in a path MTU.
std::size_t mtuBytes(ibv_mtu mtu) noexcept;

// Port bandwidth in bytes per second from ibv_port_attr's active_width and active_speed codes (data
// rate after line encoding); 0 for codes this build does not know.
double portBandwidth(std::uint8_t active_width, std::uint8_t active_speed) noexcept;

// The verbs local-ACK timeout exponent (4.096 us * 2^n) closest above `seconds`, within 1..31.
std::uint8_t verbsTimeout(double seconds) noexcept;

}  // namespace gmd::md::rc
