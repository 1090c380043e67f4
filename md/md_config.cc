#include "md/md_config.h"

#include <ucs/sys/string.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>

namespace gmd::md {
namespace {

constexpr std::size_t kMaxAlignment = std::size_t{1} << 30;
constexpr unsigned long kMaxRegions = 1ul << 40;                    // what the cache accepts
constexpr std::size_t kMaxBytes = rcache::kMaxRequestLength;        // 2^57: any address space
constexpr unsigned kMaxEventPrio = static_cast<unsigned>(INT_MAX);  // libucm takes an int

// How a MEMUNITS / ULUNITS value reads back in a message.
std::string units(std::size_t v) {
  if (v == UCS_MEMUNITS_INF) return "inf";
  if (v == UCS_MEMUNITS_AUTO) return "auto";
  return std::to_string(v);
}

ucs_status_t refuse(std::string* error, const char* name, const std::string& value,
                    const std::string& accepted) {
  *error = std::string("UCX_GMD_") + name + "=" + value + ": accepted: " + accepted;
  return UCS_ERR_INVALID_PARAM;
}

template <typename Enum>
std::size_t count(const char* const* names) {
  std::size_t n = 0;
  while (names[n] != nullptr) ++n;
  return n;
}

}  // namespace

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
     offsetof(MdConfig, cuda_free_mode), UCS_CONFIG_TYPE_ENUM(memtype::kFreeModeNames)},
    {"DMABUF", "try",
     "Register CUDA memory through dma-buf:\n"
     " try - dma-buf when the driver and device support it, else peer memory\n"
     " on  - dma-buf only (CUDA registration fails without it)\n"
     " off - peer memory only",
     offsetof(MdConfig, dmabuf), UCS_CONFIG_TYPE_ENUM(kDmabufPolicyNames)},
    {"CUDA_MANAGED", "refuse",
     "What to do with CUDA managed (unified) memory:\n"
     " refuse     - registration fails (UCS_ERR_UNSUPPORTED) and cuda-managed stays out of the\n"
     "              MD's registrable memory types, so UCX stages it through host buffers "
     "(default)\n"
     " host-pages - register its virtual range like host memory (ibv_reg_mr pins the pages on the\n"
     "              host; GPU access then migrates them back on every touch: see docs/memtype.md)",
     offsetof(MdConfig, cuda_managed), UCS_CONFIG_TYPE_ENUM(kManagedPolicyNames)},
    {"PRINT_STATS", "n", "Print the cache counters of each memory domain to stderr when it closes.",
     offsetof(MdConfig, print_stats), UCS_CONFIG_TYPE_BOOL},
    {"CUDA_EVENTS", "y",
     "Raise libucm's memory-type events for CUDA allocations and frees, so that UCX's memory-type\n"
     "cache knows device memory and UCP's registration cache drops registrations of freed device\n"
     "memory. Process-wide, decided when UCX first queries the gmd component; gmd raises nothing\n"
     "where UCX has CUDA support of its own (libucm_cuda or libuct_cuda loaded).",
     offsetof(MdConfig, cuda_events), UCS_CONFIG_TYPE_BOOL},
    {nullptr},
};

ucs_status_t validate(const MdConfig& config, std::string* error) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t align = config.alignment;
  if (align < page || align > kMaxAlignment || (align & (align - 1)) != 0) {
    return refuse(error, "RCACHE_ADDR_ALIGN", units(align),
                  "a power of two from the page size (" + std::to_string(page) + ") to 1G");
  }
  if (config.max_regions == 0 || config.max_regions == UCS_ULUNITS_AUTO ||
      (config.max_regions != UCS_ULUNITS_INF && config.max_regions > kMaxRegions)) {
    return refuse(error, "RCACHE_MAX_REGIONS", units(config.max_regions),
                  "1 to " + std::to_string(kMaxRegions) + ", or inf");
  }
  if (config.max_size != UCS_MEMUNITS_INF &&
      (config.max_size < align || config.max_size > kMaxBytes)) {
    return refuse(error, "RCACHE_MAX_SIZE", units(config.max_size),
                  "from one aligned registration (UCX_GMD_RCACHE_ADDR_ALIGN, " +
                      std::to_string(align) + " bytes) to " + std::to_string(kMaxBytes) +
                      ", or inf");
  }
  if (config.max_unused != UCS_MEMUNITS_INF && config.max_unused > kMaxBytes) {
    return refuse(error, "RCACHE_MAX_UNUSED", units(config.max_unused),
                  "0 to " + std::to_string(kMaxBytes) + ", or inf");
  }
  if (config.event_prio > kMaxEventPrio) {
    return refuse(error, "RCACHE_MEM_PRIO", std::to_string(config.event_prio),
                  "0 to " + std::to_string(kMaxEventPrio));
  }
  if (!(config.overhead >= 0 && config.overhead < 1)) {
    return refuse(error, "RCACHE_OVERHEAD", std::to_string(config.overhead) + "s",
                  "a time from 0 to less than 1s");
  }
  if (config.cuda_free_mode >= count<memtype::FreeMode>(memtype::kFreeModeNames)) {
    return refuse(error, "CUDA_FREE_MODE", std::to_string(config.cuda_free_mode),
                  "hooks, validate, both or off");
  }
  if (config.dmabuf >= count<DmabufPolicy>(kDmabufPolicyNames)) {
    return refuse(error, "DMABUF", std::to_string(config.dmabuf), "try, on or off");
  }
  if (config.cuda_managed >= count<ManagedPolicy>(kManagedPolicyNames)) {
    return refuse(error, "CUDA_MANAGED", std::to_string(config.cuda_managed),
                  "refuse or host-pages");
  }
  return UCS_OK;
}

memtype::FreeMode freeMode(const MdConfig& config) noexcept {
  return static_cast<memtype::FreeMode>(config.cuda_free_mode);
}
DmabufPolicy dmabufPolicy(const MdConfig& config) noexcept {
  return static_cast<DmabufPolicy>(config.dmabuf);
}
ManagedPolicy managedPolicy(const MdConfig& config) noexcept {
  return static_cast<ManagedPolicy>(config.cuda_managed);
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
