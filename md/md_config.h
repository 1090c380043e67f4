// UCX_GMD_* configuration of a gmd memory domain, parsed by UCX's own config parser.
//
// The table is registered through the component's md_config entry, so `ucx_info -c` lists every
// variable with its default and help, and uct_md_config_read() fills a MdConfig. Syntax errors are
// rejected by UCX's parser when the config is read; validate() rejects values that parse but make
// no sense (at MD open), naming the variable.
#pragma once

#include <ucs/config/types.h>
#include <ucs/type/status.h>

#include <cstddef>
#include <string>

#include "md/gpudirect.h"
#include "md/registrar.h"
#include "md/ucx_abi.h"
#include "memtype/memtype.h"
#include "rcache/rcache.h"

namespace gmd::md {

// The enum variables are stored as UCX's parser fills them in: the index of the value in its name
// table, which is the value of the enum it configures (defined once, where it is used):
//   CUDA_FREE_MODE  memtype::FreeMode    names memtype::kFreeModeNames
//   DMABUF          md::DmabufPolicy     names md::kDmabufPolicyNames
//   CUDA_MANAGED    md::ManagedPolicy    names md::kManagedPolicyNames
struct MdConfig {
  ucx::MdConfigBase super;
  unsigned long max_regions;   // RCACHE_MAX_REGIONS
  std::size_t max_size;        // RCACHE_MAX_SIZE (pinned bytes)
  std::size_t max_unused;      // RCACHE_MAX_UNUSED
  std::size_t alignment;       // RCACHE_ADDR_ALIGN
  unsigned event_prio;         // RCACHE_MEM_PRIO
  double overhead;             // RCACHE_OVERHEAD, seconds
  int purge_on_fork;           // RCACHE_PURGE_ON_FORK
  unsigned cuda_free_mode;     // CUDA_FREE_MODE (memtype::FreeMode)
  unsigned dmabuf;             // DMABUF (DmabufPolicy)
  unsigned cuda_managed;       // CUDA_MANAGED (ManagedPolicy)
  int print_stats;             // PRINT_STATS
  int cuda_events;             // CUDA_EVENTS
};

// The enum values of a validated config.
memtype::FreeMode freeMode(const MdConfig& config) noexcept;
DmabufPolicy dmabufPolicy(const MdConfig& config) noexcept;
ManagedPolicy managedPolicy(const MdConfig& config) noexcept;

// The table handed to UCX (prefix "GMD_": variables are UCX_GMD_<NAME>).
extern ucs_config_field_t kMdConfigTable[];
inline constexpr const char* kConfigPrefix = "GMD_";

// Checks values that parsed but make no sense (zero where meaningless, negative, "auto" where there
// is no automatic choice, beyond a limit). On failure returns UCS_ERR_INVALID_PARAM and puts one
// line into *error: the UCX_GMD_* variable, its value, and what is accepted.
ucs_status_t validate(const MdConfig& config, std::string* error);

// The cache limits the configuration asks for (validate() first).
rcache::Config cacheConfig(const MdConfig& config);
}  // namespace gmd::md
