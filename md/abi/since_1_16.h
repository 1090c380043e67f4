// Internal parameter structs that UCX 1.16 introduced and kept unchanged up to 1.23 (its
// uninstalled uct/api/v2/uct_v2.h): reachability, endpoint connection and remote-key comparison.
// gmd's own declarations; included by md/abi/layout.h (every release; used from 1.16 on).
#pragma once

#include "md/abi/common.h"

namespace gmd::ucx {

enum : std::uint64_t {
  kReachableFieldDeviceAddr = 1u << 0,
  kReachableFieldIfaceAddr = 1u << 1,
  kReachableFieldInfoString = 1u << 2,
  kReachableFieldInfoStringLength = 1u << 3,
  kReachableFieldScope = 1u << 4,
};
enum ReachabilityScope : int { kScopeDevice = 0, kScopeNetwork = 1 };
struct IsReachableParams {
  std::uint64_t field_mask;
  const uct_device_addr_t* device_addr;
  const uct_iface_addr_t* iface_addr;
  char* info_string;
  size_t info_string_length;
  ReachabilityScope scope;
  size_t device_addr_length;
  size_t iface_addr_length;
};
static_assert(sizeof(IsReachableParams) == 64, "UCX is_reachable params layout");

enum : std::uint64_t {
  kConnectedFieldDeviceAddr = 1u << 0,
  kConnectedFieldIfaceAddr = 1u << 1,
  kConnectedFieldEpAddr = 1u << 2,
};
struct EpIsConnectedParams {
  std::uint64_t field_mask;
  const uct_device_addr_t* device_addr;
  const uct_iface_addr_t* iface_addr;
  const uct_ep_addr_t* ep_addr;
};
static_assert(sizeof(EpIsConnectedParams) == 32, "UCX ep_is_connected params layout");

struct RkeyCompareParams {
  std::uint64_t field_mask;
};
// The component's rkey_compare (after rkey_release).
using RkeyCompareFn = ucs_status_t (*)(Component* component, uct_rkey_t rkey1, uct_rkey_t rkey2,
                                       const RkeyCompareParams* params, int* result);

}  // namespace gmd::ucx
