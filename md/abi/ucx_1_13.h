// UCX 1.13 component ABI, declared by gmd (x86-64 and aarch64, LP64).
//
// UCX installs only its public API; the structures a component must hand to libuct (the component,
// the MD ops table, the MD header and the transport descriptor) live in headers UCX does not install.
// These are gmd's own declarations with the same layout. Supporting another UCX ABI generation means
// adding a sibling file (see md/ucx_abi.h), never editing this one.
#pragma once

#include <uct/api/uct.h>  // includes uct/api/tl.h
#include <ucs/config/parser.h>
#include <ucs/datastruct/list.h>

#include <cstddef>
#include <cstdint>

namespace gmd::ucx {

inline constexpr unsigned kAbiMajor = 1;
inline constexpr unsigned kAbiMinor = 13;

struct Component;

// uct_md_mem_dereg_v2() parameters (declared in UCX's uninstalled uct/api/v2/uct_v2.h).
enum : std::uint64_t {
  kDeregFieldMemh = 1u << 0,
  kDeregFieldFlags = 1u << 1,
  kDeregFieldCompletion = 1u << 2,
};
enum : unsigned { kDeregFlagInvalidate = 1u << 0 };
struct DeregParams {
  std::uint64_t field_mask;
  unsigned flags;
  uct_mem_h memh;
  uct_completion_t* comp;
};

// uct_md_mkey_pack_v2() parameters (same header).
struct MkeyPackParams {
  std::uint64_t field_mask;
  unsigned flags;
};

using QueryMdResourcesFn = ucs_status_t (*)(Component* component,
                                            uct_md_resource_desc_t** resources_p,
                                            unsigned* num_resources_p);
using MdOpenFn = ucs_status_t (*)(Component* component, const char* md_name,
                                  const uct_md_config_t* config, uct_md_h* md_p);
using CmOpenFn = ucs_status_t (*)(Component* component, uct_worker_h worker,
                                  const uct_cm_config_t* config, uct_cm_h* cm_p);
using RkeyUnpackFn = ucs_status_t (*)(Component* component, const void* rkey_buffer,
                                      uct_rkey_t* rkey_p, void** handle_p);
using RkeyPtrFn = ucs_status_t (*)(Component* component, uct_rkey_t rkey, void* handle,
                                   uint64_t remote_addr, void** local_addr_p);
using RkeyReleaseFn = ucs_status_t (*)(Component* component, uct_rkey_t rkey, void* handle);
using MdVfsInitFn = void (*)(uct_md_h md);

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
  uint64_t flags;  // UCT_COMPONENT_FLAG_*
  MdVfsInitFn md_vfs_init;  // called unconditionally by uct_md_open
};
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

// Every MD object starts with this header; libuct reads both fields.
struct MdHeader {
  MdOps* ops;
  Component* component;
};

// Base of every MD configuration structure (C forbids empty structs, so UCX's base has one char).
struct MdConfigBase {
  char dummy;
};

// Internal transport device descriptor returned by Transport::query_devices (malloc'ed array).
struct TlDeviceResource {
  char name[UCT_DEVICE_NAME_MAX];
  uct_device_type_t type;
  ucs_sys_device_t sys_device;
};

// A transport of a component, linked into Component::tl_list by uct_tl_register().
struct Transport {
  char name[UCT_TL_NAME_MAX];
  ucs_status_t (*query_devices)(uct_md_h md, TlDeviceResource** devices_p, unsigned* num_p);
  ucs_status_t (*iface_open)(uct_md_h md, uct_worker_h worker, const uct_iface_params_t* params,
                             const uct_iface_config_t* config, uct_iface_h* iface_p);
  ucs_config_global_list_entry_t config;
  ucs_list_link_t list;
};


// --- Interfaces and endpoints (uct/base/uct_iface.h, uct/base/uct_worker.h at 1.13.1) -------------
//
// libuct's own functions dereference an iface beyond its ops table (uct_iface_set_am_handler,
// uct_iface_estimate_perf, uct_iface_mem_alloc, uct_iface_handle_ep_err, the progress helpers), so a
// transport's iface must start with this base (uct_iface_t holds the ops table by value). An endpoint only needs uct_ep_t (its iface pointer).
// Built without statistics (Debian's UCX has no ENABLE_STATS), so no stats node follows the config.

