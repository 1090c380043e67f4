#include "md/copy/copy_iface.h"

#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>

#include "md/abi/edge.h"

namespace gmd::md::copy {
namespace {

// UCX's own cuda_copy reports these; UCP weighs the copy lane with them.
constexpr double kLatency = 8e-6;                     // seconds
constexpr double kBandwidth = 10000.0 * 1024 * 1024;  // bytes per second
// put_short/get_short lengths are unsigned: any of them.
constexpr std::size_t kMaxShort = UINT32_MAX;

// Records `status` in `comp` and calls it when its count reaches zero.
void complete(uct_completion_t* comp, ucs_status_t status) noexcept {
  if (comp == nullptr) return;
  if (status != UCS_OK) comp->status = status;
  if (--comp->count == 0) comp->func(comp);
}

// A random id per iface; never 0 (an unset address reads as 0).
std::uint64_t randomId(const void* salt) noexcept {
  std::uint64_t id = 0;
  try {
    std::random_device rd;
    id = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {
  }
  id ^= reinterpret_cast<std::uintptr_t>(salt) * 0x9e3779b97f4a7c15ull;
  return id != 0 ? id : 1;
}

ucs_status_t stubAmHandler(void*, void*, size_t length, unsigned) noexcept {
  ucs_warn("gmd_copy: dropped an active message of %zu bytes: gmd_copy carries none", length);
  return UCS_OK;
}

}  // namespace

ucs_config_field_t kIfaceConfigTable[] = {
    {"", "", nullptr, offsetof(IfaceConfig, super), UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},
    {"MAX_OUTSTANDING", "256",
     "Zero-copy copies queued per gmd_copy iface; beyond that put/get_zcopy return\n"
     "UCS_ERR_NO_RESOURCE and the caller's pending requests wait for completions.",
     offsetof(IfaceConfig, max_outstanding), UCS_CONFIG_TYPE_UINT},
    {"PRINT_STATS", "n",
     "Print each gmd_copy iface's copy counters (bytes copied short and zero-copy, failures) to\n"
     "stderr when it closes.",
     offsetof(IfaceConfig, print_stats), UCS_CONFIG_TYPE_BOOL},
    {nullptr},
};

bool Ep::connectedTo(const uct_iface_addr_t* addr) const noexcept {
  if (addr == nullptr) return false;
  std::uint64_t id;
  std::memcpy(&id, addr, sizeof(id));
  return id == peer_id;
}

ucs_status_t Iface::open(uct_md_h md, uct_worker_h worker, const uct_iface_params_t* params,
                         const uct_iface_config_t* uct_config, uct_iface_h* iface_p) noexcept {
  if (params == nullptr || uct_config == nullptr || iface_p == nullptr) {
    return UCS_ERR_INVALID_PARAM;
  }
  if (!(params->field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE) ||
      !(params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE) ||
      params->mode.device.dev_name == nullptr) {
    ucs_error("gmd_copy: only device mode interfaces are supported");
    return UCS_ERR_UNSUPPORTED;
  }
  if (std::strcmp(params->mode.device.dev_name, kDeviceName) != 0) {
    ucs_error("gmd_copy: no device '%s' (gmd_copy has '%s')", params->mode.device.dev_name,
              kDeviceName);
    return UCS_ERR_NO_DEVICE;
  }
  const auto& config = *reinterpret_cast<const IfaceConfig*>(uct_config);
  if (config.max_outstanding == 0) {
    ucs_error("gmd_copy: UCX_GMD_COPY_MAX_OUTSTANDING=0: accepted: 1 or more");
    return UCS_ERR_INVALID_PARAM;
  }
  std::unique_ptr<Iface> iface(new (std::nothrow) Iface());
  if (!iface) return UCS_ERR_NO_MEMORY;
  iface->copier_ = memtype::Copier::create();
  if (!iface->copier_) {
    // The Copier said why (no device: debug; entry points missing: warn).
    ucs_debug("gmd_copy: no CUDA copy engine: iface not opened");
    return UCS_ERR_NO_DEVICE;
  }
  try {
    iface->eps_.reserve(4);
    iface->flush_comps_.reserve(4);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  iface->max_outstanding_ = config.max_outstanding;
  iface->print_stats_ = config.print_stats != 0;
  iface->id_ = randomId(iface.get());

  ucx::BaseIface& base = iface->handle_.base;
  iface->handle_.self = iface.get();
  base.super.ops = ifaceOps();
  base.internal_ops = ifaceInternalOps();
  base.md = md;
  base.worker = worker;
  base.prog.id = UCS_CALLBACKQ_ID_NULL;
  base.prog.refcount = 0;
  base.progress_flags = 0;
  if (params->field_mask & UCT_IFACE_PARAM_FIELD_ERR_HANDLER)
    base.err_handler = params->err_handler;
  if (params->field_mask & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG) {
    base.err_handler_arg = params->err_handler_arg;
  }
  if (params->field_mask & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS) {
    base.err_handler_flags = params->err_handler_flags;
  }
  base.config.num_alloc_methods = 0;
  for (unsigned i = 0; i < config.super.alloc_methods.count && i < UCT_ALLOC_METHOD_LAST; ++i) {
    base.config.alloc_methods[base.config.num_alloc_methods++] =
        config.super.alloc_methods.methods[i];
  }
  base.config.failure_level = static_cast<ucs_log_level_t>(config.super.failure);
  base.config.max_num_eps = config.super.max_num_eps;
  for (unsigned id = 0; id < UCT_AM_ID_MAX; ++id) base.am[id] = {stubAmHandler, nullptr, 0};

  ucs_debug("gmd_copy: iface %016llx opened, at most %u copies queued",
            static_cast<unsigned long long>(iface->id_), iface->max_outstanding_);
  *iface_p = iface.release()->handle();
  return UCS_OK;
}

Iface::~Iface() {
  if (handle_.base.worker != nullptr) {
    uct_base_iface_progress_disable(handle(), UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
  }
  closing_ = true;  // the drained copies' completions are not called: their owner is closing
  if (copier_) {
    if (copier_->outstanding() > 0) {
      ucs_debug("gmd_copy: iface %016llx closed with %zu copies queued: waiting for them",
                static_cast<unsigned long long>(id_), copier_->outstanding());
    }
    copier_->drain();
  }
  if (!pending_.empty()) {
    ucs_warn("gmd_copy: iface %016llx closed with %zu pending requests (not purged)",
             static_cast<unsigned long long>(id_), pending_.size());
  }
  for (Ep* ep : eps_) delete ep;
  ucs_debug("gmd_copy: iface %016llx closed: %llu bytes copied short, %llu zero-copy, %llu failed",
            static_cast<unsigned long long>(id_), static_cast<unsigned long long>(short_bytes_),
            static_cast<unsigned long long>(zcopy_bytes_),
            static_cast<unsigned long long>(failures_));
  if (print_stats_) {
    std::fprintf(stderr, "gmd_copy %016llx: short_bytes=%llu zcopy_bytes=%llu failures=%llu\n",
                 static_cast<unsigned long long>(id_), static_cast<unsigned long long>(short_bytes_),
                 static_cast<unsigned long long>(zcopy_bytes_),
                 static_cast<unsigned long long>(failures_));
  }
}

ucs_status_t Iface::query(uct_iface_attr_t* attr) noexcept {
  if (attr == nullptr) return UCS_ERR_INVALID_PARAM;
  std::memset(attr, 0, sizeof(*attr));
  attr->cap.put.max_short = kMaxShort;
  attr->cap.put.max_bcopy = 0;
  attr->cap.put.min_zcopy = 0;
  attr->cap.put.max_zcopy = SIZE_MAX;
  attr->cap.put.opt_zcopy_align = 1;
  attr->cap.put.align_mtu = 1;
  attr->cap.put.max_iov = 1;
  attr->cap.get.max_short = kMaxShort;
  attr->cap.get.max_bcopy = 0;
  attr->cap.get.min_zcopy = 0;
  attr->cap.get.max_zcopy = SIZE_MAX;
  attr->cap.get.opt_zcopy_align = 1;
  attr->cap.get.align_mtu = 1;
  attr->cap.get.max_iov = 1;
  attr->cap.am.opt_zcopy_align = 1;
  attr->cap.am.align_mtu = 1;
  attr->cap.flags = UCT_IFACE_FLAG_CONNECT_TO_IFACE | UCT_IFACE_FLAG_GET_SHORT |
                    UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_GET_ZCOPY | UCT_IFACE_FLAG_PUT_ZCOPY |
                    UCT_IFACE_FLAG_PENDING;
  attr->cap.event_flags = 0;  // no event fd: the Copier completes by polling
  attr->device_addr_len = 0;
  attr->iface_addr_len = sizeof(std::uint64_t);
  attr->ep_addr_len = 0;
  attr->max_conn_priv = 0;
  attr->latency.c = kLatency;
  attr->latency.m = 0;
  attr->overhead = 0;
  attr->bandwidth.dedicated = 0;
  attr->bandwidth.shared = kBandwidth;
  attr->priority = 0;
  attr->dev_num_paths = 1;
  attr->max_num_eps = handle_.base.config.max_num_eps;
  return UCS_OK;
}

ucs_status_t Iface::ifaceAddress(uct_iface_addr_t* addr) noexcept {
  if (addr == nullptr) return UCS_ERR_INVALID_PARAM;
  std::memcpy(addr, &id_, sizeof(id_));
  return UCS_OK;
}

bool Iface::isReachable(const uct_iface_addr_t* addr) const noexcept {
  if (addr == nullptr) return false;
  std::uint64_t id;
  std::memcpy(&id, addr, sizeof(id));
  return id == id_;
}

ucs_status_t Iface::createEp(const uct_ep_params_t* params, uct_ep_h* ep_p) noexcept {
  if (!(params->field_mask & UCT_EP_PARAM_FIELD_IFACE_ADDR) || params->iface_addr == nullptr) {
    ucs_debug("gmd_copy: endpoints connect to an iface: the iface address is required");
    return UCS_ERR_INVALID_PARAM;
  }
  if (!isReachable(params->iface_addr)) {
    ucs_debug("gmd_copy: iface %016llx reaches only itself", static_cast<unsigned long long>(id_));
    return UCS_ERR_UNREACHABLE;
  }
  auto* ep = new (std::nothrow) Ep{};
  if (ep == nullptr) return UCS_ERR_NO_MEMORY;
  ep->super.iface = handle();
  ep->iface = this;
  ep->peer_id = id_;
  try {
    eps_.push_back(ep);
  } catch (...) {
    delete ep;
    return UCS_ERR_NO_MEMORY;
  }
  *ep_p = ep->handle();
  return UCS_OK;
}

void Iface::destroyEp(Ep* ep) noexcept {
  // Requests the user left queued are dropped (UCT: purge before destroying).
  std::erase_if(pending_, [ep](const Pending& p) { return p.ep == ep; });
  std::erase(eps_, ep);
  delete ep;
}

ucs_status_t Iface::copyShort(void* dst, const void* src, std::size_t len,
                              const char* op) noexcept {
  if (len == 0) return UCS_OK;
  if (dst == nullptr || src == nullptr) {
    ucs_debug("gmd_copy: %s of %zu bytes from %p to %p: no address", op, len, src, dst);
    return UCS_ERR_INVALID_PARAM;
  }
  if (const int r = copier_->copy(dst, src, len); r != 0) {
    ++failures_;
    // The Copier logged the driver's failure (error level); this says which operation it failed.
    ucs_debug("gmd_copy: %s of %zu bytes from %p to %p: CUDA error %d", op, len, src, dst, r);
    return UCS_ERR_IO_ERROR;
  }
  short_bytes_ += len;
  return UCS_OK;
}

bool Iface::canQueue() const noexcept { return copier_->outstanding() < max_outstanding_; }

ucs_status_t Iface::copyZcopy(void* dst, const void* src, std::size_t len, uct_completion_t* comp,
                              const char* op) noexcept {
  if (len == 0) return UCS_OK;
  if (dst == nullptr || src == nullptr) {
    ucs_debug("gmd_copy: %s of %zu bytes from %p to %p: no address", op, len, src, dst);
    return UCS_ERR_INVALID_PARAM;
  }
  // Requests already waiting go first.
  if (!canQueue() || (!pending_.empty() && !dispatching_)) return UCS_ERR_NO_RESOURCE;
  auto* rec = new (std::nothrow) Op{this, comp};
  if (rec == nullptr) return UCS_ERR_NO_MEMORY;
  if (const int r = copier_->copyAsync(dst, src, len, copyDone, rec); r != 0) {
    delete rec;
    ++failures_;
    ucs_debug("gmd_copy: %s of %zu bytes from %p to %p: CUDA error %d", op, len, src, dst, r);
    return UCS_ERR_IO_ERROR;
  }
  zcopy_bytes_ += len;
  return UCS_INPROGRESS;
}

void Iface::copyDone(void* arg, int cu_result) noexcept {
  auto* rec = static_cast<Op*>(arg);
  Iface* self = rec->iface;
  ucs_status_t status = UCS_OK;
  if (cu_result != 0) {
    ++self->failures_;
    ucs_debug("gmd_copy: an asynchronous copy failed: CUDA error %d",
              cu_result);  // logged by the Copier
    status = UCS_ERR_IO_ERROR;
  }
  uct_completion_t* comp = rec->comp;
  delete rec;
  if (!self->closing_) complete(comp, status);
}

void Iface::completeFlushes() noexcept {
  if (flush_comps_.empty() || copier_->outstanding() > 0 || !pending_.empty()) return;
  std::vector<uct_completion_t*> done;
  done.swap(flush_comps_);
  for (uct_completion_t* comp : done) complete(comp, UCS_OK);
}

unsigned Iface::dispatchPending() noexcept {
  unsigned n = 0;
  // Each request gets at most one call per progress (one answering UCS_INPROGRESS stays first).
  for (std::size_t budget = pending_.size(); budget > 0 && !pending_.empty() && canQueue();
       --budget) {
    const Pending p = pending_.front();
    pending_.pop_front();
    dispatching_ = true;
    const ucs_status_t st = p.req->func(p.req);
    dispatching_ = false;
    if (st == UCS_OK) {
      ++n;
      continue;
    }
    // Still wanted (in progress or refused): back in front, unless its endpoint went meanwhile.
    if (std::find(eps_.begin(), eps_.end(), p.ep) != eps_.end()) {
      try {
        pending_.push_front(p);
      } catch (...) {
        ucs_error("gmd_copy: out of memory: a pending request is lost");
      }
    }
    if (st == UCS_INPROGRESS) ++n;
    break;
  }
  return n;
}

unsigned Iface::progress() noexcept {
  unsigned n = copier_->progress();
  n += dispatchPending();
  completeFlushes();
  return n;
}

ucs_status_t Iface::flush(Ep* ep, unsigned, uct_completion_t* comp) noexcept {
  if (ep != nullptr && std::any_of(pending_.begin(), pending_.end(),
                                   [ep](const Pending& p) { return p.ep == ep; })) {
    return UCS_ERR_NO_RESOURCE;  // UCT: flush behind the pending requests (add it to the queue)
  }
  if (copier_->outstanding() == 0 && pending_.empty()) return UCS_OK;
  if (comp != nullptr) {
    try {
      flush_comps_.push_back(comp);
    } catch (...) {
      return UCS_ERR_NO_MEMORY;
    }
  }
  return UCS_INPROGRESS;
}

ucs_status_t Iface::pendingAdd(Ep* ep, uct_pending_req_t* req) noexcept {
  if (req == nullptr) return UCS_ERR_INVALID_PARAM;
  if (pending_.empty() && canQueue()) return UCS_ERR_BUSY;  // UCT: it can go now
  try {
    pending_.push_back({ep, req});
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  return UCS_OK;
}

void Iface::pendingPurge(Ep* ep, uct_pending_purge_callback_t cb, void* arg) noexcept {
  std::deque<Pending> keep;
  std::vector<uct_pending_req_t*> purged;
  try {
    for (const Pending& p : pending_) {
      if (p.ep == ep) {
        purged.push_back(p.req);
      } else {
        keep.push_back(p);
      }
    }
  } catch (...) {
    ucs_error("gmd_copy: out of memory purging pending requests");
    return;
  }
  pending_.swap(keep);
  for (uct_pending_req_t* req : purged) {
    if (cb != nullptr) cb(req, arg);
  }
}

}  // namespace gmd::md::copy
