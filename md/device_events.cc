#include "md/device_events.h"

#include <fcntl.h>
#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstring>

namespace gmd::md {

ucs_status_t DeviceEvents::init(ibv_context* ctx, const char* dev_name) noexcept {
  ctx_ = ctx;
  name_ = dev_name;
  const int fl = fcntl(ctx->async_fd, F_GETFL);
  if (fl < 0 || fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    ucs_error("gmd %s: cannot make the async event fd non-blocking: %s", dev_name,
              std::strerror(errno));
    return UCS_ERR_IO_ERROR;
  }
  return UCS_OK;
}

void DeviceEvents::poll() noexcept {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || ctx_ == nullptr) return;
  ibv_async_event ev;
  while (read_(ctx_, &ev) == 0) {
    if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED) {
      try {
        last_wqe_.insert(ev.element.qp->qp_num);
      } catch (...) {
        // Out of memory: the QP's owner destroys it after its drain timeout instead.
      }
    } else {
      ucs_debug("gmd %s: async event %s", name_, ibv_event_type_str(ev.event_type));
    }
    ack_(&ev);
  }
}

bool DeviceEvents::takeLastWqe(std::uint32_t qpn) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return last_wqe_.erase(qpn) != 0;
}

void DeviceEvents::forget(std::uint32_t qpn) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  last_wqe_.erase(qpn);
}

}  // namespace gmd::md
