// The UCX edge of gmd_rc: device query, iface open, and the iface operations table (every slot filled;
// what gmd_rc does not offer returns UCS_ERR_UNSUPPORTED).
#include <sys/types.h>
#include <ucs/debug/log_def.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "md/md.h"
#include "md/abi/edge.h"
#include "md/rc/rc_iface.h"
#include "md/ucs_topology.h"

namespace gmd::md::rc {
namespace {

// A stub for any ops slot: UCS_ERR_UNSUPPORTED (as status or ssize_t), NULL, or nothing for void.
template <typename F>
struct Unsupported;
template <typename R, typename... A>
struct Unsupported<R (*)(A...)> {
  static R fn(A...) noexcept {
    if constexpr (std::is_void_v<R>) {
      return;
    } else if constexpr (std::is_pointer_v<R>) {
      return nullptr;
    } else {
      return static_cast<R>(UCS_ERR_UNSUPPORTED);
    }
  }
};
#define GMD_RC_UNSUPPORTED(slot) Unsupported<decltype(uct_iface_ops_t::slot)>::fn

ucs_status_t queryDevices(uct_md_h uct_md, ucx::TlDeviceResource** devices_p,
                          unsigned* num_p) noexcept {
  Md* md = Md::from(uct_md);
  const unsigned ports = md->deviceAttr().phys_port_cnt;
  // libuct releases the array with free().
  auto* res = static_cast<ucx::TlDeviceResource*>(
      std::calloc(ports == 0 ? 1 : ports, sizeof(ucx::TlDeviceResource)));
  if (res == nullptr) return UCS_ERR_NO_MEMORY;
  unsigned n = 0;
  for (unsigned p = 1; p <= ports; ++p) {
    ibv_port_attr attr{};
    if (ibv_query_port(md->context(), static_cast<std::uint8_t>(p), &attr) != 0) continue;
    if (attr.state != IBV_PORT_ACTIVE) {
      ucs_debug("gmd_rc %s:%u: port not active", md->name().c_str(), p);
      continue;
    }
    std::snprintf(res[n].name, sizeof(res[n].name), "%s:%u", md->name().c_str(), p);
    res[n].type = UCT_DEVICE_TYPE_NET;
    res[n].sys_device = sysDevices().verbsDevice(ibv_get_device_name(md->context()->device));
    ++n;
  }
  if (n == 0) {
    std::free(res);
    res = nullptr;
  }
  *devices_p = res;
  *num_p = n;
  return UCS_OK;
}

ucs_status_t ifaceOpen(uct_md_h md, uct_worker_h worker, const uct_iface_params_t* params,
                       const uct_iface_config_t* config, uct_iface_h* iface_p) noexcept {
  try {
    return Iface::open(md, worker, params, config, iface_p);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
}

ucs_status_t putZcopy(uct_ep_h ep, const uct_iov_t* iov, size_t iovcnt, uint64_t remote_addr,
                      uct_rkey_t rkey, uct_completion_t* comp) noexcept {
  return Ep::from(ep)->rdma(IBV_WR_RDMA_WRITE, iov, iovcnt, remote_addr, rkey, comp);
}

ucs_status_t getZcopy(uct_ep_h ep, const uct_iov_t* iov, size_t iovcnt, uint64_t remote_addr,
                      uct_rkey_t rkey, uct_completion_t* comp) noexcept {
  return Ep::from(ep)->rdma(IBV_WR_RDMA_READ, iov, iovcnt, remote_addr, rkey, comp);
}

// --- Small RMA and atomics (md/rc/rc_rma.cc, md/rc/rc_atomic.cc) -----------------------------

ucs_status_t putShort(uct_ep_h ep, const void* buffer, unsigned length, uint64_t remote_addr,
                      uct_rkey_t rkey) noexcept {
  return Ep::from(ep)->putShort(buffer, length, remote_addr, rkey);
}

ssize_t putBcopy(uct_ep_h ep, uct_pack_callback_t pack, void* arg, uint64_t remote_addr,
                 uct_rkey_t rkey) noexcept {
  return Ep::from(ep)->putBcopy(pack, arg, remote_addr, rkey);
}

ucs_status_t getBcopy(uct_ep_h ep, uct_unpack_callback_t unpack, void* arg, size_t length,
                      uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t* comp) noexcept {
  return Ep::from(ep)->getBcopy(unpack, arg, length, remote_addr, rkey, comp);
}

ucs_status_t atomicCswap64(uct_ep_h ep, uint64_t compare, uint64_t swap, uint64_t remote_addr,
                           uct_rkey_t rkey, uint64_t* result, uct_completion_t* comp) noexcept {
  return Ep::from(ep)->atomicCswap64(compare, swap, remote_addr, rkey, result, comp);
}

ucs_status_t atomic64Post(uct_ep_h ep, unsigned opcode, uint64_t value, uint64_t remote_addr,
                          uct_rkey_t rkey) noexcept {
  return Ep::from(ep)->atomic64Post(opcode, value, remote_addr, rkey);
}

ucs_status_t atomic64Fetch(uct_ep_h ep, unsigned opcode, uint64_t value, uint64_t* result,
                           uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t* comp) noexcept {
  return Ep::from(ep)->atomic64Fetch(opcode, value, result, remote_addr, rkey, comp);
}

// --- End of small RMA and atomics ---------------------------------------------------------------

// --- Active messages and events (md/rc/rc_am.cc, md/rc/rc_recv.cc, Iface::eventArm) -------------

ucs_status_t amShort(uct_ep_h ep, uint8_t id, uint64_t header, const void* payload,
                     unsigned length) noexcept {
  return Ep::from(ep)->amShort(id, header, payload, length);
}

ucs_status_t amShortIov(uct_ep_h ep, uint8_t id, const uct_iov_t* iov, size_t iovcnt) noexcept {
  return Ep::from(ep)->amShortIov(id, iov, iovcnt);
}

ssize_t amBcopy(uct_ep_h ep, uint8_t id, uct_pack_callback_t pack, void* arg,
                unsigned flags) noexcept {
  return Ep::from(ep)->amBcopy(id, pack, arg, flags);
}

ucs_status_t amZcopy(uct_ep_h ep, uint8_t id, const void* header, unsigned header_length,
                     const uct_iov_t* iov, size_t iovcnt, unsigned flags,
                     uct_completion_t* comp) noexcept {
  return Ep::from(ep)->amZcopy(id, header, header_length, iov, iovcnt, flags, comp);
}

ucs_status_t eventFdGet(uct_iface_h iface, int* fd) noexcept {
  return Iface::from(iface)->eventFd(fd);
}

ucs_status_t eventArm(uct_iface_h iface, unsigned events) noexcept {
  return Iface::from(iface)->eventArm(events);
}

// --- End of active messages and events ----------------------------------------------------------

ucs_status_t pendingAdd(uct_ep_h ep, uct_pending_req_t* req, unsigned flags) noexcept {
  return Ep::from(ep)->pendingAdd(req, flags);
}

void pendingPurge(uct_ep_h ep, uct_pending_purge_callback_t cb, void* arg) noexcept {
  Ep::from(ep)->pendingPurge(cb, arg);
}

ucs_status_t epFlush(uct_ep_h ep, unsigned flags, uct_completion_t* comp) noexcept {
  return Ep::from(ep)->flush(flags, comp);
}

ucs_status_t epFence(uct_ep_h ep, unsigned) noexcept { return Ep::from(ep)->fence(); }

ucs_status_t epCheck(uct_ep_h ep, unsigned flags, uct_completion_t* comp) noexcept {
  return Ep::from(ep)->check(flags, comp);
}

ucs_status_t epCreate(const uct_ep_params_t* params, uct_ep_h* ep_p) noexcept {
  if (!(params->field_mask & UCT_EP_PARAM_FIELD_IFACE)) return UCS_ERR_INVALID_PARAM;
  return Iface::from(params->iface)->createEp(params, ep_p);
}

void epDestroy(uct_ep_h ep) noexcept {
  Ep* e = Ep::from(ep);
  Iface::from(ep->iface)->destroyEp(e);
}

ucs_status_t ifaceFlush(uct_iface_h iface, unsigned flags, uct_completion_t* comp) noexcept {
  return Iface::from(iface)->flush(flags, comp);
}

ucs_status_t ifaceFence(uct_iface_h iface, unsigned) noexcept {
  return Iface::from(iface)->fence();
}

unsigned ifaceProgress(uct_iface_h iface) noexcept { return Iface::from(iface)->progress(); }

void ifaceClose(uct_iface_h iface) noexcept { delete Iface::from(iface); }

ucs_status_t ifaceQuery(uct_iface_h iface, uct_iface_attr_t* attr) noexcept {
  const ucs_status_t st = Iface::from(iface)->query(attr);
  finishIfaceAttr(attr);
  return st;
}

ucs_status_t getDeviceAddress(uct_iface_h iface, uct_device_addr_t* addr) noexcept {
  return Iface::from(iface)->deviceAddress(addr);
}

ucs_status_t getIfaceAddress(uct_iface_h iface, uct_iface_addr_t* addr) noexcept {
  return Iface::from(iface)->ifaceAddress(addr);
}

int isReachable(const uct_iface_h iface, const uct_device_addr_t* dev_addr,
                const uct_iface_addr_t* iface_addr) noexcept {
  return Iface::from(iface)->isReachable(dev_addr, iface_addr);
}

const uct_iface_ops_t kIfaceOps = {
    .ep_put_short = putShort,
    .ep_put_bcopy = putBcopy,
    .ep_put_zcopy = putZcopy,
    .ep_get_short = GMD_RC_UNSUPPORTED(ep_get_short),
    .ep_get_bcopy = getBcopy,
    .ep_get_zcopy = getZcopy,
    .ep_am_short = amShort,
    .ep_am_short_iov = amShortIov,
    .ep_am_bcopy = amBcopy,
    .ep_am_zcopy = amZcopy,
    .ep_atomic_cswap64 = atomicCswap64,
    .ep_atomic_cswap32 = GMD_RC_UNSUPPORTED(ep_atomic_cswap32),
    .ep_atomic32_post = GMD_RC_UNSUPPORTED(ep_atomic32_post),
    .ep_atomic64_post = atomic64Post,
    .ep_atomic32_fetch = GMD_RC_UNSUPPORTED(ep_atomic32_fetch),
    .ep_atomic64_fetch = atomic64Fetch,
    .ep_tag_eager_short = GMD_RC_UNSUPPORTED(ep_tag_eager_short),
    .ep_tag_eager_bcopy = GMD_RC_UNSUPPORTED(ep_tag_eager_bcopy),
    .ep_tag_eager_zcopy = GMD_RC_UNSUPPORTED(ep_tag_eager_zcopy),
    .ep_tag_rndv_zcopy = GMD_RC_UNSUPPORTED(ep_tag_rndv_zcopy),
    .ep_tag_rndv_cancel = GMD_RC_UNSUPPORTED(ep_tag_rndv_cancel),
    .ep_tag_rndv_request = GMD_RC_UNSUPPORTED(ep_tag_rndv_request),
    .iface_tag_recv_zcopy = GMD_RC_UNSUPPORTED(iface_tag_recv_zcopy),
    .iface_tag_recv_cancel = GMD_RC_UNSUPPORTED(iface_tag_recv_cancel),
    .ep_pending_add = pendingAdd,
    .ep_pending_purge = pendingPurge,
    .ep_flush = epFlush,
    .ep_fence = epFence,
    .ep_check = epCheck,
    .ep_create = epCreate,
    .ep_connect = GMD_RC_UNSUPPORTED(ep_connect),
    .ep_disconnect = GMD_RC_UNSUPPORTED(ep_disconnect),
    .cm_ep_conn_notify = GMD_RC_UNSUPPORTED(cm_ep_conn_notify),
    .ep_destroy = epDestroy,
    .ep_get_address = GMD_RC_UNSUPPORTED(ep_get_address),
    .ep_connect_to_ep = GMD_RC_UNSUPPORTED(ep_connect_to_ep),
    .iface_accept = GMD_RC_UNSUPPORTED(iface_accept),
    .iface_reject = GMD_RC_UNSUPPORTED(iface_reject),
    .iface_flush = ifaceFlush,
    .iface_fence = ifaceFence,
    .iface_progress_enable = uct_base_iface_progress_enable,
    .iface_progress_disable = uct_base_iface_progress_disable,
    .iface_progress = ifaceProgress,
    .iface_event_fd_get = eventFdGet,
    .iface_event_arm = eventArm,
    .iface_close = ifaceClose,
    .iface_query = ifaceQuery,
    .iface_get_device_address = getDeviceAddress,
    .iface_get_address = getIfaceAddress,
    .iface_is_reachable = isReachable,
};

ucx::Transport g_transport = {
    .name = "gmd_rc",
    .query_devices = queryDevices,
    .iface_open = ifaceOpen,
    .config = {.name = "gmd_rc transport",
               .prefix = kIfaceConfigPrefix,
               .table = kIfaceConfigTable,
               .size = sizeof(IfaceConfig),
               .list = {}},
    .list = {},
};

}  // namespace

const uct_iface_ops_t& ifaceOps() noexcept { return kIfaceOps; }

ucx::Transport* transport() noexcept { return &g_transport; }

}  // namespace gmd::md::rc
