// Registration backends of a gmd MD: host pages through ibv_reg_mr, and a decorator that completes
// UCX invalidation requests once a registration is really gone.
#pragma once

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "rcache/rcache.h"

namespace gmd::md {

// Host memory through ibv_reg_mr on one protection domain.
// Thread safety: reg()/dereg() may run concurrently (rdma-core serialises per device as needed).
class VerbsBackend final : public rcache::Backend {
 public:
  explicit VerbsBackend(ibv_pd* pd) : pd_(pd) {}
  // Failures carry ibv_reg_mr's errno (common/status.h: statusFromErrno()).
  Result reg(std::uintptr_t start, std::size_t length, unsigned access, MemoryKind memory,
             rcache::Registration* out) noexcept override;
  void dereg(const rcache::Registration& reg) noexcept override;
  const char* name() const noexcept override { return "ibv_reg_mr"; }

 private:
  ibv_pd* pd_;
};

// Wraps a backend and calls UCX completions registered for a registration right after that
// registration has been deregistered (uct_md_mem_dereg with UCT_MD_MEM_DEREG_FLAG_INVALIDATE).
// Thread safety: all methods thread-safe; completions run on the deregistering thread, outside
// locks.
class CompletingBackend final : public rcache::Backend {
 public:
  explicit CompletingBackend(rcache::Backend* inner) : inner_(inner) {}
  ~CompletingBackend() override;
  Result reg(std::uintptr_t start, std::size_t length, unsigned access, MemoryKind memory,
             rcache::Registration* out) noexcept override {
    return inner_->reg(start, length, access, memory, out);
  }
  void dereg(const rcache::Registration& reg) noexcept override;
  const char* name() const noexcept override { return inner_->name(); }

  // The caller holds the region whose registration is `reg`, so it cannot be deregistered
  // before this returns. Returns false on allocation failure (the completion is not queued).
  bool addCompletion(const rcache::Registration& reg, uct_completion_t* comp) noexcept;
  rcache::Backend* inner() const noexcept { return inner_; }

 private:
  rcache::Backend* inner_;
  std::mutex lock_;  // guards pending_; never held while calling inner_ or a completion
  std::unordered_map<void*, std::vector<uct_completion_t*>> pending_;
};

}  // namespace gmd::md
