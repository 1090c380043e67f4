// gmd_rc's wire formats and small translations, without a device.
#include "md/rc/rc_wire.h"

#include <gtest/gtest.h>

#include <cstring>

#include "md/rc/rc_config.h"

namespace gmd::md::rc {
namespace {

ibv_gid someGid() {
  ibv_gid g{};
  for (int i = 0; i < 16; ++i) g.raw[i] = static_cast<std::uint8_t>(0xa0 + i);
  return g;
}

TEST(RcWire, DeviceAddressRoundTripsAndRejectsUnknownVersions) {
  DeviceAddress a;
  a.ethernet = true;
  a.lid = 0x1234;
  a.gid = someGid();
  std::uint8_t buf[kDeviceAddressSize];
  packDeviceAddress(a, buf);
  EXPECT_EQ(kWireVersion, buf[0]);
  DeviceAddress b;
  ASSERT_EQ(UCS_OK, unpackDeviceAddress(buf, &b));
  EXPECT_TRUE(b.ethernet);
  EXPECT_EQ(0x1234, b.lid);
  EXPECT_EQ(0, std::memcmp(a.gid.raw, b.gid.raw, 16));
  buf[0] = 2;
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, unpackDeviceAddress(buf, &b));
  buf[0] = kWireVersion;
  buf[1] = 0x80;  // unknown flag
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackDeviceAddress(buf, &b));
}

TEST(RcWire, IfaceAddressKeepsNetworkOrderAndRefusesPortZero) {
  IfaceAddress a;
  a.ipv4_be = 0x0101a8c0;  // 192.168.1.1 in network order on little-endian
  a.port_be = 0x3930;
  std::uint8_t buf[kIfaceAddressSize];
  packIfaceAddress(a, buf);
  IfaceAddress b;
  ASSERT_EQ(UCS_OK, unpackIfaceAddress(buf, &b));
  EXPECT_EQ(a.ipv4_be, b.ipv4_be);
  EXPECT_EQ(a.port_be, b.port_be);
  EXPECT_EQ(0xc0, buf[4]);  // first octet of the address comes first
  a.port_be = 0;
  packIfaceAddress(a, buf);
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackIfaceAddress(buf, &b));
}

TEST(RcWire, HandshakeRoundTripsAndRejectsGarbage) {
  Handshake h;
  h.status = 0;
  h.mtu = IBV_MTU_4096;
  h.ethernet = true;
  h.qpn = 0x00abcdef;
  h.psn = 0x00123456;
  h.lid = 7;
  h.gid = someGid();
  std::uint8_t buf[kHandshakeSize];
  packHandshake(h, buf);
  Handshake g;
  ASSERT_EQ(UCS_OK, unpackHandshake(buf, &g));
  EXPECT_EQ(IBV_MTU_4096, g.mtu);
  EXPECT_TRUE(g.ethernet);
  EXPECT_EQ(h.qpn, g.qpn);
  EXPECT_EQ(h.psn, g.psn);
  EXPECT_EQ(7, g.lid);
  EXPECT_EQ(0, std::memcmp(h.gid.raw, g.gid.raw, 16));
  EXPECT_EQ(FrameKind::kConnect, g.kind);
  h.kind = FrameKind::kRelease;
  packHandshake(h, buf);
  ASSERT_EQ(UCS_OK, unpackHandshake(buf, &g));
  EXPECT_EQ(FrameKind::kRelease, g.kind);
  EXPECT_EQ(h.qpn, g.qpn);

  std::uint8_t bad[kHandshakeSize];
  std::memcpy(bad, buf, sizeof(bad));
  bad[0] = 'X';
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackHandshake(bad, &g));
  std::memcpy(bad, buf, sizeof(bad));
  bad[4] = 9;
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, unpackHandshake(bad, &g));
  std::memcpy(bad, buf, sizeof(bad));
  bad[6] = 0;  // MTU code out of range
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackHandshake(bad, &g));
  std::memcpy(bad, buf, sizeof(bad));
  bad[15] = 1;  // PSN wider than 24 bits
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackHandshake(bad, &g));
  std::memcpy(bad, buf, sizeof(bad));
  bad[18] = 2;  // no such frame kind
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackHandshake(bad, &g));
}

TEST(RcWire, MtuBandwidthAndTimeoutTranslations) {
  EXPECT_EQ(IBV_MTU_1024, commonMtu(IBV_MTU_4096, IBV_MTU_1024));
  EXPECT_EQ(256u, mtuBytes(IBV_MTU_256));
  EXPECT_EQ(4096u, mtuBytes(IBV_MTU_4096));
  // 4x EDR: 100 Gb/s signalling, 64/66 encoding.
  EXPECT_NEAR(4 * 25.78125e9 * 64 / 66 / 8, portBandwidth(2, 32), 1e3);
  EXPECT_NEAR(2.5e9 * 0.8 / 8, portBandwidth(1, 1), 1);
  EXPECT_EQ(0, portBandwidth(3, 1));   // unknown width
  EXPECT_EQ(0, portBandwidth(1, 3));   // unknown speed
  EXPECT_EQ(18, verbsTimeout(1.0));    // 4.096us * 2^18 = 1.07 s
  EXPECT_EQ(1, verbsTimeout(0));
  EXPECT_EQ(31, verbsTimeout(1e9));
}

TEST(RcWire, PortNamesBelongToTheirMd) {
  std::uint8_t port = 0;
  EXPECT_EQ(UCS_OK, parsePortName("rxe0:1", "rxe0", &port));
  EXPECT_EQ(1, port);
  EXPECT_EQ(UCS_OK, parsePortName("mlx5_0:2", "mlx5_0", &port));
  EXPECT_EQ(2, port);
  EXPECT_EQ(UCS_ERR_NO_DEVICE, parsePortName("rxe1:1", "rxe0", &port));
  EXPECT_EQ(UCS_ERR_NO_DEVICE, parsePortName("rxe0", "rxe0", &port));
  EXPECT_EQ(UCS_ERR_NO_DEVICE, parsePortName("rxe0:0", "rxe0", &port));
  EXPECT_EQ(UCS_ERR_NO_DEVICE, parsePortName("rxe0:1x", "rxe0", &port));
  EXPECT_EQ(UCS_ERR_NO_DEVICE, parsePortName("rxe0:300", "rxe0", &port));
}

// The immediate data of active messages and grants: round trip, and every malformed value refused.
TEST(RcWire, ImmediateDataRoundTripsAndRefusesMalformedValues) {
  Imm am;
  am.kind = 31;
  am.request = true;
  Imm back;
  ASSERT_EQ(UCS_OK, unpackImm(packImm(am), &back));
  EXPECT_EQ(31, back.kind);
  EXPECT_TRUE(back.request);
  EXPECT_EQ(0, back.credits);
  Imm grant;
  grant.kind = kImmGrant;
  grant.credits = 0xffff;
  ASSERT_EQ(UCS_OK, unpackImm(packImm(grant), &back));
  EXPECT_EQ(kImmGrant, back.kind);
  EXPECT_EQ(0xffff, back.credits);
  EXPECT_FALSE(back.request);
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackImm(32, &back)) << "AM id beyond UCT_AM_ID_MAX";
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackImm(5u | (1u << 8), &back)) << "credits on an AM";
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackImm(kImmGrant | (1u << 24), &back)) << "request on a grant";
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackImm(5u | (1u << 25), &back)) << "reserved bit";
}

}  // namespace
}  // namespace gmd::md::rc
