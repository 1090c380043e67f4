// UCX 1.22 and 1.23 component ABI, declared by gmd (x86-64 and aarch64, LP64). 1.23 only appends
// slots to the MD ops (mem_elem_release) and the iface internal ops (ep_get_sgl_zcopy,
// ep_outstanding_purge): gmd's tables have 1.23's slots plus kSpareSlots more, all filled, so one
// mirror serves both. What every generation shares is in md/abi/common.h; see md/README.md,
// "UCX ABI generations".
#pragma once

#include "md/abi/common.h"
#include "md/abi/since_1_16.h"

namespace gmd::ucx {

inline constexpr unsigned kAbiMajor = 1;
inline constexpr unsigned kAbiMinor = 22;
inline constexpr unsigned kAbiLastMinor = 23;
inline constexpr const char* kAbiName = "1.22-1.23";

inline constexpr bool kMdQueryV2 = true;
inline constexpr bool kMemRegParams = true;
inline constexpr bool kMdInvalidateRma = true;
inline constexpr bool kOwnInternalOps = true;

// Runtime identification: 1.22 added uct_ep_put_sgl_zcopy and uct_md_mem_query_v2. A later UCX
// that changes more than trailing slots needs its own mirror; ucp_get_version() catches it where
// libucp is loaded (md/component.cc).
inline constexpr const char* kAbiHas = "uct_ep_put_sgl_zcopy";
inline constexpr const char* kAbiLacks = "";  // none known yet

// Unused trailing slots at the end of each table, stubs returning UCS_ERR_UNSUPPORTED.
inline constexpr std::size_t kSpareSlots = 4;

// mem_reg parameters: + mem_type (1.22).
struct MemRegParams {
  static constexpr std::uint64_t kFieldFlags = 1u << 0;
  static constexpr std::uint64_t kFieldDmabufFd = 1u << 1;
  static constexpr int kDmabufFdInvalid = -1;  // UCT_DMABUF_FD_INVALID
  // Public mem_reg flags newer than 1.13 (uct_md_mem_flags): a hint the MD may ignore, and
  // global-VA registration, which gmd does not offer (it advertises no gva_mem_types).
  static constexpr std::uint64_t kFlagSymmetricRkey = 1u << 10;
  static constexpr std::uint64_t kFlagGva = 1u << 11;
  std::uint64_t field_mask;
  std::uint64_t flags;
  int dmabuf_fd;
  size_t dmabuf_offset;
  ucs_memory_type_t mem_type;
};
static_assert(sizeof(MemRegParams) == 40, "UCX 1.22 mem_reg params layout");

struct MemAttachParams {
  std::uint64_t field_mask;
  std::uint64_t flags;
  size_t mkey_size;
};

// MD attributes: 1.18's plus required_mem_flags.
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
  std::uint8_t required_mem_flags;
};
static_assert(MdAttrV2::kFlagInvalidateRma == (1u << 11), "UCX 1.22 UCT_MD_FLAG_INVALIDATE_RMA");
static_assert(sizeof(MdAttrV2) == 544, "UCX 1.22 MD attributes v2 layout");
static_assert(offsetof(MdAttrV2, reg_alignment) == 528, "UCX 1.22 MD attributes v2 layout");

// mem_query attributes v2: the public v1 struct plus mem_flags (field bit 6).
struct MemAttr {
  static constexpr std::uint64_t kFieldDmabufFd = 1u << 4;
  static constexpr std::uint64_t kFieldDmabufOffset = 1u << 5;
  static constexpr std::uint64_t kFieldMemFlags = 1u << 6;
  static constexpr int kDmabufFdInvalid = -1;
  std::uint64_t field_mask;
  ucs_memory_type_t mem_type;
  ucs_sys_device_t sys_dev;
  void* base_address;
  size_t alloc_length;
  int dmabuf_fd;
  size_t dmabuf_offset;
  std::uint8_t mem_flags;
};
static_assert(sizeof(MemAttr) == 56, "UCX 1.22 memory attributes v2 layout");
static_assert(sizeof(uct_md_mem_attr_t) == 48, "UCX 1.22 public memory attributes");
static_assert(MemRegParams::kDmabufFdInvalid == UCT_DMABUF_FD_INVALID, "UCX 1.22 dma-buf fd");
static_assert(MemRegParams::kFlagSymmetricRkey == UCT_MD_MEM_SYMMETRIC_RKEY &&
                  MemRegParams::kFlagGva == UCT_MD_MEM_GVA,
              "UCX 1.22 mem_reg flags");
static_assert(offsetof(MemAttr, base_address) == offsetof(uct_md_mem_attr_t, base_address) &&
                  offsetof(MemAttr, alloc_length) == offsetof(uct_md_mem_attr_t, alloc_length) &&
                  offsetof(MemAttr, dmabuf_fd) == offsetof(uct_md_mem_attr_t, dmabuf_fd) &&
                  offsetof(MemAttr, dmabuf_offset) == offsetof(uct_md_mem_attr_t, dmabuf_offset),
              "UCX 1.22 memory attributes v2 extend the public ones");

