// The part of UCX's component ABI that no release from 1.13 to 1.23 changed (x86-64 and aarch64,
// LP64): the MD header, the transport descriptor, the interface base class and the deregistration /
// key-packing parameters. gmd's own declarations, with UCX's layout; included by md/abi/layout.h
// (what changed, release by release), never directly.
#pragma once

#include <ucs/config/parser.h>
#include <ucm/api/ucm.h>
#include <ucs/datastruct/list.h>
#include <uct/api/uct.h>  // includes uct/api/tl.h

#include <cstddef>
#include <cstdint>

namespace gmd::ucx {

struct Component;         // md/abi/layout.h
struct MdOps;             // md/abi/layout.h
struct IfaceInternalOps;  // md/abi/layout.h

// The component's methods that kept their signature from 1.13 to 1.23 (rkey_unpack changed
// in 1.19).
using QueryMdResourcesFn = ucs_status_t (*)(Component* component,
                                            uct_md_resource_desc_t** resources_p,
                                            unsigned* num_resources_p);
using MdOpenFn = ucs_status_t (*)(Component* component, const char* md_name,
                                  const uct_md_config_t* config, uct_md_h* md_p);
using CmOpenFn = ucs_status_t (*)(Component* component, uct_worker_h worker,
                                  const uct_cm_config_t* config, uct_cm_h* cm_p);
using RkeyPtrFn = ucs_status_t (*)(Component* component, uct_rkey_t rkey, void* handle,
                                   uint64_t remote_addr, void** local_addr_p);
using RkeyReleaseFn = ucs_status_t (*)(Component* component, uct_rkey_t rkey, void* handle);
using MdVfsInitFn = void (*)(uct_md_h md);

// uct_md_mem_dereg_v2() parameters (UCX's uninstalled uct/api/v2/uct_v2.h), unchanged 1.13-1.23.
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
static_assert(sizeof(DeregParams) == 32, "UCX dereg params layout");

// uct_md_mkey_pack_v2() parameters (same header, unchanged).
struct MkeyPackParams {
  std::uint64_t field_mask;
  unsigned flags;
};
static_assert(sizeof(MkeyPackParams) == 16, "UCX mkey pack params layout");

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
static_assert(sizeof(TlDeviceResource) == UCT_DEVICE_NAME_MAX + 8, "UCX tl device layout");

// A transport of a component, linked into Component::tl_list by uct_tl_register().
struct Transport {
  char name[UCT_TL_NAME_MAX];
  ucs_status_t (*query_devices)(uct_md_h md, TlDeviceResource** devices_p, unsigned* num_p);
  ucs_status_t (*iface_open)(uct_md_h md, uct_worker_h worker, const uct_iface_params_t* params,
                             const uct_iface_config_t* config, uct_iface_h* iface_p);
  ucs_config_global_list_entry_t config;
  ucs_list_link_t list;
};
static_assert(offsetof(Transport, config) == 32, "UCX tl descriptor layout");
static_assert(sizeof(Transport) == 32 + sizeof(ucs_config_global_list_entry_t) + 16,
              "UCX tl descriptor layout");

// --- Interfaces and endpoints (uct/base/uct_iface.h, uct/base/uct_worker.h)
// ------------------------
//
// libuct's own functions dereference an iface beyond its ops table (uct_iface_set_am_handler,
// uct_iface_estimate_perf, uct_iface_mem_alloc, uct_iface_handle_ep_err, the progress helpers), so
// a transport's iface must start with this base (uct_iface_t holds the ops table by value). An
// endpoint only needs uct_ep_t (its iface pointer). Built without statistics (Debian's UCX has no
// ENABLE_STATS), so no stats node follows the config.

// The transport-independent part of every iface configuration (uct_iface_config_table fills it).
struct IfaceConfigBase {
  struct {
    uct_alloc_method_t* methods;
    unsigned count;
  } alloc_methods;
  int failure;  // ucs_log_level_t
  size_t max_num_eps;
};
static_assert(sizeof(IfaceConfigBase) == 32, "UCX iface config layout");

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
// The 50-slot public ops table and the base class are the same in every generation gmd mirrors.
static_assert(sizeof(uct_iface_t) == 50 * sizeof(void*), "UCX iface ops layout");
static_assert(offsetof(BaseIface, internal_ops) == 400, "UCX base iface layout");
static_assert(offsetof(BaseIface, am) == 424, "UCX base iface layout");
static_assert(offsetof(BaseIface, err_handler) == 424 + 24 * UCT_AM_ID_MAX + 16,
              "UCX base iface layout");
static_assert(offsetof(BaseIface, progress_flags) == 1236, "UCX base iface layout");
static_assert(sizeof(BaseIface) == 1280, "UCX base iface layout");

// libucm's memory-type events. The event bits and ucm_event_t are installed API (ucm/api/ucm.h);
// the three calls that raise an event as libucm's own hooks do are exported by libucm.so.0 in every
// generation gmd mirrors but declared only in UCX's uninstalled src/ucm/event/event.h, so gmd
// resolves them with dlsym (md/ucm_events.cc) and works on without them. ucm_event_t's mem_type
// member changed in 1.22 (UcmMemTypeEvent in md/abi/layout.h).
inline constexpr int kUcmEventMemTypeAlloc = 1 << 20;  // UCM_EVENT_MEM_TYPE_ALLOC
inline constexpr int kUcmEventMemTypeFree = 1 << 21;   // UCM_EVENT_MEM_TYPE_FREE
static_assert(kUcmEventMemTypeAlloc == UCM_EVENT_MEM_TYPE_ALLOC, "libucm event bits");
static_assert(kUcmEventMemTypeFree == UCM_EVENT_MEM_TYPE_FREE, "libucm event bits");
static_assert(sizeof(ucm_event_type_t) == sizeof(int), "libucm event type is an int enum");
inline constexpr const char* kUcmEventEnter = "ucm_event_enter";        // void (void)
inline constexpr const char* kUcmEventDispatch = "ucm_event_dispatch";  // void (type, event*)
inline constexpr const char* kUcmEventLeave = "ucm_event_leave";        // void (void)
using UcmEventEnterFn = void (*)();
using UcmEventDispatchFn = void (*)(ucm_event_type_t event_type, ucm_event_t* event);
using UcmEventLeaveFn = void (*)();

}  // namespace gmd::ucx

// Exported by libuct in every generation gmd mirrors, declared only in headers it does not install.
extern "C" {
void uct_component_register(gmd::ucx::Component* component);
void uct_component_unregister(gmd::ucx::Component* component);
extern ucs_config_field_t uct_md_config_table[];
ucs_status_t uct_md_mem_dereg_v2(uct_md_h md, const gmd::ucx::DeregParams* params);
// Links a transport into component->tl_list and its config entry into UCX's global config list.
void uct_tl_register(gmd::ucx::Component* component, gmd::ucx::Transport* tl);
extern ucs_config_field_t uct_iface_config_table[];  // fills IfaceConfigBase
void uct_base_iface_progress_enable(uct_iface_h iface, unsigned flags);
void uct_base_iface_progress_disable(uct_iface_h iface, unsigned flags);
// Calls the iface's error handler (BaseIface::err_handler) for a failed endpoint.
ucs_status_t uct_iface_handle_ep_err(uct_iface_h iface, uct_ep_h ep, ucs_status_t status);
// Exported from 1.16 on (perf_attr: uct_perf_attr_t*). Weak, like every symbol only some releases
// have: a build for one generation must load into any other so that its check can refuse.
__attribute__((weak)) ucs_status_t uct_base_iface_estimate_perf(uct_iface_h iface, void* perf_attr);
}
