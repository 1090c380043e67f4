// gmd_rc's receive path: the iface's receive completion queue, which the passive QPs (those the
// listener accepts) use.
//
// Passive QPs are only targets of RDMA WRITE/READ so far: nothing is posted on them and this CQ sees
// no completions. It is its own object because it will grow into the active-message receive side
// (shared receive queue, buffer pool, handler dispatch).
//
// Thread safety: created and destroyed on the iface's thread; the listener thread only passes the CQ
// to ibv_create_qp (thread-safe).
#pragma once

#include <infiniband/verbs.h>
#include <ucs/type/status.h>

namespace gmd::md::rc {

class RecvPath {
 public:
  RecvPath() = default;
  ~RecvPath();
  RecvPath(const RecvPath&) = delete;
  RecvPath& operator=(const RecvPath&) = delete;

  // Creates the receive CQ on `ctx`; logs (error level) and returns UCS_ERR_NO_RESOURCE on failure.
  ucs_status_t init(ibv_context* ctx, const char* dev_name) noexcept;
  ibv_cq* cq() const noexcept { return cq_; }

 private:
  ibv_cq* cq_ = nullptr;
};

}  // namespace gmd::md::rc
