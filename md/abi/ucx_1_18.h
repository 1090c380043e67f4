// UCX 1.18 component ABI, declared by gmd (x86-64 and aarch64, LP64). Serves 1.18 only: 1.19
// changes the component's rkey_unpack. What every generation shares is in md/abi/common.h; see
// md/README.md, "UCX ABI generations".
#pragma once

#include "md/abi/common.h"
#include "md/abi/since_1_16.h"

namespace gmd::ucx {

inline constexpr unsigned kAbiMajor = 1;
inline constexpr unsigned kAbiMinor = 18;
inline constexpr unsigned kAbiLastMinor = 18;
inline constexpr const char* kAbiName = "1.18";

inline constexpr bool kMdQueryV2 = true;
inline constexpr bool kMemRegParams = true;
inline constexpr bool kMdInvalidateRma = true;
inline constexpr bool kOwnInternalOps = true;

// Runtime identification: 1.18 added uct_iface_fill_info_str_buf, 1.19 uct_rkey_unpack_v2.
inline constexpr const char* kAbiHas = "uct_iface_fill_info_str_buf";
inline constexpr const char* kAbiLacks = "uct_rkey_unpack_v2";

// --- Parameter and attribute structs of the MD ops (uct/api/v2/uct_v2.h, not installed)
// -----------

// mem_reg parameters (1.14-1.21 layout).
struct MemRegParams {
  static constexpr std::uint64_t kFieldFlags = 1u << 0;
  static constexpr std::uint64_t kFieldDmabufFd = 1u << 1;
  static constexpr int kDmabufFdInvalid = -1;  // UCT_DMABUF_FD_INVALID
  // Public mem_reg flags newer than 1.13 (uct_md_mem_flags): a hint the MD may ignore, and
  // global-VA registration, which gmd does not offer (it advertises no gva_mem_types).
  static constexpr std::uint64_t kFlagSymmetricRkey = 1u << 10;
  static constexpr std::uint64_t kFlagGva = 1u << 11;
  std::uint64_t field_mask;
  std::uint64_t flags;  // UCT_MD_MEM_FLAG_* / UCT_MD_MEM_ACCESS_*
  int dmabuf_fd;
  size_t dmabuf_offset;
};
static_assert(sizeof(MemRegParams) == 32, "UCX 1.18 mem_reg params layout");
static_assert(MemRegParams::kDmabufFdInvalid == UCT_DMABUF_FD_INVALID, "UCX 1.18 dma-buf fd");
static_assert(MemRegParams::kFlagSymmetricRkey == UCT_MD_MEM_SYMMETRIC_RKEY &&
                  MemRegParams::kFlagGva == UCT_MD_MEM_GVA,
              "UCX 1.18 mem_reg flags");

struct MemAttachParams {
  std::uint64_t field_mask;
  std::uint64_t flags;
};

// The MD attributes the query op fills (1.18: gva_mem_types after cache_mem_types).
struct MdAttrV2 {
  // uct_md_flags_v2_t: the first v2 flag follows the public ones.
  static constexpr std::uint64_t kFlagInvalidateRma = UCT_MD_FLAG_LAST;
  std::uint64_t field_mask;
  std::uint64_t max_alloc;
  size_t max_reg;
  std::uint64_t flags;
  std::uint64_t reg_mem_types;
  std::uint64_t reg_nonblock_mem_types;
  std::uint64_t cache_mem_types;
  std::uint64_t gva_mem_types;
  std::uint64_t detect_mem_types;
  std::uint64_t alloc_mem_types;
  std::uint64_t access_mem_types;
  std::uint64_t dmabuf_mem_types;
  ucs_linear_func_t reg_cost;
  char component_name[UCT_COMPONENT_NAME_MAX];
  size_t rkey_packed_size;
  ucs_cpu_set_t local_cpus;
  size_t exported_mkey_packed_size;
  char global_id[UCT_MD_GLOBAL_ID_MAX];
  size_t reg_alignment;
};
static_assert(MdAttrV2::kFlagInvalidateRma == (1u << 11), "UCX 1.18 UCT_MD_FLAG_INVALIDATE_RMA");
static_assert(sizeof(MdAttrV2) == 536, "UCX 1.18 MD attributes v2 layout");
static_assert(offsetof(MdAttrV2, gva_mem_types) == 56, "UCX 1.18 MD attributes v2 layout");
static_assert(offsetof(MdAttrV2, local_cpus) == 136, "UCX 1.18 MD attributes v2 layout");

// The public memory attributes are the ones the mem_query op fills (v2 arrives in 1.22).
using MemAttr = uct_md_mem_attr_t;
static_assert(sizeof(uct_md_mem_attr_t) == 48, "UCX 1.18 public memory attributes");

// --- The tables --------------------------------------------------------------------------------

using RkeyUnpackFn = ucs_status_t (*)(Component* component, const void* rkey_buffer,
                                      uct_rkey_t* rkey_p, void** handle_p);

// 232 bytes: rkey_compare (1.16) after rkey_release; config entries of 56 bytes (1.15).
struct Component {
  char name[UCT_COMPONENT_NAME_MAX];
  QueryMdResourcesFn query_md_resources;
  MdOpenFn md_open;
  CmOpenFn cm_open;
  RkeyUnpackFn rkey_unpack;
  RkeyPtrFn rkey_ptr;
  RkeyReleaseFn rkey_release;
  RkeyCompareFn rkey_compare;
  ucs_config_global_list_entry_t md_config;
  ucs_config_global_list_entry_t cm_config;
  ucs_list_link_t tl_list;
  ucs_list_link_t list;
  uint64_t flags;
  MdVfsInitFn md_vfs_init;
};
static_assert(sizeof(ucs_config_global_list_entry_t) == 56, "UCX 1.18 config entry layout");
static_assert(offsetof(Component, md_config) == 72, "UCX 1.18 component layout");
static_assert(offsetof(Component, cm_config) == 128, "UCX 1.18 component layout");
static_assert(sizeof(Component) == 232, "UCX 1.18 component layout");

// 11 slots: mem_attach after mkey_pack (1.14), is_sockaddr_accessible gone (1.16).
struct MdOps {
  void (*close)(uct_md_h md);
  ucs_status_t (*query)(uct_md_h md, MdAttrV2* md_attr);
  ucs_status_t (*mem_alloc)(uct_md_h md, size_t* length_p, void** address_p,
                            ucs_memory_type_t mem_type, unsigned flags, const char* alloc_name,
                            uct_mem_h* memh_p);
  ucs_status_t (*mem_free)(uct_md_h md, uct_mem_h memh);
  ucs_status_t (*mem_advise)(uct_md_h md, uct_mem_h memh, void* addr, size_t length,
                             unsigned advice);
  ucs_status_t (*mem_reg)(uct_md_h md, void* address, size_t length, const MemRegParams* params,
                          uct_mem_h* memh_p);
  ucs_status_t (*mem_dereg)(uct_md_h md, const DeregParams* params);
  ucs_status_t (*mem_query)(uct_md_h md, const void* address, size_t length, MemAttr* mem_attr);
  ucs_status_t (*mkey_pack)(uct_md_h md, uct_mem_h memh, void* address, size_t length,
                            const MkeyPackParams* params, void* rkey_buffer);
  ucs_status_t (*mem_attach)(uct_md_h md, const void* mkey_buffer, MemAttachParams* params,
                             uct_mem_h* memh_p);
  ucs_status_t (*detect_memory_type)(uct_md_h md, const void* address, size_t length,
                                     ucs_memory_type_t* mem_type_p);
};
static_assert(sizeof(MdOps) == 11 * sizeof(void*), "UCX 1.18 MD ops layout");

// 7 slots; libuct has no default table from 1.16 on.
struct IfaceInternalOps {
  ucs_status_t (*iface_estimate_perf)(uct_iface_h iface, void* perf_attr);  // uct_perf_attr_t*
  void (*iface_vfs_refresh)(uct_iface_h iface);
  ucs_status_t (*ep_query)(uct_ep_h ep, void* ep_attr);
  ucs_status_t (*ep_invalidate)(uct_ep_h ep, unsigned flags);
  ucs_status_t (*ep_connect_to_ep_v2)(uct_ep_h ep, const uct_device_addr_t* device_addr,
                                      const uct_ep_addr_t* ep_addr, const void* params);
  int (*iface_is_reachable_v2)(uct_iface_h iface, const IsReachableParams* params);
  int (*ep_is_connected)(uct_ep_h ep, const EpIsConnectedParams* params);
};
static_assert(sizeof(IfaceInternalOps) == 7 * sizeof(void*), "UCX 1.18 iface internal ops");

// libuct's default internal-ops table: none from 1.16 on.
inline IfaceInternalOps* libuctDefaultInternalOps() noexcept { return nullptr; }

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
