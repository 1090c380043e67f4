// UCX's component ABI from 1.13 to 1.23 (x86-64 and aarch64, LP64), declared by gmd: each structure
// libuct takes from a component once, with what changed in which minor marked where it changed
// (GMD_UCX_SINCE(m): this build's UCX is 1.m or newer). The build's minor is that of the
// uct/api/version.h it compiles against. What no release changed is in md/abi/common.h and
// md/abi/since_1_16.h; the table at the end of this file names every release's sizes in one place,
// and the build checks its own row. See md/README.md, "UCX ABI generations".
#pragma once

#include <uct/api/version.h>

#include "md/abi/common.h"
#include "md/abi/since_1_16.h"

#if UCT_VERNO_MAJOR != 1 || UCT_VERNO_MINOR < 13 || UCT_VERNO_MINOR > 23
#error "gmd knows the component ABI of UCX 1.13 to 1.23 (see md/abi/layout.h)"
#endif
#define GMD_UCX_SINCE(minor) (UCT_VERNO_MINOR >= (minor))

namespace gmd::ucx {

// --- Which releases this build serves -----------------------------------------------------------

inline constexpr unsigned kAbiMajor = 1;
// Each build serves its own minor; 1.23 only appended slots to 1.22's tables (gmd's tables carry
// them, plus spare ones), so a build for either serves both.
inline constexpr unsigned kAbiMinor = GMD_UCX_SINCE(22) ? 22 : UCT_VERNO_MINOR;
inline constexpr unsigned kAbiLastMinor = GMD_UCX_SINCE(22) ? 23 : UCT_VERNO_MINOR;
#define GMD_UCX_STR2(x) #x
#define GMD_UCX_STR(x) GMD_UCX_STR2(x)
inline constexpr const char* kAbiName =
    GMD_UCX_SINCE(22) ? "1.22-1.23" : "1." GMD_UCX_STR(UCT_VERNO_MINOR);
#undef GMD_UCX_STR
#undef GMD_UCX_STR2

// libuct has no version call: the newest of these exports it has tells its minor (each release
// keeps the earlier ones). md/component.cc reads them; libucp's version, where loaded, confirms.
struct ReleaseMarker {
  unsigned minor;
  const char* symbol;
};
inline constexpr ReleaseMarker kReleaseMarkers[] = {
    {13, "uct_md_mkey_pack_v2"},  {14, "uct_md_mem_reg_v2"},
    {15, "uct_sm_rkey_ptr"},      {16, "uct_rkey_compare"},
    {17, "uct_md_base_md_query"}, {18, "uct_iface_fill_info_str_buf"},
    {19, "uct_rkey_unpack_v2"},   {20, "uct_ep_get_device_ep"},
    {21, "uct_md_mem_elem_pack"}, {22, "uct_ep_put_sgl_zcopy"},
    {23, "uct_md_mem_elem_release"},
};

// What the edge adapters (md/abi/edge_*.cc) and the MD must know about the release.
inline constexpr bool kMdQueryV2 = GMD_UCX_SINCE(14);        // query takes uct_md_attr_v2_t
inline constexpr bool kMemRegParams = GMD_UCX_SINCE(14);     // mem_reg takes a params struct
inline constexpr bool kMdInvalidateRma = GMD_UCX_SINCE(15);  // UCP tests UCT_MD_FLAG_INVALIDATE_RMA
inline constexpr bool kOwnInternalOps = GMD_UCX_SINCE(16);   // libuct has no default table
inline constexpr bool kUcmMemTypeEventHasDevice = GMD_UCX_SINCE(22);  // sys_dev, mem_flags

// Unused trailing slots gmd adds to the tables a later release of its generation may extend
// (1.22's serve 1.23): stubs returning UCS_ERR_UNSUPPORTED, whatever UCX passes them.
inline constexpr std::size_t kSpareSlots = GMD_UCX_SINCE(22) ? 4 : 0;
using SpareSlot = long (*)();

// --- Parameter and attribute structs of the MD ops (uct/api/v2/uct_v2.h, never installed) -------

// mem_reg parameters (1.14; mem_type from 1.22).
struct MemRegParams {
  static constexpr std::uint64_t kFieldFlags = 1u << 0;
  static constexpr std::uint64_t kFieldDmabufFd = 1u << 1;
  static constexpr std::uint64_t kFieldDmabufOffset = 1u << 2;
  static constexpr int kDmabufFdInvalid = -1;  // UCT_DMABUF_FD_INVALID
  // Public mem_reg flags newer than 1.13 (uct_md_mem_flags): a hint the MD may ignore (1.16), and
  // global-VA registration (1.18), which gmd does not offer (it advertises no gva_mem_types).
  static constexpr std::uint64_t kFlagSymmetricRkey = 1u << 10;
  static constexpr std::uint64_t kFlagGva = 1u << 11;
  std::uint64_t field_mask;
  std::uint64_t flags;  // UCT_MD_MEM_FLAG_* / UCT_MD_MEM_ACCESS_*
  int dmabuf_fd;
  size_t dmabuf_offset;
#if GMD_UCX_SINCE(22)
  ucs_memory_type_t mem_type;
#endif
};

// mem_attach parameters (1.14; mkey_size from 1.19). gmd exports no keys and reads none of it.
struct MemAttachParams {
  std::uint64_t field_mask;
  std::uint64_t flags;
#if GMD_UCX_SINCE(19)
  size_t mkey_size;
#endif
};

// The MD attributes the query op fills from 1.14 on. Three members were inserted mid-struct
// (reg_nonblock_mem_types 1.15, gva_mem_types 1.18) or appended (reg_alignment 1.16,
// required_mem_flags 1.22); the edge fills the ones this release has (`requires`).
#if GMD_UCX_SINCE(14)
struct MdAttrV2 {
  // uct_md_flags_v2_t (1.15): the first v2 flag follows the public ones.
  static constexpr std::uint64_t kFlagInvalidateRma = 1u << 11;
  std::uint64_t field_mask;
  std::uint64_t max_alloc;
  size_t max_reg;
  std::uint64_t flags;
  std::uint64_t reg_mem_types;
#if GMD_UCX_SINCE(15)
  std::uint64_t reg_nonblock_mem_types;
#endif
  std::uint64_t cache_mem_types;
#if GMD_UCX_SINCE(18)
  std::uint64_t gva_mem_types;
#endif
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
#if GMD_UCX_SINCE(16)
  size_t reg_alignment;
#endif
#if GMD_UCX_SINCE(22)
  std::uint8_t required_mem_flags;
#endif
};
#endif

// What mem_query fills: the public attributes up to 1.21; from 1.22 their v2 extension (the same
// fields, then mem_flags, field bit 6).
#if GMD_UCX_SINCE(22)
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
static_assert(offsetof(MemAttr, base_address) == offsetof(uct_md_mem_attr_t, base_address) &&
                  offsetof(MemAttr, alloc_length) == offsetof(uct_md_mem_attr_t, alloc_length) &&
                  offsetof(MemAttr, dmabuf_fd) == offsetof(uct_md_mem_attr_t, dmabuf_fd) &&
                  offsetof(MemAttr, dmabuf_offset) == offsetof(uct_md_mem_attr_t, dmabuf_offset),
              "UCX 1.22 memory attributes v2 extend the public ones");
#else
using MemAttr = uct_md_mem_attr_t;
#endif

// rkey_unpack parameters (1.19).
struct RkeyUnpackParams {
  std::uint64_t field_mask;
  ucs_sys_device_t sys_device;
};

// ep_invalidate parameters (1.21; flags before).
struct EpInvalidateParams {
  std::uint64_t field_mask;
};

// --- The component ---------------------------------------------------------------------------------

#if GMD_UCX_SINCE(19)
using RkeyUnpackFn = ucs_status_t (*)(Component* component, const void* rkey_buffer,
                                      const RkeyUnpackParams* params, uct_rkey_t* rkey_p,
                                      void** handle_p);
#else
using RkeyUnpackFn = ucs_status_t (*)(Component* component, const void* rkey_buffer,
                                      uct_rkey_t* rkey_p, void** handle_p);
#endif

// libuct's component descriptor. Registered with uct_component_register(), which links `list` into
// libuct's component list and the two config entries (48 bytes up to 1.14, 56 from 1.15) into the
// global config list.
struct Component {
  char name[UCT_COMPONENT_NAME_MAX];
  QueryMdResourcesFn query_md_resources;
  MdOpenFn md_open;
  CmOpenFn cm_open;
  RkeyUnpackFn rkey_unpack;
  RkeyPtrFn rkey_ptr;
  RkeyReleaseFn rkey_release;
#if GMD_UCX_SINCE(16)
  RkeyCompareFn rkey_compare;
#endif
  ucs_config_global_list_entry_t md_config;
  ucs_config_global_list_entry_t cm_config;
  ucs_list_link_t tl_list;  // transports of this component (Transport::list)
  ucs_list_link_t list;
  uint64_t flags;           // UCT_COMPONENT_FLAG_*
  MdVfsInitFn md_vfs_init;  // called unconditionally by uct_md_open
};

// --- The MD operations table: libuct calls every slot without a NULL check ------------------------

struct MdOps {
  void (*close)(uct_md_h md);
#if GMD_UCX_SINCE(14)
  ucs_status_t (*query)(uct_md_h md, MdAttrV2* md_attr);
#else
  ucs_status_t (*query)(uct_md_h md, uct_md_attr_t* md_attr);
#endif
#if GMD_UCX_SINCE(19)
  ucs_status_t (*mem_alloc)(uct_md_h md, size_t* length_p, void** address_p,
                            ucs_memory_type_t mem_type, ucs_sys_device_t sys_dev, unsigned flags,
                            const char* alloc_name, uct_mem_h* memh_p);
#else
  ucs_status_t (*mem_alloc)(uct_md_h md, size_t* length_p, void** address_p,
                            ucs_memory_type_t mem_type, unsigned flags, const char* alloc_name,
                            uct_mem_h* memh_p);
#endif
  ucs_status_t (*mem_free)(uct_md_h md, uct_mem_h memh);
  ucs_status_t (*mem_advise)(uct_md_h md, uct_mem_h memh, void* addr, size_t length,
                             unsigned advice);
#if GMD_UCX_SINCE(14)
  ucs_status_t (*mem_reg)(uct_md_h md, void* address, size_t length, const MemRegParams* params,
                          uct_mem_h* memh_p);
#else
  ucs_status_t (*mem_reg)(uct_md_h md, void* address, size_t length, unsigned flags,
                          uct_mem_h* memh_p);
#endif
  ucs_status_t (*mem_dereg)(uct_md_h md, const DeregParams* params);
  ucs_status_t (*mem_query)(uct_md_h md, const void* address, size_t length, MemAttr* mem_attr);
#if GMD_UCX_SINCE(16)
  ucs_status_t (*mkey_pack)(uct_md_h md, uct_mem_h memh, void* address, size_t length,
                            const MkeyPackParams* params, void* rkey_buffer);
#else
  ucs_status_t (*mkey_pack)(uct_md_h md, uct_mem_h memh, const MkeyPackParams* params,
                            void* rkey_buffer);
#endif
#if GMD_UCX_SINCE(14)
  ucs_status_t (*mem_attach)(uct_md_h md, const void* mkey_buffer, MemAttachParams* params,
                             uct_mem_h* memh_p);
#endif
#if !GMD_UCX_SINCE(16)
  int (*is_sockaddr_accessible)(uct_md_h md, const ucs_sock_addr_t* sockaddr,
                                uct_sockaddr_accessibility_t mode);
#endif
  ucs_status_t (*detect_memory_type)(uct_md_h md, const void* address, size_t length,
                                     ucs_memory_type_t* mem_type_p);
#if GMD_UCX_SINCE(22)
  // 1.22: (md, memh, rkey, mem_elem); 1.23 adds a release handle out-parameter and the release.
  ucs_status_t (*mem_elem_pack)(uct_md_h md, uct_mem_h memh, uct_rkey_t rkey, void* mem_elem,
                                void** release_handle_p);
  void (*mem_elem_release)(uct_md_h md, void* release_handle);
  SpareSlot spare[kSpareSlots];
#elif GMD_UCX_SINCE(21)
  ucs_status_t (*mem_elem_pack)(uct_md_h md, uct_mem_h memh, uct_rkey_t rkey, void* mem_elem_p);
#endif
};

// --- The iface internal ops ----------------------------------------------------------------------
// Up to 1.15 libuct exports a default table (uct_base_iface_internal_ops) that gmd's transports use
// as is; from 1.16 each transport brings its own.

struct IfaceInternalOps {
#if GMD_UCX_SINCE(22) || (GMD_UCX_SINCE(20) && !GMD_UCX_SINCE(21))
  ucs_status_t (*iface_query_v2)(uct_iface_h iface, void* iface_attr);  // uct_iface_attr_v2_t*
#endif
  ucs_status_t (*iface_estimate_perf)(uct_iface_h iface, void* perf_attr);  // uct_perf_attr_t*
  void (*iface_vfs_refresh)(uct_iface_h iface);
#if GMD_UCX_SINCE(20) && !GMD_UCX_SINCE(21)
  ucs_status_t (*iface_mem_element_pack)(uct_iface_h iface, uct_mem_h memh, uct_rkey_t rkey,
                                         void* mem_element);
#endif
  ucs_status_t (*ep_query)(uct_ep_h ep, void* ep_attr);  // uct_ep_attr_t*
#if GMD_UCX_SINCE(21)
  ucs_status_t (*ep_invalidate)(uct_ep_h ep, const EpInvalidateParams* params);
#else
  ucs_status_t (*ep_invalidate)(uct_ep_h ep, unsigned flags);
#endif
#if GMD_UCX_SINCE(14)
  ucs_status_t (*ep_connect_to_ep_v2)(uct_ep_h ep, const uct_device_addr_t* device_addr,
                                      const uct_ep_addr_t* ep_addr, const void* params);
#endif
#if GMD_UCX_SINCE(15)
  int (*iface_is_reachable_v2)(uct_iface_h iface, const IsReachableParams* params);
#endif
#if GMD_UCX_SINCE(16)
  int (*ep_is_connected)(uct_ep_h ep, const EpIsConnectedParams* params);
#endif
#if GMD_UCX_SINCE(20)
  ucs_status_t (*ep_get_device_ep)(uct_ep_h ep, void** device_ep_p);
#endif
#if GMD_UCX_SINCE(22)
  SpareSlot ep_put_sgl_zcopy;      // 1.22; gmd_rc offers no SGL operations
  SpareSlot ep_get_sgl_zcopy;      // 1.23
  SpareSlot ep_outstanding_purge;  // 1.23
  SpareSlot spare[kSpareSlots];
#endif
};

// --- libucm's memory-type event (ucm_event_t's mem_type member, installed) -----------------------
// The range and its type (UCS_MEMORY_TYPE_UNKNOWN asks UCX to detect it); from 1.22 also the system
// device and ucs memory flags (unknown and 0 ask UCX to detect them).
struct UcmMemTypeEvent {
  void* address;
  size_t size;
  ucs_memory_type_t mem_type;
#if GMD_UCX_SINCE(22)
  ucs_sys_device_t sys_dev;
  std::uint8_t mem_flags;
#endif
};
static_assert(offsetof(ucm_event_t, mem_type) == 0, "libucm mem_type event layout");
static_assert(sizeof(ucm_event_t::mem_type) == sizeof(UcmMemTypeEvent),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.size) == offsetof(UcmMemTypeEvent, size),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.mem_type) == offsetof(UcmMemTypeEvent, mem_type),
              "libucm mem_type event layout");
