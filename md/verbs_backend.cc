#include "md/verbs_backend.h"

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "md/mapping.h"

namespace gmd::md {
namespace {

void complete(uct_completion_t* comp, ucs_status_t status) {
  if (status != UCS_OK) comp->status = status;
  if (--comp->count == 0) comp->func(comp);
}

}  // namespace

ibv_mr* SystemVerbsOps::regMr(ibv_pd* pd, void* addr, std::size_t length, int access) noexcept {
  return ibv_reg_mr(pd, addr, length, access);
}

int SystemVerbsOps::deregMr(ibv_mr* mr) noexcept { return ibv_dereg_mr(mr); }

SystemVerbsOps& systemVerbsOps() noexcept {
  static SystemVerbsOps ops;
  return ops;
}

Result VerbsBackend::reg(std::uintptr_t start, std::size_t length, unsigned access,
                         MemoryKind /*memory*/, rcache::Registration* out) noexcept {
  if (length == 0 || out == nullptr || start + length < start ||
      (access & ~static_cast<unsigned>(rcache::kAccessAll)) != 0) {
    return Status::kInvalidParam;
  }
  errno = 0;
  ibv_mr* mr = ops_->regMr(pd_, reinterpret_cast<void*>(start), length, toVerbsAccess(access));
  if (mr == nullptr) return Result::fromErrno(errno != 0 ? errno : EIO);
  registrations_.fetch_add(1, std::memory_order_relaxed);
  out->handle = mr;
  out->lkey = mr->lkey;
  out->rkey = mr->rkey;
  return Status::kOk;
}

// A failed deregistration is a system failure the cache cannot act on: logged here, once.
void VerbsBackend::dereg(const rcache::Registration& reg) noexcept {
  auto* mr = static_cast<ibv_mr*>(reg.handle);
  if (mr == nullptr) return;
  if (const int err = ops_->deregMr(mr); err != 0) {
    log(LogLevel::kError, "md", "ibv_dereg_mr failed: %s", std::strerror(err));
  }
}

CompletingBackend::~CompletingBackend() {
  // Registrations still pending at MD close never get deregistered through us: fail their waiters.
  for (auto& [handle, comps] : pending_) {
    for (uct_completion_t* c : comps) complete(c, UCS_ERR_CANCELED);
  }
}

void CompletingBackend::dereg(const rcache::Registration& reg) noexcept {
  std::vector<uct_completion_t*> comps;
  {
    // Taken before the handle is freed: once ibv_dereg_mr returns, the same pointer may name a new
    // registration whose waiters must not be completed by us.
    std::lock_guard<std::mutex> g(lock_);
    if (auto it = pending_.find(reg.handle); it != pending_.end()) {
      comps.swap(it->second);
      pending_.erase(it);
    }
  }
  inner_->dereg(reg);
  for (uct_completion_t* c : comps) complete(c, UCS_OK);
}

bool CompletingBackend::addCompletion(const rcache::Registration& reg,
                                      uct_completion_t* comp) noexcept {
  try {
    std::lock_guard<std::mutex> g(lock_);
    pending_[reg.handle].push_back(comp);
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace gmd::md
