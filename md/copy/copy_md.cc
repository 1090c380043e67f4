#include "md/copy/copy_md.h"

#include <ucs/debug/log_def.h>
#include <ucs/type/cpu_set.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "md/abi/edge.h"
#include "md/copy/copy_iface.h"
#include "md/mapping.h"
#include "md/md.h"
#include "md/ucs_topology.h"
#include "memtype/memtype.h"

namespace gmd::md::copy {
namespace {

constexpr std::uint64_t kDeviceTypes =
    UCS_BIT(UCS_MEMORY_TYPE_CUDA) | UCS_BIT(UCS_MEMORY_TYPE_CUDA_MANAGED);

// Whether access_mem_types says host too (see mdQuery).
constexpr bool kAccessHost = ucx::kAbiMinor >= 19;

// The memory handle of every registration: nothing is registered, but UCX wants a handle.
char g_memh_token;
// The one remote key (nothing to pack, nothing to look up).
constexpr uct_rkey_t kRkey = 0;

// --- The MD operations (md/abi/edge_md.cc adapts them to the generation's table) ---

void mdClose(uct_md_h md) { delete reinterpret_cast<CopyMd*>(md); }

ucs_status_t mdQuery(uct_md_h, uct_md_attr_t* attr) {
  std::memset(attr, 0, sizeof(*attr));
  // REG only: no handle, no remote key needed, so UCP does not register for the copy lane.
  attr->cap.flags = UCT_MD_FLAG_REG;
  attr->cap.max_alloc = 0;
  attr->cap.max_reg = SIZE_MAX;
  // HOST too: UCP's memory-type endpoint needs its host side registrable as well.
  attr->cap.reg_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST) | kDeviceTypes;
  attr->cap.detect_mem_types = kDeviceTypes;
  attr->cap.alloc_mem_types = 0;
  // From 1.19 UCP builds a memory-type endpoint only from transports that access host memory as
  // well (its host pass looks at access_mem_types); UCX's own cuda_copy says host there from 1.19
  // (found with the pip builds of 1.19-1.21: without it UCP 1.19 has no memory-type copy lane).
  attr->cap.access_mem_types = kDeviceTypes | (kAccessHost ? UCS_BIT(UCS_MEMORY_TYPE_HOST) : 0);
  attr->reg_cost.c = 0;
  attr->reg_cost.m = 0;
  std::strncpy(attr->component_name, kComponentName, sizeof(attr->component_name) - 1);
  attr->rkey_packed_size = 0;
  for (unsigned c = 0; c < UCS_CPU_SETSIZE; ++c) UCS_CPU_SET(c, &attr->local_cpus);
  return UCS_OK;
}

ucs_status_t mdMemReg(uct_md_h, void* address, size_t length, unsigned, uct_mem_h* memh_p) {
  if (memh_p == nullptr || (address == nullptr && length != 0)) {
    ucs_debug("gmd_copy: mem_reg(%p, %zu) without an address or a handle pointer", address, length);
    return UCS_ERR_INVALID_PARAM;
  }
  *memh_p = &g_memh_token;
  return UCS_OK;
}

ucs_status_t mdMemDereg(uct_md_h, const ucx::DeregParams* params) {
  if (params == nullptr) return UCS_ERR_INVALID_PARAM;
  if ((params->field_mask & ucx::kDeregFieldFlags) && (params->flags & ucx::kDeregFlagInvalidate)) {
    // Not advertised (UCT_MD_FLAG_INVALIDATE): nothing is registered, nothing to revoke.
    ucs_debug("gmd_copy: mem_dereg with INVALIDATE, which this MD does not offer");
    return UCS_ERR_UNSUPPORTED;
  }
  return UCS_OK;
}

ucs_status_t mdMemQuery(uct_md_h, const void* address, size_t length, uct_md_mem_attr_t* attr) {
  if (attr == nullptr) return UCS_ERR_INVALID_PARAM;
  const memtype::Info info = memtype::Classifier::instance().classify(address, length);
  const bool device = info.type != MemType::kHost && info.size != 0;
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_MEM_TYPE) attr->mem_type = toUcsMemType(info.type);
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_SYS_DEV) {
    attr->sys_dev = info.type == MemType::kCuda ? sysDevices().cudaDevice(info.device)
                                                : UCS_SYS_DEVICE_ID_UNKNOWN;
  }
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS) {
    attr->base_address = device ? reinterpret_cast<void*>(info.base) : const_cast<void*>(address);
  }
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH) {
    attr->alloc_length = device ? info.size : length;
  }
  return UCS_OK;
}

ucs_status_t mdMkeyPack(uct_md_h, uct_mem_h, void*) {
  return UCS_OK;  // rkey_packed_size is 0
}

ucs_status_t mdDetectMemoryType(uct_md_h, const void* address, size_t length,
                                ucs_memory_type_t* mem_type_p) {
  if (mem_type_p == nullptr) return UCS_ERR_INVALID_PARAM;
  *mem_type_p = toUcsMemType(memtype::Classifier::instance().classify(address, length).type);
  return UCS_OK;
}