// The transport-independent part of every iface configuration (uct_iface_config_table fills it).
struct IfaceConfigBase {
  struct {
    uct_alloc_method_t* methods;
    unsigned count;
  } alloc_methods;
  int failure;  // ucs_log_level_t
  size_t max_num_eps;
};

struct IfaceInternalOps {
  ucs_status_t (*iface_estimate_perf)(uct_iface_h iface, void* perf_attr);  // uct_perf_attr_t*
  void (*iface_vfs_refresh)(uct_iface_h iface);
  ucs_status_t (*ep_query)(uct_ep_h ep, uct_ep_attr_t* ep_attr);
  ucs_status_t (*ep_invalidate)(uct_ep_h ep, unsigned flags);
};

struct AmHandler {
  uct_am_callback_t cb;
  void* arg;
  uint32_t flags;
};

struct WorkerProgress {
  uct_worker_cb_id_t id;  // UCS_CALLBACKQ_ID_NULL when not registered
  uint32_t refcount;
};

struct BaseIface {
  uct_iface_t super;
  IfaceInternalOps* internal_ops;
  uct_md_h md;
  uct_worker_h worker;  // libuct's private worker starts with the public one
  AmHandler am[UCT_AM_ID_MAX];
  uct_am_tracer_t am_tracer;
  void* am_tracer_arg;
  uct_error_handler_t err_handler;
  void* err_handler_arg;
  uint32_t err_handler_flags;
  WorkerProgress prog;
  unsigned progress_flags;  // UCT_PROGRESS_* currently enabled
  struct {
    unsigned num_alloc_methods;
    uct_alloc_method_t alloc_methods[UCT_ALLOC_METHOD_LAST];
    ucs_log_level_t failure_level;
    size_t max_num_eps;
  } config;
};
static_assert(sizeof(uct_iface_t) == 50 * sizeof(void*), "UCX 1.13 iface ops layout");
static_assert(offsetof(BaseIface, internal_ops) == 400, "UCX 1.13 base iface layout");
static_assert(offsetof(BaseIface, am) == 424, "UCX 1.13 base iface layout");
static_assert(offsetof(BaseIface, err_handler) == 424 + 24 * UCT_AM_ID_MAX + 16,
              "UCX 1.13 base iface layout");
static_assert(offsetof(BaseIface, progress_flags) == 1236, "UCX 1.13 base iface layout");
static_assert(sizeof(BaseIface) == 1280, "UCX 1.13 base iface layout");

}  // namespace gmd::ucx

// Exported by libuct 1.13 but declared only in headers it does not install.
extern "C" {
void uct_component_register(gmd::ucx::Component* component);
void uct_component_unregister(gmd::ucx::Component* component);
extern ucs_config_field_t uct_md_config_table[];
ucs_status_t uct_md_mem_dereg_v2(uct_md_h md, const gmd::ucx::DeregParams* params);
ucs_status_t uct_md_mkey_pack_v2(uct_md_h md, uct_mem_h memh,
                                 const gmd::ucx::MkeyPackParams* params, void* rkey_buffer);
// Links a transport into component->tl_list and its config entry into UCX's global config list.
void uct_tl_register(gmd::ucx::Component* component, gmd::ucx::Transport* tl);
extern ucs_config_field_t uct_iface_config_table[];  // fills IfaceConfigBase
extern gmd::ucx::IfaceInternalOps uct_base_iface_internal_ops;  // default internal ops
void uct_base_iface_progress_enable(uct_iface_h iface, unsigned flags);
void uct_base_iface_progress_disable(uct_iface_h iface, unsigned flags);
// Calls the iface's error handler (BaseIface::err_handler) for a failed endpoint.
ucs_status_t uct_iface_handle_ep_err(uct_iface_h iface, uct_ep_h ep, ucs_status_t status);
}