#if GMD_UCX_SINCE(22)
static_assert(offsetof(ucm_event_t, mem_type.sys_dev) == offsetof(UcmMemTypeEvent, sys_dev),
              "libucm mem_type event layout");
static_assert(offsetof(ucm_event_t, mem_type.mem_flags) == offsetof(UcmMemTypeEvent, mem_flags),
              "libucm mem_type event layout");
#endif

// --- Every release's sizes, from its own sources (bytes; slots = pointers) -----------------------
// The one place to read a release's layout. The build checks its own row below; the public types
// (config entry, memory attributes) are checked against the headers it compiles with as well.
struct ReleaseLayout {
  unsigned minor;
  std::size_t component;       // uct_component_t
  std::size_t config_entry;    // ucs_config_global_list_entry_t (public)
  std::size_t md_ops;          // uct_md_ops_t slots
  std::size_t md_attr_v2;      // uct_md_attr_v2_t (0: none)
  std::size_t mem_reg_params;  // uct_md_mem_reg_params_t (0: flags)
  std::size_t mem_attr;        // what mem_query fills
  std::size_t internal_ops;    // uct_iface_internal_ops_t slots
};
inline constexpr ReleaseLayout kReleaseLayouts[] = {
    // minor cmpt entry md_ops attr_v2 reg_params mem_attr internal_ops
    {13, 208, 48, 11, 0, 0, 32, 4},   {14, 208, 48, 12, 512, 32, 48, 5},
    {15, 224, 56, 12, 520, 32, 48, 6}, {16, 232, 56, 11, 528, 32, 48, 7},
    {17, 232, 56, 11, 528, 32, 48, 7}, {18, 232, 56, 11, 536, 32, 48, 7},
    {19, 232, 56, 11, 536, 32, 48, 7}, {20, 232, 56, 11, 536, 32, 48, 10},
    {21, 232, 56, 12, 536, 32, 48, 8}, {22, 232, 56, 12, 544, 40, 56, 10},
    // 1.23 appends mem_elem_release and two internal ops: gmd's 1.22 tables already hold them.
    {23, 232, 56, 13, 544, 40, 56, 12},
};

