// The UCX edge of gmd_copy: device query, iface open, and the iface operations table (every slot
// filled; what gmd_copy does not offer returns UCS_ERR_UNSUPPORTED).
#include <sys/types.h>
#include <ucs/debug/log_def.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "md/abi/edge.h"
#include "md/copy/copy_iface.h"
#include "memtype/memtype.h"

namespace gmd::md::copy {
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
#define GMD_COPY_UNSUPPORTED(slot) Unsupported<decltype(uct_iface_ops_t::slot)>::fn

ucs_status_t queryDevices(uct_md_h, ucx::TlDeviceResource** devices_p, unsigned* num_p) noexcept {
  if (!memtype::Classifier::instance().cudaAvailable()) {
    ucs_debug("gmd_copy: no CUDA device");
    *devices_p = nullptr;
    *num_p = 0;
    return UCS_OK;
  }
  // libuct releases the array with free().
  auto* res = static_cast<ucx::TlDeviceResource*>(std::calloc(1, sizeof(ucx::TlDeviceResource)));
  if (res == nullptr) return UCS_ERR_NO_MEMORY;
  std::strncpy(res->name, kDeviceName, sizeof(res->name) - 1);
  res->type = UCT_DEVICE_TYPE_ACC;
  res->sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
  *devices_p = res;
  *num_p = 1;
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

// The one buffer of a zero-copy operation (max_iov is 1): its address and total length.
ucs_status_t oneBuffer(const uct_iov_t* iov, size_t iovcnt, const char* op, void** buffer,
                       std::size_t* length) noexcept {
  if (iovcnt == 0) {
    *buffer = nullptr;
    *length = 0;
    return UCS_OK;
  }
  if (iov == nullptr || iovcnt > 1) {
    ucs_debug("gmd_copy: %s with %zu iov entries (at most 1)", op, iovcnt);
    return UCS_ERR_INVALID_PARAM;
  }
  if (iov->count > 1 && iov->stride != iov->length) {
    ucs_debug("gmd_copy: %s of a strided iov (length %zu, stride %zu, count %u)", op, iov->length,
              iov->stride, iov->count);
    return UCS_ERR_INVALID_PARAM;
  }
  *buffer = iov->buffer;
  *length = iov->length * iov->count;
  return UCS_OK;
}

void* addr(uint64_t remote_addr) noexcept { return reinterpret_cast<void*>(remote_addr); }

ucs_status_t putShort(uct_ep_h ep, const void* buffer, unsigned length, uint64_t remote_addr,
                      uct_rkey_t) noexcept {
  return Ep::from(ep)->iface->copyShort(addr(remote_addr), buffer, length, "put_short");
}

ucs_status_t getShort(uct_ep_h ep, void* buffer, unsigned length, uint64_t remote_addr,
                      uct_rkey_t) noexcept {
  return Ep::from(ep)->iface->copyShort(buffer, addr(remote_addr), length, "get_short");
}

ucs_status_t putZcopy(uct_ep_h ep, const uct_iov_t* iov, size_t iovcnt, uint64_t remote_addr,
                      uct_rkey_t, uct_completion_t* comp) noexcept {
  void* buffer;
  std::size_t length;
  if (ucs_status_t st = oneBuffer(iov, iovcnt, "put_zcopy", &buffer, &length); st != UCS_OK) {
    return st;
  }
  return Ep::from(ep)->iface->copyZcopy(addr(remote_addr), buffer, length, comp, "put_zcopy");
}

ucs_status_t getZcopy(uct_ep_h ep, const uct_iov_t* iov, size_t iovcnt, uint64_t remote_addr,
                      uct_rkey_t, uct_completion_t* comp) noexcept {
  void* buffer;
  std::size_t length;
  if (ucs_status_t st = oneBuffer(iov, iovcnt, "get_zcopy", &buffer, &length); st != UCS_OK) {
    return st;
  }
  return Ep::from(ep)->iface->copyZcopy(buffer, addr(remote_addr), length, comp, "get_zcopy");
}

ucs_status_t pendingAdd(uct_ep_h ep, uct_pending_req_t* req, unsigned) noexcept {
  Ep* e = Ep::from(ep);
  return e->iface->pendingAdd(e, req);
}

void pendingPurge(uct_ep_h ep, uct_pending_purge_callback_t cb, void* arg) noexcept {
  Ep* e = Ep::from(ep);
  e->iface->pendingPurge(e, cb, arg);
}

ucs_status_t epFlush(uct_ep_h ep, unsigned flags, uct_completion_t* comp) noexcept {
  Ep* e = Ep::from(ep);
  return e->iface->flush(e, flags, comp);
}

// Copies of one iface run on one stream per device, in order: nothing to fence.
ucs_status_t epFence(uct_ep_h, unsigned) noexcept { return UCS_OK; }

ucs_status_t epCreate(const uct_ep_params_t* params, uct_ep_h* ep_p) noexcept {
  if (params == nullptr || ep_p == nullptr || !(params->field_mask & UCT_EP_PARAM_FIELD_IFACE) ||
      params->iface == nullptr) {
    ucs_debug("gmd_copy: ep_create without an iface");
    return UCS_ERR_INVALID_PARAM;
  }
  return Iface::from(params->iface)->createEp(params, ep_p);
}

void epDestroy(uct_ep_h ep) noexcept {
  Ep* e = Ep::from(ep);
  e->iface->destroyEp(e);
}

ucs_status_t ifaceFlush(uct_iface_h iface, unsigned flags, uct_completion_t* comp) noexcept {
  return Iface::from(iface)->flush(nullptr, flags, comp);
}

ucs_status_t ifaceFence(uct_iface_h, unsigned) noexcept { return UCS_OK; }

unsigned ifaceProgress(uct_iface_h iface) noexcept { return Iface::from(iface)->progress(); }

void ifaceClose(uct_iface_h iface) noexcept { delete Iface::from(iface); }

ucs_status_t ifaceQuery(uct_iface_h iface, uct_iface_attr_t* attr) noexcept {
  const ucs_status_t st = Iface::from(iface)->query(attr);
  if (st == UCS_OK) rc::finishIfaceAttr(attr);
  return st;
}

ucs_status_t getDeviceAddress(uct_iface_h, uct_device_addr_t*) noexcept {
  return UCS_OK;  // device_addr_len is 0
}

ucs_status_t getIfaceAddress(uct_iface_h iface, uct_iface_addr_t* addr) noexcept {
  return Iface::from(iface)->ifaceAddress(addr);
}

int isReachable(const uct_iface_h iface, const uct_device_addr_t*,
                const uct_iface_addr_t* iface_addr) noexcept {
  return Iface::from(iface)->isReachable(iface_addr) ? 1 : 0;
}

const uct_iface_ops_t kIfaceOps = {
    .ep_put_short = putShort,
    .ep_put_bcopy = GMD_COPY_UNSUPPORTED(ep_put_bcopy),
    .ep_put_zcopy = putZcopy,
    .ep_get_short = getShort,
    .ep_get_bcopy = GMD_COPY_UNSUPPORTED(ep_get_bcopy),
    .ep_get_zcopy = getZcopy,
    .ep_am_short = GMD_COPY_UNSUPPORTED(ep_am_short),
    .ep_am_short_iov = GMD_COPY_UNSUPPORTED(ep_am_short_iov),
    .ep_am_bcopy = GMD_COPY_UNSUPPORTED(ep_am_bcopy),
    .ep_am_zcopy = GMD_COPY_UNSUPPORTED(ep_am_zcopy),
    .ep_atomic_cswap64 = GMD_COPY_UNSUPPORTED(ep_atomic_cswap64),
    .ep_atomic_cswap32 = GMD_COPY_UNSUPPORTED(ep_atomic_cswap32),
    .ep_atomic32_post = GMD_COPY_UNSUPPORTED(ep_atomic32_post),
    .ep_atomic64_post = GMD_COPY_UNSUPPORTED(ep_atomic64_post),
    .ep_atomic32_fetch = GMD_COPY_UNSUPPORTED(ep_atomic32_fetch),
    .ep_atomic64_fetch = GMD_COPY_UNSUPPORTED(ep_atomic64_fetch),
    .ep_tag_eager_short = GMD_COPY_UNSUPPORTED(ep_tag_eager_short),
    .ep_tag_eager_bcopy = GMD_COPY_UNSUPPORTED(ep_tag_eager_bcopy),
    .ep_tag_eager_zcopy = GMD_COPY_UNSUPPORTED(ep_tag_eager_zcopy),
    .ep_tag_rndv_zcopy = GMD_COPY_UNSUPPORTED(ep_tag_rndv_zcopy),
    .ep_tag_rndv_cancel = GMD_COPY_UNSUPPORTED(ep_tag_rndv_cancel),
    .ep_tag_rndv_request = GMD_COPY_UNSUPPORTED(ep_tag_rndv_request),
    .iface_tag_recv_zcopy = GMD_COPY_UNSUPPORTED(iface_tag_recv_zcopy),
    .iface_tag_recv_cancel = GMD_COPY_UNSUPPORTED(iface_tag_recv_cancel),
    .ep_pending_add = pendingAdd,
    .ep_pending_purge = pendingPurge,
    .ep_flush = epFlush,
    .ep_fence = epFence,
    .ep_check = GMD_COPY_UNSUPPORTED(ep_check),
    .ep_create = epCreate,
    .ep_connect = GMD_COPY_UNSUPPORTED(ep_connect),
    .ep_disconnect = GMD_COPY_UNSUPPORTED(ep_disconnect),
    .cm_ep_conn_notify = GMD_COPY_UNSUPPORTED(cm_ep_conn_notify),
    .ep_destroy = epDestroy,
    .ep_get_address = GMD_COPY_UNSUPPORTED(ep_get_address),
    .ep_connect_to_ep = GMD_COPY_UNSUPPORTED(ep_connect_to_ep),
    .iface_accept = GMD_COPY_UNSUPPORTED(iface_accept),
    .iface_reject = GMD_COPY_UNSUPPORTED(iface_reject),
    .iface_flush = ifaceFlush,
    .iface_fence = ifaceFence,
    .iface_progress_enable = uct_base_iface_progress_enable,
    .iface_progress_disable = uct_base_iface_progress_disable,
    .iface_progress = ifaceProgress,
    .iface_event_fd_get = GMD_COPY_UNSUPPORTED(iface_event_fd_get),
    .iface_event_arm = GMD_COPY_UNSUPPORTED(iface_event_arm),
    .iface_close = ifaceClose,
    .iface_query = ifaceQuery,
    .iface_get_device_address = getDeviceAddress,
    .iface_get_address = getIfaceAddress,
    .iface_is_reachable = isReachable,
};

ucx::Transport g_transport = {
    .name = "gmd_copy",
    .query_devices = queryDevices,
    .iface_open = ifaceOpen,
    .config = {.name = "gmd_copy transport",
               .prefix = kConfigPrefix,
               .table = kIfaceConfigTable,
               .size = sizeof(IfaceConfig),
               .list = {}},
    .list = {},
};

}  // namespace

const uct_iface_ops_t& ifaceOps() noexcept { return kIfaceOps; }

ucx::Transport* transport() noexcept { return &g_transport; }

}  // namespace gmd::md::copy
