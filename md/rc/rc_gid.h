// Which GID of a RoCE port to use: the RoCEv2 GID of an IPv4 address first, then any RoCEv2 GID, then
// RoCEv1. One ranking for gmd_rc (md/rc/rc_qp.cc) and the verbs test fixture
// (gtest/rxe/verbs_fixture.cc), header-only so that the fixture needs no UCX to use it.
//
// Thread safety: pure functions over verbs queries, which are thread-safe.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>

namespace gmd::md::rc {

inline bool isIpv4MappedGid(const ibv_gid& gid) noexcept {
  static constexpr std::uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, sizeof(kPrefix)) == 0;
}

inline bool isZeroGid(const ibv_gid& gid) noexcept {
  for (std::uint8_t b : gid.raw) {
    if (b != 0) return false;
  }
  return true;
}

// 3: RoCEv2 with an IPv4 address, 2: RoCEv2, 1: RoCEv1, 0: unusable (an empty entry).
inline int roceGidRank(const ibv_gid_entry& entry) noexcept {
  if (isZeroGid(entry.gid)) return 0;
  if (entry.gid_type != IBV_GID_TYPE_ROCE_V2) return 1;
  return isIpv4MappedGid(entry.gid) ? 3 : 2;
}

// The best-ranked GID index of `port` (its GID in *gid); -1 when the table holds no usable entry.
inline int selectRoceGid(ibv_context* ctx, std::uint8_t port, ibv_gid* gid) noexcept {
  ibv_port_attr attr{};
  if (ibv_query_port(ctx, port, &attr) != 0) return -1;
  int best = -1, best_rank = 0;
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(ctx, port, static_cast<std::uint32_t>(i), &entry, 0) != 0) continue;
    const int rank = roceGidRank(entry);
    if (rank > best_rank) {
      best_rank = rank;
      best = i;
      *gid = entry.gid;
    }
  }
  return best;
}

}  // namespace gmd::md::rc
