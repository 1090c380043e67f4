// The UCT component `gmd`: registered with libuct when this module is loaded, never unloaded.
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <ucs/debug/log_def.h>

#include <cstdlib>
#include <cstring>

#include "md/mapping.h"
#include "md/md.h"
#include "md/md_config.h"
#include "md/rc/rc_iface.h"
#include "md/ucx_abi.h"

namespace gmd::md {
namespace {

ucs_status_t queryMdResources(ucx::Component*, uct_md_resource_desc_t** resources_p,
                              unsigned* num_resources_p) {
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

ucs_status_t rkeyUnpack(ucx::Component*, const void* buffer, uct_rkey_t* rkey_p, void** handle_p) {
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

ucs_status_t rkeyPtr(ucx::Component*, uct_rkey_t, void*, uint64_t, void**) {
  return UCS_ERR_UNSUPPORTED;
}

ucs_status_t rkeyRelease(ucx::Component*, uct_rkey_t, void*) { return UCS_OK; }

void mdVfsInit(uct_md_h) {}

ucx::Component g_component = {
    .name = "gmd",
    .query_md_resources = queryMdResources,
    .md_open = mdOpen,
    .cm_open = cmOpen,
    .rkey_unpack = rkeyUnpack,
    .rkey_ptr = rkeyPtr,
    .rkey_release = rkeyRelease,
    .md_config = {.name = "gmd memory domain",
                  .prefix = kConfigPrefix,
                  .table = kMdConfigTable,
                  .size = sizeof(MdConfig),
                  .list = {}},
    .cm_config = {.name = "", .prefix = "", .table = nullptr, .size = 0, .list = {}},
    .tl_list = {},
    .list = {},
    .flags = 0,
    .md_vfs_init = mdVfsInit,
};

// The running libuct must have the ABI this module was built for. libuct has no version call, so
// its exports tell: uct_md_mkey_pack_v2 appeared in 1.13, uct_md_mem_reg_v2 in 1.14.
bool runningUctMatches(const char** why) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&uct_component_register), &info) == 0 ||
      info.dli_fname == nullptr) {
    *why = "cannot locate libuct";
    return false;
  }
  void* uct = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (uct == nullptr) {
    *why = "cannot inspect libuct";
    return false;
  }
  const bool has_13 = dlsym(uct, "uct_md_mkey_pack_v2") != nullptr;
  const bool has_14 = dlsym(uct, "uct_md_mem_reg_v2") != nullptr;
  dlclose(uct);
  if (!has_13) *why = "libuct is older than 1.13";
  if (has_14) *why = "libuct is 1.14 or newer";
  return has_13 && !has_14;
}

__attribute__((constructor)) void registerComponent() {
  const char* why = nullptr;
  if (!runningUctMatches(&why)) {
    ucs_warn("gmd: built for the UCX %u.%u component ABI but %s: component gmd not registered",
             ucx::kAbiMajor, ucx::kAbiMinor, why);
    return;
  }
  ucs_list_head_init(&g_component.tl_list);
  uct_tl_register(&g_component, rc::transport());
  uct_component_register(&g_component);
}

}  // namespace

ucx::Component* component() noexcept { return &g_component; }

}  // namespace gmd::md
