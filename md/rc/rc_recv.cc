#include "md/rc/rc_recv.h"

#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstring>

namespace gmd::md::rc {
namespace {

// Passive QPs post nothing yet: a small CQ is enough.
constexpr int kRecvCqLen = 16;

}  // namespace

ucs_status_t RecvPath::init(ibv_context* ctx, const char* dev_name) noexcept {
  cq_ = ibv_create_cq(ctx, kRecvCqLen, nullptr, nullptr, 0);
  if (cq_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_cq (receive): %s", dev_name, std::strerror(errno));
    return UCS_ERR_NO_RESOURCE;
  }
  return UCS_OK;
}

RecvPath::~RecvPath() {
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
}

}  // namespace gmd::md::rc
