#include "md/verbs_backend.h"

#include <cerrno>

#include "md/mapping.h"

namespace gmd::md {
namespace {

void complete(uct_completion_t* comp, ucs_status_t status) {
  if (status != UCS_OK) comp->status = status;
  if (--comp->count == 0) comp->func(comp);
}

}  // namespace

Result VerbsBackend::reg(std::uintptr_t start, std::size_t length, unsigned access,
                         MemoryKind /*memory*/, rcache::Registration* out) noexcept {
  ibv_mr* mr = ibv_reg_mr(pd_, reinterpret_cast<void*>(start), length, toVerbsAccess(access));
  if (mr == nullptr) return Result::fromErrno(errno);
  out->handle = mr;
  out->lkey = mr->lkey;
  out->rkey = mr->rkey;
  return rcache::Status::kOk;
}

void VerbsBackend::dereg(const rcache::Registration& reg) noexcept {
  ibv_dereg_mr(static_cast<ibv_mr*>(reg.handle));
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
