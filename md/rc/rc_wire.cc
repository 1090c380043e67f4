#include "md/rc/rc_wire.h"

#include <uct/api/uct.h>

#include <cmath>
#include <cstring>

namespace gmd::md::rc {
namespace {

constexpr std::uint8_t kFlagEthernet = 1u << 0;
constexpr std::uint8_t kMagic[4] = {'G', 'M', 'R', 'C'};

std::uint8_t* bytes(void* p) { return static_cast<std::uint8_t*>(p); }
const std::uint8_t* bytes(const void* p) { return static_cast<const std::uint8_t*>(p); }

void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
void put32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint16_t get16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t get32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

void packDeviceAddress(const DeviceAddress& a, void* buffer) noexcept {
  std::uint8_t* p = bytes(buffer);
  std::memset(p, 0, kDeviceAddressSize);
  p[0] = kWireVersion;
  p[1] = a.ethernet ? kFlagEthernet : 0;
  put16(p + 2, a.lid);
  std::memcpy(p + 4, a.gid.raw, sizeof(a.gid.raw));
}

ucs_status_t unpackDeviceAddress(const void* buffer, DeviceAddress* a) noexcept {
  const std::uint8_t* p = bytes(buffer);
  if (p[0] != kWireVersion) return UCS_ERR_UNSUPPORTED;
  if ((p[1] & ~kFlagEthernet) != 0) return UCS_ERR_INVALID_PARAM;
  a->ethernet = (p[1] & kFlagEthernet) != 0;
  a->lid = get16(p + 2);
  std::memcpy(a->gid.raw, p + 4, sizeof(a->gid.raw));
  return UCS_OK;
}

void packIfaceAddress(const IfaceAddress& a, void* buffer) noexcept {
  std::uint8_t* p = bytes(buffer);
  std::memset(p, 0, kIfaceAddressSize);
  p[0] = kWireVersion;
  std::memcpy(p + 2, &a.port_be, 2);
  std::memcpy(p + 4, &a.ipv4_be, 4);
}

ucs_status_t unpackIfaceAddress(const void* buffer, IfaceAddress* a) noexcept {
  const std::uint8_t* p = bytes(buffer);
  if (p[0] != kWireVersion) return UCS_ERR_UNSUPPORTED;
  std::memcpy(&a->port_be, p + 2, 2);
  std::memcpy(&a->ipv4_be, p + 4, 4);
  if (a->port_be == 0) return UCS_ERR_INVALID_PARAM;
  return UCS_OK;
}

void packHandshake(const Handshake& h, void* buffer) noexcept {
  std::uint8_t* p = bytes(buffer);
  std::memset(p, 0, kHandshakeSize);
  std::memcpy(p, kMagic, 4);
  p[4] = kWireVersion;
  p[5] = h.status;
  p[6] = static_cast<std::uint8_t>(h.mtu);
  p[7] = h.ethernet ? kFlagEthernet : 0;
  put32(p + 8, h.qpn);
  put32(p + 12, h.psn & 0xffffffu);
  put16(p + 16, h.lid);
  p[18] = static_cast<std::uint8_t>(h.kind);
  std::memcpy(p + 20, h.gid.raw, sizeof(h.gid.raw));
}

ucs_status_t unpackHandshake(const void* buffer, Handshake* h) noexcept {
  const std::uint8_t* p = bytes(buffer);
  if (std::memcmp(p, kMagic, 4) != 0) return UCS_ERR_INVALID_PARAM;
  if (p[4] != kWireVersion) return UCS_ERR_UNSUPPORTED;
  if (p[6] < IBV_MTU_256 || p[6] > IBV_MTU_4096 || (p[7] & ~kFlagEthernet) != 0 ||
      (get32(p + 12) & ~0xffffffu) != 0 || p[18] > static_cast<std::uint8_t>(FrameKind::kRelease)) {
    return UCS_ERR_INVALID_PARAM;
  }
  h->kind = static_cast<FrameKind>(p[18]);
  h->status = p[5];
  h->mtu = static_cast<ibv_mtu>(p[6]);
  h->ethernet = (p[7] & kFlagEthernet) != 0;
  h->qpn = get32(p + 8);
  h->psn = get32(p + 12);
  h->lid = get16(p + 16);
  std::memcpy(h->gid.raw, p + 20, sizeof(h->gid.raw));
  return UCS_OK;
}

std::uint32_t packImm(const Imm& imm) noexcept {
  return static_cast<std::uint32_t>(imm.kind) | (static_cast<std::uint32_t>(imm.credits) << 8) |
         (imm.request ? 1u << 24 : 0u);
}

ucs_status_t unpackImm(std::uint32_t value, Imm* imm) noexcept {
  const auto kind = static_cast<std::uint8_t>(value & 0xff);
  const auto credits = static_cast<std::uint16_t>((value >> 8) & 0xffff);
  const bool request = (value >> 24) & 1;
  if ((value >> 25) != 0) return UCS_ERR_INVALID_PARAM;
  if (kind == kImmGrant ? request : (kind >= UCT_AM_ID_MAX || credits != 0)) {
    return UCS_ERR_INVALID_PARAM;
  }
  imm->kind = kind;
  imm->credits = credits;
  imm->request = request;
  return UCS_OK;
}

ibv_mtu commonMtu(ibv_mtu a, ibv_mtu b) noexcept { return a < b ? a : b; }

std::size_t mtuBytes(ibv_mtu mtu) noexcept {
  return static_cast<std::size_t>(128) << static_cast<unsigned>(mtu);
}

double portBandwidth(std::uint8_t active_width, std::uint8_t active_speed) noexcept {
  double lanes = 0;
  switch (active_width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return 0;
  }
  double gbps = 0;      // signalling rate per lane
  double encoding = 0;  // payload fraction
  switch (active_speed) {
    case 1: gbps = 2.5; encoding = 0.8; break;           // SDR
    case 2: gbps = 5.0; encoding = 0.8; break;           // DDR
    case 4: gbps = 10.0; encoding = 0.8; break;          // QDR
    case 8: gbps = 10.3125; encoding = 64.0 / 66; break;  // FDR10
    case 16: gbps = 14.0625; encoding = 64.0 / 66; break;  // FDR
    case 32: gbps = 25.78125; encoding = 64.0 / 66; break;  // EDR
    case 64: gbps = 53.125; encoding = 64.0 / 66; break;    // HDR
    case 128: gbps = 106.25; encoding = 64.0 / 66; break;   // NDR
    default: return 0;
  }
  return lanes * gbps * encoding * 1e9 / 8;
}

std::uint8_t verbsTimeout(double seconds) noexcept {
  const double units = seconds / 4.096e-6;
  int n = units <= 1 ? 1 : static_cast<int>(std::ceil(std::log2(units)));
  if (n < 1) n = 1;
  if (n > 31) n = 31;
  return static_cast<std::uint8_t>(n);
}

}  // namespace gmd::md::rc
