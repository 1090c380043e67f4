// gmd_copy: a UCT transport that copies between host and CUDA memory of this process through
// memtype's Copier, the memory-type copy lane UCP builds from an MD that can access CUDA memory
// (md/copy/copy_md.h; docs/gpu.md).
//
// One device, "cuda" (UCT_DEVICE_TYPE_ACC). The iface address is a random 64-bit id and an iface
// reaches only itself: UCP connects a worker's memory-type endpoint to its own address. put_short /
// get_short copy synchronously (Copier::copy); put_zcopy / get_zcopy queue the copy
// (Copier::copyAsync) and return UCS_INPROGRESS, their completions called from the iface's
// progress. At most UCX_GMD_COPY_MAX_OUTSTANDING copies are queued per iface: beyond that zcopy
// returns UCS_ERR_NO_RESOURCE and the pending queue (served in progress, oldest first) takes over.
// Remote keys are ignored: the "remote" address is an address of this process.
//
// Files: copy_md.* (component and MD), copy_iface.* (this: config, iface, endpoints),
// copy_transport.cc (the UCX ops tables).
//
// Thread safety: an iface and its endpoints are used by one thread at a time (UCT's contract).
#pragma once

#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "md/ucx_abi.h"
#include "memtype/copier.h"

namespace gmd::md::copy {

inline constexpr const char* kTransportName = "gmd_copy";
inline constexpr const char* kDeviceName = "cuda";
inline constexpr const char* kConfigPrefix = "GMD_COPY_";

// UCX_GMD_COPY_* (uct_iface_config_table's fields first).
struct IfaceConfig {
  ucx::IfaceConfigBase super;
  unsigned max_outstanding;  // MAX_OUTSTANDING: queued zcopy copies per iface
  int print_stats;           // PRINT_STATS: the iface's copy counters on stderr when it closes
};
extern ucs_config_field_t kIfaceConfigTable[];

class Iface;

// An endpoint: to its own iface (the only one it reaches).
struct Ep {
  uct_ep_t super;  // first: libuct reads the iface pointer
  Iface* iface;
  std::uint64_t peer_id;

  static Ep* from(uct_ep_h ep) noexcept { return reinterpret_cast<Ep*>(ep); }
  uct_ep_h handle() noexcept { return &super; }
  bool connectedTo(const uct_iface_addr_t* addr) const noexcept;
};

class Iface {
 public:
  static ucs_status_t open(uct_md_h md, uct_worker_h worker, const uct_iface_params_t* params,
                           const uct_iface_config_t* config, uct_iface_h* iface_p) noexcept;
  ~Iface();
  static Iface* from(uct_iface_h iface) noexcept { return reinterpret_cast<Handle*>(iface)->self; }
  uct_iface_h handle() noexcept { return &handle_.base.super; }

  ucs_status_t query(uct_iface_attr_t* attr) noexcept;
  ucs_status_t ifaceAddress(uct_iface_addr_t* addr) noexcept;
  bool isReachable(const uct_iface_addr_t* addr) const noexcept;
  ucs_status_t createEp(const uct_ep_params_t* params, uct_ep_h* ep_p) noexcept;
  void destroyEp(Ep* ep) noexcept;
  unsigned progress() noexcept;
  ucs_status_t flush(Ep* ep, unsigned flags, uct_completion_t* comp) noexcept;

  // The endpoint operations. `op` names the operation in log lines.
  ucs_status_t copyShort(void* dst, const void* src, std::size_t len, const char* op) noexcept;
  ucs_status_t copyZcopy(void* dst, const void* src, std::size_t len, uct_completion_t* comp,
                         const char* op) noexcept;
  ucs_status_t pendingAdd(Ep* ep, uct_pending_req_t* req) noexcept;
  void pendingPurge(Ep* ep, uct_pending_purge_callback_t cb, void* arg) noexcept;

  std::uint64_t id() const noexcept { return id_; }

 private:
  struct Handle {
    ucx::BaseIface base;  // first: libuct reads it
    Iface* self;
  };
  struct Op {
    Iface* iface;
    uct_completion_t* comp;
  };
  struct Pending {
    Ep* ep;
    uct_pending_req_t* req;
  };

  Iface() = default;
  static void copyDone(void* arg, int cu_result) noexcept;
  bool canQueue() const noexcept;
  unsigned dispatchPending() noexcept;
  void completeFlushes() noexcept;

  Handle handle_{};
  std::unique_ptr<memtype::Copier> copier_;
  std::uint64_t id_ = 0;
  unsigned max_outstanding_ = 0;
  bool closing_ = false;
  bool dispatching_ = false;  // inside a pending request's callback
  std::vector<Ep*> eps_;
  std::deque<Pending> pending_;                 // oldest first
  std::vector<uct_completion_t*> flush_comps_;  // iface and ep flushes waiting for the copies
  // Totals for the debug line at close.
  std::uint64_t short_bytes_ = 0;
  std::uint64_t zcopy_bytes_ = 0;
  std::uint64_t failures_ = 0;
  bool print_stats_ = false;
};

// The transport descriptor registered into component gmd_copy (md/copy/copy_md.cc), and its iface
// operations (md/copy/copy_transport.cc).
ucx::Transport* transport() noexcept;
const uct_iface_ops_t& ifaceOps() noexcept;

}  // namespace gmd::md::copy
