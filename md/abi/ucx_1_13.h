// UCX 1.13 component ABI, declared by gmd (x86-64 and aarch64, LP64).
//
// UCX installs only its public API; the structures a component must hand to libuct (the component,
// the MD ops table, the iface internal ops) live in headers UCX does not install. These are gmd's
// own declarations with the same layout; what every generation shares is in md/abi/common.h.
// Another generation is a sibling file (see md/README.md, "UCX ABI generations"), never an edit of
// this one.
#pragma once

#include "md/abi/common.h"

namespace gmd::ucx {

inline constexpr unsigned kAbiMajor = 1;
inline constexpr unsigned kAbiMinor = 13;
inline constexpr unsigned kAbiLastMinor = 13;  // the newest minor this mirror serves
inline constexpr const char* kAbiName = "1.13";

// What changed after 1.13, as seen by the edge adapters (md/abi/edge_*.cc).
inline constexpr bool kMdQueryV2 = false;        // 1.14: query takes uct_md_attr_v2_t
inline constexpr bool kMemRegParams = false;     // 1.14: mem_reg takes a params struct
inline constexpr bool kMdInvalidateRma = false;  // 1.15: UCP tests UCT_MD_FLAG_INVALIDATE_RMA
inline constexpr bool kOwnInternalOps = false;   // 1.16: no default internal-ops table in libuct

// Runtime identification (md/component.cc): exports libuct 1.13 has, and the first of the next.
inline constexpr const char* kAbiHas = "uct_md_mkey_pack_v2";
inline constexpr const char* kAbiLacks = "uct_md_mem_reg_v2";  // 1.14

using RkeyUnpackFn = ucs_status_t (*)(Component* component, const void* rkey_buffer,
                                      uct_rkey_t* rkey_p, void** handle_p);

// libuct's component descriptor (208 bytes). Registered with uct_component_register(), which links
// `list` into libuct's component list and the two config entries into the global config list.
struct Component {
  char name[UCT_COMPONENT_NAME_MAX];
  QueryMdResourcesFn query_md_resources;
  MdOpenFn md_open;
  CmOpenFn cm_open;
  RkeyUnpackFn rkey_unpack;
  RkeyPtrFn rkey_ptr;
  RkeyReleaseFn rkey_release;
  ucs_config_global_list_entry_t md_config;
  ucs_config_global_list_entry_t cm_config;
  ucs_list_link_t tl_list;  // transports of this component (Transport::list)
  ucs_list_link_t list;
  uint64_t flags;           // UCT_COMPONENT_FLAG_*
  MdVfsInitFn md_vfs_init;  // called unconditionally by uct_md_open
};
static_assert(sizeof(ucs_config_global_list_entry_t) == 48, "UCX 1.13 config entry layout");
static_assert(sizeof(Component) == 208, "UCX 1.13 component layout");
static_assert(offsetof(Component, md_config) == 64, "UCX 1.13 component layout");
static_assert(offsetof(Component, cm_config) == 112, "UCX 1.13 component layout");

// The MD operations table: every slot is called without a NULL check.
struct MdOps {
  void (*close)(uct_md_h md);
  ucs_status_t (*query)(uct_md_h md, uct_md_attr_t* md_attr);
  ucs_status_t (*mem_alloc)(uct_md_h md, size_t* length_p, void** address_p,
                            ucs_memory_type_t mem_type, unsigned flags, const char* alloc_name,
                            uct_mem_h* memh_p);
  ucs_status_t (*mem_free)(uct_md_h md, uct_mem_h memh);
  ucs_status_t (*mem_advise)(uct_md_h md, uct_mem_h memh, void* addr, size_t length,
                             unsigned advice);
  ucs_status_t (*mem_reg)(uct_md_h md, void* address, size_t length, unsigned flags,
                          uct_mem_h* memh_p);
  ucs_status_t (*mem_dereg)(uct_md_h md, const DeregParams* params);
  ucs_status_t (*mem_query)(uct_md_h md, const void* address, size_t length,
                            uct_md_mem_attr_t* mem_attr);
  ucs_status_t (*mkey_pack)(uct_md_h md, uct_mem_h memh, const MkeyPackParams* params,
                            void* rkey_buffer);
  int (*is_sockaddr_accessible)(uct_md_h md, const ucs_sock_addr_t* sockaddr,
                                uct_sockaddr_accessibility_t mode);
  ucs_status_t (*detect_memory_type)(uct_md_h md, const void* address, size_t length,
                                     ucs_memory_type_t* mem_type_p);
};
static_assert(sizeof(MdOps) == 11 * sizeof(void*), "UCX 1.13 MD ops layout");
static_assert(sizeof(uct_md_mem_attr_t) == 32, "UCX 1.13 public memory attributes");

// libuct 1.13 exports a default table (uct_base_iface_internal_ops) that gmd_rc uses as is.
struct IfaceInternalOps {
  ucs_status_t (*iface_estimate_perf)(uct_iface_h iface, void* perf_attr);  // uct_perf_attr_t*
  void (*iface_vfs_refresh)(uct_iface_h iface);
  ucs_status_t (*ep_query)(uct_ep_h ep, void* ep_attr);  // uct_ep_attr_t*
  ucs_status_t (*ep_invalidate)(uct_ep_h ep, unsigned flags);
};
static_assert(sizeof(IfaceInternalOps) == 4 * sizeof(void*), "UCX 1.13 iface internal ops");

// ucm_event_t's mem_type member (UCM_EVENT_MEM_TYPE_ALLOC / _FREE) up to 1.21: the range and its
// type; UCS_MEMORY_TYPE_UNKNOWN (= UCS_MEMORY_TYPE_LAST) asks UCX to detect the type.
struct UcmMemTypeEvent {
  void* address;
  size_t size;
  ucs_memory_type_t mem_type;
};
inline constexpr bool kUcmMemTypeEventHasDevice = false;  // no sys_dev, no mem_flags
static_assert(offsetof(ucm_event_t, mem_type) == 0, "libucm mem_type event layout");
static_assert(sizeof(ucm_event_t::mem_type) == sizeof(UcmMemTypeEvent),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.size) == offsetof(UcmMemTypeEvent, size),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.mem_type) == offsetof(UcmMemTypeEvent, mem_type),
              "libucm mem_type event layout");

}  // namespace gmd::ucx

// Exported by libuct 1.13 only. Weak: a 1.13 build loaded into another UCX must still load, so that
// its load-time check can refuse to register (md/component.cc).
extern "C" {
__attribute__((weak)) extern gmd::ucx::IfaceInternalOps uct_base_iface_internal_ops;
}

namespace gmd::ucx {
inline IfaceInternalOps* libuctDefaultInternalOps() noexcept {
  return &uct_base_iface_internal_ops;
}
}  // namespace gmd::ucx