// mem_query's mem_flags (UCX 1.22 on): device memory registers (with a GPUDirect-capable MD),
// as UCX's own cuda_copy says of ordinary device allocations.
std::uint8_t mdMemFlags(uct_md_h, ucs_memory_type_t type) { return memFlags(kDeviceTypes, type); }

// --- The component ---

ucs_status_t queryMdResources(ucx::Component*, uct_md_resource_desc_t** resources_p,
                              unsigned* num_resources_p) noexcept {
  if (!memtype::Classifier::instance().cudaAvailable()) {
    ucs_debug("gmd_copy: no CUDA driver with a device: no memory domain");
    *resources_p = nullptr;
    *num_resources_p = 0;
    return UCS_OK;
  }
  // libuct releases this array with free().
  auto* res = static_cast<uct_md_resource_desc_t*>(std::calloc(1, sizeof(uct_md_resource_desc_t)));
  if (res == nullptr) return UCS_ERR_NO_MEMORY;
  std::strncpy(res->md_name, kMdName, sizeof(res->md_name) - 1);
  *resources_p = res;
  *num_resources_p = 1;
  return UCS_OK;
}

ucs_status_t mdOpen(ucx::Component* component, const char* md_name, const uct_md_config_t*,
                    uct_md_h* md_p) noexcept {
  if (md_name == nullptr || md_p == nullptr || std::strcmp(md_name, kMdName) != 0) {
    ucs_error("gmd_copy: no memory domain '%s' (this component has %s)",
              md_name != nullptr ? md_name : "(null)", kMdName);
    return UCS_ERR_NO_DEVICE;
  }
  useUcxLogger();
  if (!memtype::Classifier::instance().cudaAvailable()) {
    ucs_debug("gmd_copy: no CUDA driver with a device");
    return UCS_ERR_NO_DEVICE;
  }
  auto* md = new (std::nothrow) CopyMd{};
  if (md == nullptr) return UCS_ERR_NO_MEMORY;
  md->header.ops = mdOps();
  md->header.component = component;
  *md_p = reinterpret_cast<uct_md_h>(md);
  return UCS_OK;
}

ucs_status_t cmOpen(ucx::Component*, uct_worker_h, const uct_cm_config_t*, uct_cm_h*) noexcept {
  return UCS_ERR_UNSUPPORTED;
}

// rkey_unpack without (up to 1.18) and with (1.19 on) parameters; the slot's type picks one. Keys
// are empty: every copy addresses memory of this process.
[[maybe_unused]] ucs_status_t rkeyUnpack(ucx::Component*, const void*, uct_rkey_t* rkey_p,
                                         void** handle_p) noexcept {
  if (rkey_p == nullptr || handle_p == nullptr) return UCS_ERR_INVALID_PARAM;
  *rkey_p = kRkey;
  *handle_p = nullptr;
  return UCS_OK;
}
template <typename Params>
ucs_status_t rkeyUnpack(ucx::Component* c, const void* buffer, const Params*, uct_rkey_t* rkey_p,
                        void** handle_p) noexcept {
  return rkeyUnpack(c, buffer, rkey_p, handle_p);
}

template <typename Params>
ucs_status_t rkeyCompare(ucx::Component*, uct_rkey_t rkey1, uct_rkey_t rkey2, const Params*,
                         int* result) noexcept {
  if (result == nullptr) return UCS_ERR_INVALID_PARAM;
  *result = (rkey1 > rkey2) - (rkey1 < rkey2);
  return UCS_OK;
}

ucs_status_t rkeyPtr(ucx::Component*, uct_rkey_t, void*, uint64_t, void**) noexcept {
  return UCS_ERR_UNSUPPORTED;
}

ucs_status_t rkeyRelease(ucx::Component*, uct_rkey_t, void*) noexcept { return UCS_OK; }

void mdVfsInit(uct_md_h) noexcept {}

ucs_config_field_t kMdConfigTable[] = {
    {nullptr},
};

template <typename C>
constexpr C makeComponent() {
  C c{};
  for (std::size_t i = 0; kComponentName[i] != '\0' && i + 1 < sizeof(c.name); ++i) {
    c.name[i] = kComponentName[i];
  }
  c.query_md_resources = queryMdResources;
  c.md_open = mdOpen;
  c.cm_open = cmOpen;
  c.rkey_unpack = rkeyUnpack;
  c.rkey_ptr = rkeyPtr;
  c.rkey_release = rkeyRelease;
  if constexpr (requires { c.rkey_compare; }) c.rkey_compare = rkeyCompare;
  c.md_config.name = "gmd_copy memory domain";
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

}  // namespace

const MdImpl& mdImpl() noexcept {
  static const MdImpl impl = {
      .close = mdClose,
      .query = mdQuery,
      .mem_reg = mdMemReg,
      .mem_dereg = mdMemDereg,
      .mem_query = mdMemQuery,
      .mkey_pack = mdMkeyPack,
      .detect_memory_type = mdDetectMemoryType,
      .mem_flags = mdMemFlags,
  };
  return impl;
}

ucx::Component* component() noexcept { return &g_component; }

void registerComponent() noexcept {
  ucs_list_head_init(&g_component.tl_list);
  uct_tl_register(&g_component, transport());
  uct_component_register(&g_component);
}

}  // namespace gmd::md::copy
