// The UCT component `gmd`: registered with libuct when this module is loaded, never unloaded; and
// with it the module's second component, gmd_copy (md/copy/).
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <ucs/debug/log_def.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "md/copy/copy_md.h"
#include "md/mapping.h"
#include "md/md.h"
#include "md/md_config.h"
#include "md/rc/rc_iface.h"
#include "md/ucm_events.h"
#include "md/ucx_abi.h"

namespace gmd::md {
namespace {

// CUDA memory events start when UCX first lists gmd's MDs (before UCP looks any buffer up), with
// or without an RDMA device: UCX_GMD_CUDA_EVENTS comes from the component's own config table.
void startCudaEvents(ucx::Component* component) {
  if (ucm_events::state() != ucm_events::State::kNotStarted) return;
  uct_md_config_t* config = nullptr;
  if (uct_md_config_read(reinterpret_cast<uct_component_h>(component), nullptr, nullptr,
                         &config) != UCS_OK) {
    return;  // UCX has logged the bad value; md_open will fail on it too
  }
  ucm_events::start(reinterpret_cast<const MdConfig*>(config)->cuda_events != 0);
  uct_config_release(config);
}

ucs_status_t queryMdResources(ucx::Component* component, uct_md_resource_desc_t** resources_p,
                              unsigned* num_resources_p) {
  useUcxLogger();
  startCudaEvents(component);
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr || count == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    ucs_debug("gmd: no RDMA devices");
    *resources_p = nullptr;
    *num_resources_p = 0;
    return UCS_OK;
  }
  // libuct releases this array with free().
  auto* res = static_cast<uct_md_resource_desc_t*>(
      std::calloc(static_cast<std::size_t>(count), sizeof(uct_md_resource_desc_t)));
  if (res == nullptr) {
    ibv_free_device_list(list);
    return UCS_ERR_NO_MEMORY;
  }
  for (int i = 0; i < count; ++i) {
    std::strncpy(res[i].md_name, ibv_get_device_name(list[i]), sizeof(res[i].md_name) - 1);
  }
  ibv_free_device_list(list);
  *resources_p = res;
  *num_resources_p = static_cast<unsigned>(count);
  return UCS_OK;
}

ucs_status_t mdOpen(ucx::Component* component, const char* md_name, const uct_md_config_t* config,
                    uct_md_h* md_p) {
  return Md::open(component, md_name, *reinterpret_cast<const MdConfig*>(config), md_p);
}

ucs_status_t cmOpen(ucx::Component*, uct_worker_h, const uct_cm_config_t*, uct_cm_h*) {
  return UCS_ERR_UNSUPPORTED;
}

ucs_status_t unpack(const void* buffer, uct_rkey_t* rkey_p, void** handle_p) {
  MemType type;
  uct_rkey_t rkey;
  const ucs_status_t st = unpackRkey(buffer, &rkey, &type);
  if (st != UCS_OK) {
    ucs_error("gmd: cannot unpack remote key (format version %u, this build knows %u)",
              static_cast<const std::uint8_t*>(buffer)[0], kPackedRkeyVersion);
    return st;
  }
  *rkey_p = rkey;
  *handle_p = nullptr;
  return UCS_OK;
}

// rkey_unpack without (up to 1.18) and with (1.19 on) parameters; the slot's type picks one.
[[maybe_unused]] ucs_status_t rkeyUnpack(ucx::Component*, const void* buffer, uct_rkey_t* rkey_p,
                                         void** handle_p) {
  return unpack(buffer, rkey_p, handle_p);
}
template <typename Params>
ucs_status_t rkeyUnpack(ucx::Component*, const void* buffer, const Params*, uct_rkey_t* rkey_p,
                        void** handle_p) {
  return unpack(buffer, rkey_p, handle_p);
}

// rkey_compare (1.16 on): a gmd remote key is its verbs rkey, so keys order as numbers.
template <typename Params>
ucs_status_t rkeyCompare(ucx::Component*, uct_rkey_t rkey1, uct_rkey_t rkey2, const Params*,
                         int* result) {
  if (result == nullptr) return UCS_ERR_INVALID_PARAM;
  *result = (rkey1 > rkey2) - (rkey1 < rkey2);
  return UCS_OK;
}

ucs_status_t rkeyPtr(ucx::Component*, uct_rkey_t, void*, uint64_t, void**) {
  return UCS_ERR_UNSUPPORTED;
}

ucs_status_t rkeyRelease(ucx::Component*, uct_rkey_t, void*) { return UCS_OK; }

void mdVfsInit(uct_md_h) {}

// Constant-initialised (constinit): the descriptor is complete before any constructor runs.
template <typename C>
constexpr C makeComponent() {
  C c{};
  c.name[0] = 'g';
  c.name[1] = 'm';
  c.name[2] = 'd';
  c.query_md_resources = queryMdResources;
  c.md_open = mdOpen;
  c.cm_open = cmOpen;
  c.rkey_unpack = rkeyUnpack;
  c.rkey_ptr = rkeyPtr;
  c.rkey_release = rkeyRelease;
  if constexpr (requires { c.rkey_compare; }) c.rkey_compare = rkeyCompare;
  c.md_config.name = "gmd memory domain";
  c.md_config.prefix = kConfigPrefix;
  c.md_config.table = kMdConfigTable;
  c.md_config.size = sizeof(MdConfig);
  c.cm_config.name = "";
  c.cm_config.prefix = "";
  c.cm_config.table = nullptr;
  c.cm_config.size = 0;
  c.flags = 0;
  c.md_vfs_init = mdVfsInit;
  return c;
}

constinit ucx::Component g_component = makeComponent<ucx::Component>();

// The running UCX must have the component ABI this module was built for (md/abi/layout.h). libuct
// has no version call, so its exports tell the minor (ucx::kReleaseMarkers); libucp, where the
// process has loaded it, tells the exact release. Nothing here may need a symbol only some releases
// export.
bool runningUcxMatches(char* why, std::size_t why_len) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&uct_component_register), &info) == 0 ||
      info.dli_fname == nullptr) {
    std::snprintf(why, why_len, "cannot locate libuct");
    return false;
  }
  void* uct = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (uct == nullptr) {
    std::snprintf(why, why_len, "cannot inspect libuct");
    return false;
  }
  unsigned seen = 0;
  for (const ucx::ReleaseMarker& m : ucx::kReleaseMarkers) {
    if (dlsym(uct, m.symbol) != nullptr) seen = m.minor;
  }
  dlclose(uct);
  if (seen == 0) {
    std::snprintf(why, why_len, "the running libuct is older than UCX 1.13");
  } else {
    std::snprintf(why, why_len, "the running libuct is UCX 1.%u", seen);
  }
  bool match = seen >= ucx::kAbiMinor && seen <= ucx::kAbiLastMinor;
  // Of how UCX can be configured, only statistics change a layout gmd mirrors: the base iface and
  // endpoint grow a stats node (md/abi/common.h asserts 1280 bytes without). libucs exports its
  // allocator only then.
  if (match && dlsym(RTLD_DEFAULT, "ucs_stats_node_alloc") != nullptr) {
    std::snprintf(why, why_len, "the running UCX is built with statistics (--enable-stats)");
    return false;
  }

  using GetVersionFn = void (*)(unsigned*, unsigned*, unsigned*);
  if (auto* get = reinterpret_cast<GetVersionFn>(dlsym(RTLD_DEFAULT, "ucp_get_version"))) {
    unsigned major = 0, minor = 0, release = 0;
    get(&major, &minor, &release);
    std::snprintf(why, why_len, "the running UCX is %u.%u.%u", major, minor, release);
    match =
        match && major == ucx::kAbiMajor && minor >= ucx::kAbiMinor && minor <= ucx::kAbiLastMinor;
  }
  return match;
}

__attribute__((constructor)) void registerComponent() {
  char why[96];
  if (!runningUcxMatches(why, sizeof(why))) {
    ucs_warn(
        "gmd: built for UCX %s but %s: component gmd not registered (build gmd against the "
        "UCX it runs with)",
        ucx::kAbiName, why);
    return;
  }
  // Before anything classifies a buffer: UCX's CUDA hooks go in before gmd's (ucm_events.h).
  memtype::Classifier::setBeforeHooks(ucm_events::installUcxHooksFirst);
  ucs_list_head_init(&g_component.tl_list);
  uct_tl_register(&g_component, rc::transport());
  uct_component_register(&g_component);
  // The second component of this module, gmd_copy (md/copy/copy_md.h), under the same check.
  copy::registerComponent();
}

}  // namespace

ucx::Component* component() noexcept { return &g_component; }

}  // namespace gmd::md