constexpr const ReleaseLayout& thisRelease() {
  for (const ReleaseLayout& r : kReleaseLayouts) {
    if (r.minor == UCT_VERNO_MINOR) return r;
  }
  return kReleaseLayouts[0];
}
static_assert(thisRelease().minor == UCT_VERNO_MINOR, "a row for every release");
static_assert(sizeof(Component) == thisRelease().component, "UCX component layout");
static_assert(offsetof(Component, cm_config) ==
                  offsetof(Component, md_config) + thisRelease().config_entry,
              "UCX component layout");
static_assert(sizeof(ucs_config_global_list_entry_t) == thisRelease().config_entry,
              "UCX config entry layout");
// 1.22's tables are 1.23's plus the spare slots.
static_assert(sizeof(MdOps) == (GMD_UCX_SINCE(22) ? 13 + kSpareSlots : thisRelease().md_ops) *
                                   sizeof(void*),
              "UCX MD ops layout");
static_assert(sizeof(IfaceInternalOps) ==
                  (GMD_UCX_SINCE(22) ? 12 + kSpareSlots : thisRelease().internal_ops) *
                      sizeof(void*),
              "UCX iface internal ops layout");
#if GMD_UCX_SINCE(14)
static_assert(sizeof(MdAttrV2) == thisRelease().md_attr_v2, "UCX MD attributes v2 layout");
static_assert(sizeof(MemRegParams) == thisRelease().mem_reg_params, "UCX mem_reg params layout");
#endif
static_assert(sizeof(MemAttr) == thisRelease().mem_attr, "UCX memory attributes layout");
static_assert(sizeof(uct_md_mem_attr_t) == (GMD_UCX_SINCE(14) ? 48 : 32),
              "UCX public memory attributes");