// rkey_unpack parameters (1.19).
struct RkeyUnpackParams {
  std::uint64_t field_mask;
  ucs_sys_device_t sys_device;
};

// The public iface attributes gained ctl_device (1.22); 0 is a real device.
static_assert(offsetof(uct_iface_attr_t, ctl_device) > 0, "UCX 1.22 uct_iface_attr_t.ctl_device");

using RkeyUnpackFn = ucs_status_t (*)(Component* component, const void* rkey_buffer,
                                      const RkeyUnpackParams* params, uct_rkey_t* rkey_p,
                                      void** handle_p);

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
static_assert(sizeof(ucs_config_global_list_entry_t) == 56, "UCX 1.22 config entry layout");
static_assert(offsetof(Component, md_config) == 72, "UCX 1.22 component layout");
static_assert(offsetof(Component, cm_config) == 128, "UCX 1.22 component layout");
static_assert(sizeof(Component) == 232, "UCX 1.22 component layout");

// A slot gmd does not implement: returns UCS_ERR_UNSUPPORTED, whatever UCX passes it.
using SpareSlot = long (*)();

// 12 slots in 1.22 (mem_alloc with sys_dev since 1.19, mem_query v2, mem_elem_pack), 13 in 1.23.
struct MdOps {
  void (*close)(uct_md_h md);
  ucs_status_t (*query)(uct_md_h md, MdAttrV2* md_attr);
  ucs_status_t (*mem_alloc)(uct_md_h md, size_t* length_p, void** address_p,
                            ucs_memory_type_t mem_type, ucs_sys_device_t sys_dev, unsigned flags,
                            const char* alloc_name, uct_mem_h* memh_p);
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
  // 1.22: (md, memh, rkey, mem_elem); 1.23 adds a release handle out-parameter.
  ucs_status_t (*mem_elem_pack)(uct_md_h md, uct_mem_h memh, uct_rkey_t rkey, void* mem_elem,
                                void** release_handle_p);
  void (*mem_elem_release)(uct_md_h md, void* release_handle);  // 1.23
  SpareSlot spare[kSpareSlots];
};
static_assert(sizeof(MdOps) == (13 + kSpareSlots) * sizeof(void*), "UCX 1.23 MD ops layout");

struct EpInvalidateParams {
  std::uint64_t field_mask;
};

// 10 slots in 1.22 (iface_query_v2 first), 12 in 1.23.
struct IfaceInternalOps {
  ucs_status_t (*iface_query_v2)(uct_iface_h iface, void* iface_attr);  // uct_iface_attr_v2_t*
  ucs_status_t (*iface_estimate_perf)(uct_iface_h iface, void* perf_attr);
  void (*iface_vfs_refresh)(uct_iface_h iface);
  ucs_status_t (*ep_query)(uct_ep_h ep, void* ep_attr);
  ucs_status_t (*ep_invalidate)(uct_ep_h ep, const EpInvalidateParams* params);
  ucs_status_t (*ep_connect_to_ep_v2)(uct_ep_h ep, const uct_device_addr_t* device_addr,
                                      const uct_ep_addr_t* ep_addr, const void* params);
  int (*iface_is_reachable_v2)(uct_iface_h iface, const IsReachableParams* params);
  int (*ep_is_connected)(uct_ep_h ep, const EpIsConnectedParams* params);
  ucs_status_t (*ep_get_device_ep)(uct_ep_h ep, void** device_ep_p);
  SpareSlot ep_put_sgl_zcopy;      // 1.22; gmd_rc offers no SGL operations
  SpareSlot ep_get_sgl_zcopy;      // 1.23
  SpareSlot ep_outstanding_purge;  // 1.23
  SpareSlot spare[kSpareSlots];
};
static_assert(sizeof(IfaceInternalOps) == (12 + kSpareSlots) * sizeof(void*),
              "UCX 1.23 iface internal ops");

// libuct's default internal-ops table: none from 1.16 on.
inline IfaceInternalOps* libuctDefaultInternalOps() noexcept { return nullptr; }

// ucm_event_t's mem_type member (UCM_EVENT_MEM_TYPE_ALLOC / _FREE) from 1.22: the range, its type
// (UCS_MEMORY_TYPE_UNKNOWN asks UCX to detect it), and the system device and ucs memory flags
// (sys_dev unknown with flags 0 also asks UCX to detect them).
struct UcmMemTypeEvent {
  void* address;
  size_t size;
  ucs_memory_type_t mem_type;
  ucs_sys_device_t sys_dev;
  std::uint8_t mem_flags;
};
inline constexpr bool kUcmMemTypeEventHasDevice = true;
static_assert(offsetof(ucm_event_t, mem_type) == 0, "libucm mem_type event layout");
static_assert(sizeof(ucm_event_t::mem_type) == sizeof(UcmMemTypeEvent),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.size) == offsetof(UcmMemTypeEvent, size),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.mem_type) == offsetof(UcmMemTypeEvent, mem_type),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.sys_dev) == offsetof(UcmMemTypeEvent, sys_dev),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.mem_flags) == offsetof(UcmMemTypeEvent, mem_flags),
              "libucm mem_type event layout");

}  // namespace gmd::ucx
