// gmd_rc's and gmd_copy's iface internal ops for this build's UCX release (md/abi/edge.h). Up to
// 1.15 libuct exports a default table that both use as is; from 1.16 on each transport brings its
// own, and UCP calls its reachability and connection checks during wireup (1.18).
#include <ucs/debug/log_def.h>

#include <cstdio>
#include <cstring>

#include "md/abi/edge.h"
#include "md/abi/since_1_16.h"
#include "md/copy/copy_iface.h"
#include "md/rc/rc_iface.h"

namespace gmd::md::rc {
namespace {

// Writes why a peer is unreachable where the caller asked for it.
template <typename Params>
void unreachable(const Params* params, const char* tl, const char* why) {
  if ((params->field_mask & ucx::kReachableFieldInfoString) && params->info_string != nullptr) {
    const size_t len = (params->field_mask & ucx::kReachableFieldInfoStringLength)
                           ? params->info_string_length
                           : 0;
    if (len > 0) std::snprintf(params->info_string, len, "%s: %s", tl, why);
  }
}

// What the reachability and connection checks ask of a transport (one per transport below):
//   kName, kNeed (the address fields a check needs),
//   reachable(iface, device_addr, iface_addr, device_scope) -> nullptr or why not,
//   connected(ep, device_addr, iface_addr).
struct RcChecks {
  static constexpr const char* kName = "gmd_rc";
  static constexpr std::uint64_t kNeed =
      ucx::kReachableFieldDeviceAddr | ucx::kReachableFieldIfaceAddr;
  static const char* reachable(uct_iface_h tl_iface, const uct_device_addr_t* dev,
                               const uct_iface_addr_t* addr, bool device_scope) {
    if (dev == nullptr || addr == nullptr) return "device and iface addresses are needed";
    Iface* iface = Iface::from(tl_iface);
    if (!iface->isReachable(dev, addr)) return "peer not on this fabric";
    if (device_scope) {
      std::uint8_t own[kDeviceAddressSize];
      if (iface->deviceAddress(reinterpret_cast<uct_device_addr_t*>(own)) != UCS_OK ||
          std::memcmp(own, dev, sizeof(own)) != 0) {
        return "another device";
      }
    }
    return nullptr;
  }
  static bool connected(uct_ep_h ep, const uct_device_addr_t* dev, const uct_iface_addr_t* addr) {
    return Ep::from(ep)->connectedTo(dev, addr);
  }
};

// gmd_copy reaches only its own iface (the iface address is its id; no device address).
struct CopyChecks {
  static constexpr const char* kName = "gmd_copy";
  static constexpr std::uint64_t kNeed = ucx::kReachableFieldIfaceAddr;
  static const char* reachable(uct_iface_h tl_iface, const uct_device_addr_t*,
                               const uct_iface_addr_t* addr, bool) {
    if (addr == nullptr) return "the iface address is needed";
    return copy::Iface::from(tl_iface)->isReachable(addr) ? nullptr : "another iface";
  }
  static bool connected(uct_ep_h ep, const uct_device_addr_t*, const uct_iface_addr_t* addr) {
    return copy::Ep::from(ep)->connectedTo(addr);
  }
};

// iface_is_reachable_v2 (1.15 on). Network scope: what the transport can connect to. Device
// scope: the same device as well.
template <typename Checks, typename Params>
int isReachableV2(uct_iface_h tl_iface, const Params* params) {
  if ((params->field_mask & Checks::kNeed) != Checks::kNeed) {
    unreachable(params, Checks::kName, "device and iface addresses are needed");
    return 0;
  }
  const bool device_scope =
      (params->field_mask & ucx::kReachableFieldScope) && params->scope == ucx::kScopeDevice;
  const uct_device_addr_t* dev =
      (params->field_mask & ucx::kReachableFieldDeviceAddr) ? params->device_addr : nullptr;
  if (const char* why = Checks::reachable(tl_iface, dev, params->iface_addr, device_scope)) {
    unreachable(params, Checks::kName, why);
    return 0;
  }
  return 1;
}

// ep_is_connected (1.16 on): endpoints of both transports connect to an iface, never to a remote
// endpoint.
template <typename Checks, typename Params>
int isConnected(uct_ep_h ep, const Params* params) {
  constexpr std::uint64_t kNeed =
      Checks::kNeed == ucx::kReachableFieldIfaceAddr
          ? ucx::kConnectedFieldIfaceAddr
          : ucx::kConnectedFieldDeviceAddr | ucx::kConnectedFieldIfaceAddr;
  if ((params->field_mask & ucx::kConnectedFieldEpAddr) || (params->field_mask & kNeed) != kNeed) {
    return 0;
  }
  const uct_device_addr_t* dev =
      (params->field_mask & ucx::kConnectedFieldDeviceAddr) ? params->device_addr : nullptr;
  return Checks::connected(ep, dev, params->iface_addr) ? 1 : 0;
}

ucs_status_t estimatePerf(uct_iface_h iface, void* perf_attr) {
  // Exported from 1.16 on (weak: the load-time check has refused other generations).
  if (uct_base_iface_estimate_perf == nullptr) return UCS_ERR_UNSUPPORTED;
  return uct_base_iface_estimate_perf(iface, perf_attr);
}
void vfsRefresh(uct_iface_h) {}
ucs_status_t epQuery(uct_ep_h, void*) { return UCS_ERR_UNSUPPORTED; }
[[maybe_unused]] ucs_status_t epInvalidate(uct_ep_h, unsigned) { return UCS_ERR_UNSUPPORTED; }
template <typename Params>
ucs_status_t epInvalidate(uct_ep_h, const Params*) {
  return UCS_ERR_UNSUPPORTED;
}
[[maybe_unused]] ucs_status_t connectToEpV2(uct_ep_h, const uct_device_addr_t*,
                                            const uct_ep_addr_t*, const void*) {
  return UCS_ERR_UNSUPPORTED;
}
// iface_query_v2 (1.20 on): gmd_rc has no v2 capabilities (SGL, tokens). UCP queries it only for
// protocols that need one and skips the lane on an error, which is the answer: none of them. Not
// filling the struct also keeps 1.22's and 1.23's different field layouts out of this table.
[[maybe_unused]] ucs_status_t ifaceQueryV2(uct_iface_h, void*) { return UCS_ERR_UNSUPPORTED; }
[[maybe_unused]] ucs_status_t getDeviceEp(uct_ep_h, void**) { return UCS_ERR_UNSUPPORTED; }
// iface_mem_element_pack (1.20 only; an MD op from 1.21): no device-side memory elements.
[[maybe_unused]] ucs_status_t memElementPack(uct_iface_h, uct_mem_h, uct_rkey_t, void*) {
  return UCS_ERR_UNSUPPORTED;
}
[[maybe_unused]] long spareSlot() { return UCS_ERR_UNSUPPORTED; }

template <typename Ops, typename Checks>
constexpr Ops makeInternalOps() {
  Ops ops{};
  if constexpr (requires { ops.iface_query_v2; }) ops.iface_query_v2 = ifaceQueryV2;
  ops.iface_estimate_perf = estimatePerf;
  ops.iface_vfs_refresh = vfsRefresh;
  ops.ep_query = epQuery;
  ops.ep_invalidate = epInvalidate;
  if constexpr (requires { ops.ep_connect_to_ep_v2; }) ops.ep_connect_to_ep_v2 = connectToEpV2;
  if constexpr (requires { ops.iface_is_reachable_v2; })
    ops.iface_is_reachable_v2 = isReachableV2<Checks>;
  if constexpr (requires { ops.ep_is_connected; }) ops.ep_is_connected = isConnected<Checks>;
  if constexpr (requires { ops.iface_mem_element_pack; }) {
    ops.iface_mem_element_pack = memElementPack;
  }
  if constexpr (requires { ops.ep_get_device_ep; }) ops.ep_get_device_ep = getDeviceEp;
  if constexpr (requires { ops.ep_put_sgl_zcopy; }) ops.ep_put_sgl_zcopy = spareSlot;
  if constexpr (requires { ops.ep_get_sgl_zcopy; }) ops.ep_get_sgl_zcopy = spareSlot;
  if constexpr (requires { ops.ep_outstanding_purge; }) ops.ep_outstanding_purge = spareSlot;
  if constexpr (requires { ops.spare; }) {
    for (auto& slot : ops.spare) slot = spareSlot;
  }
  return ops;
}

}  // namespace

ucx::IfaceInternalOps* ifaceInternalOps() noexcept {
  static constinit ucx::IfaceInternalOps ops = makeInternalOps<ucx::IfaceInternalOps, RcChecks>();
  return ucx::kOwnInternalOps ? &ops : ucx::libuctDefaultInternalOps();
}

namespace {
template <typename Attr>
void finish(Attr* attr) {
  if constexpr (requires { attr->ctl_device; }) attr->ctl_device = UCS_SYS_DEVICE_ID_UNKNOWN;
}
}  // namespace

void finishIfaceAttr(uct_iface_attr_t* attr) noexcept { finish(attr); }

}  // namespace gmd::md::rc

namespace gmd::md::copy {

ucx::IfaceInternalOps* ifaceInternalOps() noexcept {
  static constinit ucx::IfaceInternalOps ops =
      rc::makeInternalOps<ucx::IfaceInternalOps, rc::CopyChecks>();
  return ucx::kOwnInternalOps ? &ops : ucx::libuctDefaultInternalOps();
}

}  // namespace gmd::md::copy