// The public values the mirror repeats, where this release's headers have them.
#if GMD_UCX_SINCE(14)
static_assert(MemRegParams::kDmabufFdInvalid == UCT_DMABUF_FD_INVALID, "UCX dma-buf fd");
#endif
#if GMD_UCX_SINCE(15)
static_assert(MdAttrV2::kFlagInvalidateRma == UCT_MD_FLAG_LAST, "UCX UCT_MD_FLAG_INVALIDATE_RMA");
#endif
#if GMD_UCX_SINCE(16)
static_assert(MemRegParams::kFlagSymmetricRkey == UCT_MD_MEM_SYMMETRIC_RKEY, "UCX mem_reg flags");
static_assert(offsetof(MdAttrV2, reg_alignment) == thisRelease().md_attr_v2 -
                                                       (GMD_UCX_SINCE(22) ? 16 : 8),
              "UCX MD attributes v2 layout");
#endif
#if GMD_UCX_SINCE(18)
static_assert(MemRegParams::kFlagGva == UCT_MD_MEM_GVA, "UCX mem_reg flags");
static_assert(offsetof(MdAttrV2, gva_mem_types) == 56, "UCX MD attributes v2 layout");
#endif
#if GMD_UCX_SINCE(22)
static_assert(offsetof(uct_iface_attr_t, ctl_device) > 0, "UCX 1.22 uct_iface_attr_t.ctl_device");
#endif

// libuct's default internal-ops table up to 1.15; none from 1.16 on.
#if GMD_UCX_SINCE(16)
inline IfaceInternalOps* libuctDefaultInternalOps() noexcept { return nullptr; }
#endif

}  // namespace gmd::ucx

#if !GMD_UCX_SINCE(16)
// Exported by libuct up to 1.15 only. Weak: a build loaded into another UCX must still load, so that
// its load-time check can refuse to register (md/component.cc).
extern "C" {
__attribute__((weak)) extern gmd::ucx::IfaceInternalOps uct_base_iface_internal_ops;
}
namespace gmd::ucx {
inline IfaceInternalOps* libuctDefaultInternalOps() noexcept {
  return &uct_base_iface_internal_ops;
}
}  // namespace gmd::ucx
#endif
