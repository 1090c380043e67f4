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

#include "md/ucx_abi.h"
#include "rcache/rcache.h"

namespace gmd::md {

// How CUDA frees reach the cache (UCX_GMD_CUDA_FREE_MODE).
enum CudaFreeMode : unsigned {
  kCudaFreeHooks = 0,
  kCudaFreeValidate = 1,
  kCudaFreeBoth = 2,
  kCudaFreeOff = 3,
};
// The names UCX's parser accepts, indexed by the enums above (for passing on to memtype/).
extern const char* kCudaFreeModeNames[];
extern const char* kDmabufNames[];
// GPUDirect through dma-buf (UCX_GMD_DMABUF).
enum DmabufMode : unsigned { kDmabufTry = 0, kDmabufOn = 1, kDmabufOff = 2 };

struct MdConfig {
  ucx::MdConfigBase super;
  unsigned long max_regions;   // RCACHE_MAX_REGIONS
  std::size_t max_size;        // RCACHE_MAX_SIZE (pinned bytes)
  std::size_t max_unused;      // RCACHE_MAX_UNUSED
  std::size_t alignment;       // RCACHE_ADDR_ALIGN
  unsigned event_prio;         // RCACHE_MEM_PRIO
  double overhead;             // RCACHE_OVERHEAD, seconds
  int purge_on_fork;           // RCACHE_PURGE_ON_FORK
  unsigned cuda_free_mode;     // CUDA_FREE_MODE
  unsigned dmabuf;             // DMABUF
  int print_stats;             // PRINT_STATS
};

// The table handed to UCX (prefix "GMD_": variables are UCX_GMD_<NAME>).
extern ucs_config_field_t kMdConfigTable[];
inline constexpr const char* kConfigPrefix = "GMD_";

// Checks values that parsed but are out of range. On failure returns UCS_ERR_INVALID_PARAM and puts a
// message naming the UCX_GMD_* variable into *error.
ucs_status_t validate(const MdConfig& config, std::string* error);

// The cache limits the configuration asks for (validate() first).
rcache::Config cacheConfig(const MdConfig& config);


}  // namespace gmd::md
