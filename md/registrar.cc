#include "md/registrar.h"

#include <ucs/debug/log_def.h>

#include <cstdint>
#include <cstring>

#include "md/mapping.h"

namespace gmd::md {

const char* kManagedPolicyNames[] = {"refuse", "host-pages", nullptr};
static_assert(static_cast<unsigned>(ManagedPolicy::kRefuse) == 0 &&
                  static_cast<unsigned>(ManagedPolicy::kHostPages) == 1,
              "ManagedPolicy values index kManagedPolicyNames");

struct Registrar::Lookup {
  Registrar* self;
  memtype::Info info{};
  bool classified = false;
  bool no_backend = false;
};

Registrar::Registrar(std::string md_name, std::unique_ptr<rcache::Cache> cache,
                     rcache::Backend* host, rcache::Backend* cuda, ClassifyFn classify)
    : name_(std::move(md_name)),
      cache_(std::move(cache)),
      host_(std::make_unique<CompletingBackend>(host)),
      cuda_(cuda != nullptr ? std::make_unique<CompletingBackend>(cuda) : nullptr),
      classify_(classify) {}

Registrar::~Registrar() {
  // Deregister everything the cache still holds before the backends' wrappers go away.
  cache_.reset();
}

ucs_status_t Registrar::reg(void* address, std::size_t length, unsigned flags,
                            uct_mem_h* memh_p) noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  if (address == nullptr || length == 0 || start + length < start) {
    ucs_debug("gmd %s: mem_reg(address=%p length=%zu): invalid range", name_.c_str(), address,
              length);
    return UCS_ERR_INVALID_PARAM;
  }
  if ((flags & ~kKnownMemFlags) != 0 || (flags & UCT_MD_MEM_ACCESS_ALL) == 0) {
    ucs_debug("gmd %s: mem_reg(address=%p length=%zu): invalid flags 0x%x", name_.c_str(), address,
              length, flags);
    return UCS_ERR_INVALID_PARAM;
  }

  // The cache classifies only on a miss (through resolve()): a hit needs no classification, as the
  // region already says what the memory is, and frees and unmaps remove regions before their range
  // can change type. Device hits are re-checked when CUDA frees are validated by buffer ID rather
  // than (only) hooked.
  const unsigned access = toCacheAccess(flags);
  Lookup lookup{this};
  const rcache::Resolver resolver(&Registrar::resolve, &lookup);
  rcache::Region* region = nullptr;
  Result st = cache_->get(address, length, access, resolver, &region);
  if (st.ok() && !lookup.classified && validate_device_hits_ &&
      region->memType() != MemType::kHost) {
    // The buffer-ID check: classification drops a stale range (and its regions, through the CUDA
    // free subscribers), so the second lookup either hits a region that is still right or misses
    // and registers with this classification.
    cache_->put(region);
    region = nullptr;
    lookup.info = classify_(address, length);
    lookup.classified = true;
    st = cache_->get(address, length, access, resolver, &region);
  }
  if (!st.ok()) {
    if (lookup.no_backend || st.status == Status::kInvalidParam) {
      // The caller's mistake: memory of a type this MD does not advertise, or a request the cache
      // refused as malformed.
      ucs_debug(
          "gmd %s: mem_reg(address=%p length=%zu %s): %s", name_.c_str(), address, length,
          memTypeName(lookup.info.type),
          lookup.no_backend ? "memory cannot be registered here" : rcache::statusString(st.status));
    } else {
      const ucs_log_level_t level =
          (flags & UCT_MD_MEM_FLAG_HIDE_ERRORS) ? UCS_LOG_LEVEL_DIAG : UCS_LOG_LEVEL_ERROR;
      ucs_log(level, "gmd %s: mem_reg(address=%p length=%zu %s): %s%s%s", name_.c_str(), address,
              length, memTypeName(lookup.info.type), rcache::statusString(st.status),
              st.error != 0 ? ": " : "", st.error != 0 ? std::strerror(st.error) : "");
    }
    return toUcsStatus(st.status);
  }
  *memh_p = region;
  return UCS_OK;
}

rcache::Backend* Registrar::backendFor(MemType type) const noexcept {
  switch (type) {
    case MemType::kHost:
      return host_.get();
    case MemType::kCuda:
      return cuda_.get();
    case MemType::kCudaManaged:
      // Managed pages migrate between host and device under the registration's feet: refused by
      // default, so UCX stages them through registered host buffers; under host-pages registered
      // as host memory (docs/memtype.md, "Managed memory").
      return managed_ == ManagedPolicy::kHostPages ? host_.get() : nullptr;
  }
  return nullptr;
}

rcache::Resolution Registrar::resolve(void* ctx, const void* address, std::size_t length) noexcept {
  auto* lookup = static_cast<Lookup*>(ctx);
  if (!lookup->classified) {
    lookup->info = lookup->self->classify_(address, length);
    lookup->classified = true;
  }
  rcache::Resolution r;
  r.memory = MemoryKind(lookup->info.type, lookup->info.device);
  r.backend = lookup->self->backendFor(lookup->info.type);
  if (r.backend == nullptr) {
    lookup->no_backend = true;
    r.result = Status::kUnsupported;
  }
  return r;
}

ucs_status_t Registrar::dereg(const ucx::DeregParams* params) noexcept {
  if (params == nullptr || !(params->field_mask & ucx::kDeregFieldMemh) ||
      params->memh == nullptr) {
    ucs_debug("gmd %s: mem_dereg without a memory handle", name_.c_str());
    return UCS_ERR_INVALID_PARAM;
  }
  auto* region = static_cast<rcache::Region*>(params->memh);
  const unsigned flags = (params->field_mask & ucx::kDeregFieldFlags) ? params->flags : 0u;
  if ((flags & ~ucx::kDeregFlagInvalidate) != 0) {
    ucs_debug("gmd %s: mem_dereg: unknown flags 0x%x", name_.c_str(), flags);
    return UCS_ERR_INVALID_PARAM;
  }
  if (flags & ucx::kDeregFlagInvalidate) {
    uct_completion_t* comp =
        (params->field_mask & ucx::kDeregFieldCompletion) ? params->comp : nullptr;
    if (comp == nullptr) {
      ucs_debug("gmd %s: mem_dereg(INVALIDATE) without a completion", name_.c_str());
      return UCS_ERR_INVALID_PARAM;
    }
    auto* backend = static_cast<CompletingBackend*>(region->backend());
    if (!backend->addCompletion(region->registration(), comp)) {
      ucs_error("gmd %s: mem_dereg(INVALIDATE): no memory to queue the completion", name_.c_str());
      return UCS_ERR_NO_MEMORY;
    }
    // Every region over this range leaves the cache: no later lookup hands out this rkey again.
    cache_->invalidate(reinterpret_cast<const void*>(region->start()), region->length());
  }
  cache_->put(region);
  return UCS_OK;
}

std::string Registrar::statsLine() const {
  const rcache::Stats s = cache_->stats();
  return "gmd " + name_ + ": reg_hits=" + std::to_string(s.hits) +
         " reg_misses=" + std::to_string(s.misses) + " merges=" + std::to_string(s.merges) +
         " evictions=" + std::to_string(s.evictions) +
         " invalidations=" + std::to_string(s.invalidations_in_use + s.invalidations_unused) +
         " regions=" + std::to_string(s.regions) +
         " pinned_bytes=" + std::to_string(s.pinned_bytes);
}

}  // namespace gmd::md
