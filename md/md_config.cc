#include "md/md_config.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include <ucs/sys/string.h>

namespace gmd::md {
namespace {


constexpr std::size_t kMaxAlignment = 1ul << 30;

}  // namespace

const char* kCudaFreeModeNames[] = {"hooks", "validate", "both", "off", nullptr};
const char* kDmabufNames[] = {"try", "on", "off", nullptr};

ucs_config_field_t kMdConfigTable[] = {
    {"RCACHE_MAX_REGIONS", "inf",
     "Maximal number of registrations the cache keeps at once (cached or in use).",
     offsetof(MdConfig, max_regions), UCS_CONFIG_TYPE_ULUNITS},
    {"RCACHE_MAX_SIZE", "inf",
     "Maximal total size of registered (pinned) memory, in use or cached.",
     offsetof(MdConfig, max_size), UCS_CONFIG_TYPE_MEMUNITS},
    {"RCACHE_MAX_UNUSED", "512M",
     "Maximal total size of registrations that nobody uses but the cache keeps for reuse;\n"
     "the least recently used are deregistered beyond it.",
     offsetof(MdConfig, max_unused), UCS_CONFIG_TYPE_MEMUNITS},
    {"RCACHE_ADDR_ALIGN", "4096",
     "Registrations are aligned outwards to this many bytes: a power of two, at least the\n"
     "system page size.",
     offsetof(MdConfig, alignment), UCS_CONFIG_TYPE_MEMUNITS},
    {"RCACHE_MEM_PRIO", "1000",
     "Priority of the cache's memory-unmap event handler in libucm (lower runs earlier).",
     offsetof(MdConfig, event_prio), UCS_CONFIG_TYPE_UINT},
    {"RCACHE_OVERHEAD", "50ns",
     "Cost of a registration-cache hit, reported to UCX as the fixed part of the registration\n"
     "cost (docs/rcache.md has measured figures).",
     offsetof(MdConfig, overhead), UCS_CONFIG_TYPE_TIME},
    {"RCACHE_PURGE_ON_FORK", "y",
     "A forked child drops the parent's cached registrations instead of using them.",
     offsetof(MdConfig, purge_on_fork), UCS_CONFIG_TYPE_BOOL},
    {"CUDA_FREE_MODE", "hooks",
     "How the cache learns that CUDA memory was freed:\n"
     " hooks    - intercept the CUDA driver's free entry points (default)\n"
     " validate - compare the allocation's buffer ID on every cache hit\n"
     " both     - hooks, and the buffer-ID check as well (for programs that took the driver's\n"
     "            free entry points before gmd was loaded)\n"
     " off      - neither (unsafe: a freed and reallocated buffer may hit a stale entry)",
     offsetof(MdConfig, cuda_free_mode), UCS_CONFIG_TYPE_ENUM(kCudaFreeModeNames)},
    {"DMABUF", "try",
     "Register CUDA memory through dma-buf:\n"
     " try - dma-buf when the driver and device support it, else peer memory\n"
     " on  - dma-buf only (CUDA registration fails without it)\n"
     " off - peer memory only",
     offsetof(MdConfig, dmabuf), UCS_CONFIG_TYPE_ENUM(kDmabufNames)},
    {"PRINT_STATS", "n",
     "Print the cache counters of each memory domain to stderr when it closes.",
     offsetof(MdConfig, print_stats), UCS_CONFIG_TYPE_BOOL},
    {nullptr},
};

ucs_status_t validate(const MdConfig& config, std::string* error) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t align = config.alignment;
  if (align < page || align > kMaxAlignment || (align & (align - 1)) != 0) {
    *error = "UCX_GMD_RCACHE_ADDR_ALIGN=" + std::to_string(align) +
             ": must be a power of two between the page size (" + std::to_string(page) +
             ") and 1G";
    return UCS_ERR_INVALID_PARAM;
  }
  if (config.max_regions == 0) {
    *error = "UCX_GMD_RCACHE_MAX_REGIONS=0: must be at least 1 (or inf)";
    return UCS_ERR_INVALID_PARAM;
  }
  if (config.max_size != SIZE_MAX && config.max_size < align) {
    *error = "UCX_GMD_RCACHE_MAX_SIZE=" + std::to_string(config.max_size) +
             ": smaller than one aligned registration (" + std::to_string(align) + " bytes)";
    return UCS_ERR_INVALID_PARAM;
  }
  if (config.cuda_free_mode > kCudaFreeOff) {
    *error = "UCX_GMD_CUDA_FREE_MODE: unknown mode";
    return UCS_ERR_INVALID_PARAM;
  }
  if (!(config.overhead >= 0 && config.overhead < 1)) {
    *error = "UCX_GMD_RCACHE_OVERHEAD: must be between 0 and 1 s";
    return UCS_ERR_INVALID_PARAM;
  }
  if (config.dmabuf > kDmabufOff) {
    *error = "UCX_GMD_DMABUF: unknown mode";
    return UCS_ERR_INVALID_PARAM;
  }
  return UCS_OK;
}

rcache::Config cacheConfig(const MdConfig& config) {
  rcache::Config c;
  c.alignment = config.alignment;
  c.max_regions = config.max_regions == UCS_ULUNITS_INF ? SIZE_MAX : config.max_regions;
  c.max_pinned_bytes = config.max_size == UCS_MEMUNITS_INF ? SIZE_MAX : config.max_size;
  c.max_unused_bytes = config.max_unused == UCS_MEMUNITS_INF ? SIZE_MAX : config.max_unused;
  c.purge_on_fork = config.purge_on_fork != 0;
  return c;
}

}  // namespace gmd::md
