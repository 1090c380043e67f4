// Registration backends of a gmd MD for host pages: the one ibv_reg_mr path (with its verbs calls
// behind a seam for tests), and a decorator that completes UCX invalidation requests once a
// registration is really gone. Device memory goes through md/gpudirect.h, which shares the seam.
#pragma once

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "rcache/rcache.h"

namespace gmd::md {

// The verbs calls a registration makes, injectable for tests. A failing regMr() sets errno.
// Thread safety: implementations must allow concurrent calls (libibverbs does).
class VerbsOps {
 public:
  virtual ~VerbsOps() = default;
  virtual ibv_mr* regMr(ibv_pd* pd, void* addr, std::size_t length, int access) noexcept = 0;
  virtual int deregMr(ibv_mr* mr) noexcept = 0;  // 0 or an errno value
};

// libibverbs itself.
class SystemVerbsOps : public VerbsOps {
 public:
  ibv_mr* regMr(ibv_pd* pd, void* addr, std::size_t length, int access) noexcept override;
  int deregMr(ibv_mr* mr) noexcept override;
};
SystemVerbsOps& systemVerbsOps() noexcept;

// Host pages through ibv_reg_mr on one protection domain; also CUDA managed memory when the MD's
// UCX_GMD_CUDA_MANAGED=host-pages (its virtual range, pinned on the host). Access rights go
// through toVerbsAccess() (md/mapping.h), errno through statusFromErrno() (common/status.h); a
// failure returns its errno and logs nothing (the registrar reports it once).
// Thread safety: reg()/dereg() may run concurrently.
class VerbsBackend final : public rcache::Backend {
 public:
  // `pd` is borrowed; `ops` (borrowed) defaults to libibverbs.
  explicit VerbsBackend(ibv_pd* pd, VerbsOps* ops = nullptr) noexcept
      : pd_(pd), ops_(ops != nullptr ? ops : &systemVerbsOps()) {}
  Result reg(std::uintptr_t start, std::size_t length, unsigned access, MemoryKind memory,
             rcache::Registration* out) noexcept override;
  void dereg(const rcache::Registration& reg) noexcept override;
  const char* name() const noexcept override { return "ibv_reg_mr"; }
  // Successful registrations so far.
  std::uint64_t registrations() const noexcept {
    return registrations_.load(std::memory_order_relaxed);
  }

 private:
  ibv_pd* pd_;
  VerbsOps* ops_;
  std::atomic<std::uint64_t> registrations_{0};
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
