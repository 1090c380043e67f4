#include "md/rc/rc_qp.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <ucs/config/parser.h>
#include <ucs/sys/string.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <random>

#include "md/rc/rc_gid.h"

namespace gmd::md::rc {
namespace {

std::uint32_t firstInterfaceIpv4() {
  ifaddrs* list = nullptr;
  std::uint32_t found = htonl(INADDR_LOOPBACK);
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    found = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    break;
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

ucs_status_t queryPort(ibv_context* ctx, const std::string& dev, std::uint8_t port,
                       unsigned long gid_index, PortInfo* info) noexcept {
  PortInfo p;
  p.num = port;
  if (ibv_query_port(ctx, port, &p.attr) != 0) {
    ucs_error("gmd_rc %s:%u: ibv_query_port: %s", dev.c_str(), port, std::strerror(errno));
    return UCS_ERR_NO_DEVICE;
  }
  if (p.attr.state != IBV_PORT_ACTIVE) {
    ucs_error("gmd_rc %s:%u: port is not active", dev.c_str(), port);
    return UCS_ERR_NO_DEVICE;
  }
  p.ethernet = p.attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (gid_index != UCS_ULUNITS_AUTO) {
    if (gid_index >= static_cast<unsigned long>(p.attr.gid_tbl_len) ||
        ibv_query_gid(ctx, port, static_cast<int>(gid_index), &p.gid) != 0 || isZeroGid(p.gid)) {
      ucs_error("gmd_rc %s:%u: UCX_GMD_RC_GID_INDEX=%lu: accepted auto or an index below %d "
                "whose GID is set",
                dev.c_str(), port, gid_index, p.attr.gid_tbl_len);
      return UCS_ERR_INVALID_PARAM;
    }
    p.gid_index = static_cast<int>(gid_index);
  } else if (p.ethernet) {
    p.gid_index = selectRoceGid(ctx, port, &p.gid);
    if (p.gid_index < 0) {
      ucs_error("gmd_rc %s:%u: RoCE port without a usable GID (no IP address on its netdev?)",
                dev.c_str(), port);
      return UCS_ERR_NO_DEVICE;
    }
  } else {
    p.gid_index = 0;
    if (ibv_query_gid(ctx, port, 0, &p.gid) != 0) std::memset(&p.gid, 0, sizeof(p.gid));
  }
  if (p.ethernet && isIpv4MappedGid(p.gid)) {
    std::memcpy(&p.oob_ipv4_be, p.gid.raw + 12, 4);
  } else {
    p.oob_ipv4_be = firstInterfaceIpv4();
  }
  *info = p;
  return UCS_OK;
}

Handshake localHandshake(const PortInfo& port, const ibv_qp* qp, std::uint32_t psn) noexcept {
  Handshake h;
  h.mtu = port.attr.active_mtu;
  h.ethernet = port.ethernet;
  h.qpn = qp != nullptr ? qp->qp_num : 0;
  h.psn = psn;
  h.lid = port.attr.lid;
  h.gid = port.gid;
  return h;
}

ibv_qp* createQp(ibv_pd* pd, const QpQueues& q, const QpSettings& s, unsigned max_send_wr,
                 unsigned max_inline, unsigned* inline_out) noexcept {
  ibv_qp_init_attr init{};
  init.send_cq = q.send_cq;
  init.recv_cq = q.recv_cq;
  init.srq = q.srq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = max_send_wr;
  init.cap.max_recv_wr = q.srq != nullptr ? 0 : 1;
  init.cap.max_send_sge = s.max_send_sge;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = max_inline;
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (qp != nullptr && inline_out != nullptr) *inline_out = init.cap.max_inline_data;
  return qp;
}

ucs_status_t connectQp(ibv_qp* qp, const PortInfo& port, const QpSettings& s, bool responder,
                       const Handshake& remote, std::uint32_t local_psn, std::string* why) noexcept {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port.num;
  a.qp_access_flags =
      responder ? (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC) : 0;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    *why = std::string("ibv_modify_qp(INIT): ") + std::strerror(errno);
    return UCS_ERR_IO_ERROR;
  }

  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = commonMtu(port.attr.active_mtu, remote.mtu);
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = static_cast<std::uint8_t>(responder ? s.max_dest_rd_atomic : 1);
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = port.num;
  a.ah_attr.sl = 0;
  const bool same_subnet =
      std::memcmp(remote.gid.raw, port.gid.raw, 8) == 0;  // InfiniBand subnet prefix
  if (port.ethernet || !same_subnet) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote.gid;
    a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(port.gid_index);
    a.ah_attr.grh.hop_limit = 64;
  }
  if (!port.ethernet) a.ah_attr.dlid = remote.lid;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    *why = std::string("ibv_modify_qp(RTR): ") + std::strerror(errno);
    return UCS_ERR_IO_ERROR;
  }

  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = local_psn;
  a.timeout = s.timeout;
  a.retry_cnt = s.retry_count;
  a.rnr_retry = 7;
  a.max_rd_atomic = static_cast<std::uint8_t>(responder ? 1 : s.max_rd_atomic);
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)) {
    *why = std::string("ibv_modify_qp(RTS): ") + std::strerror(errno);
    return UCS_ERR_IO_ERROR;
  }
  return UCS_OK;
}

std::uint32_t randomPsn() noexcept {
  thread_local std::minstd_rand rng(
      static_cast<unsigned>(getpid()) ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return static_cast<std::uint32_t>(rng()) & 0xffffffu;
}

}  // namespace gmd::md::rc
