// The asynchronous events of one verbs device context (ibv_get_async_event), read for every user of
// the context at once.
//
// A device context has one async event queue, shared by everything created on it: every gmd_rc
// iface on one MD (UCP opens one per worker) drains passive QPs whose IBV_EVENT_QP_LAST_WQE_REACHED
// arrives on that queue, and whichever iface reads an event must not drop another iface's. So the
// MD owns the reader: poll() takes every pending event (without blocking; the fd is made
// non-blocking at creation) and keeps each LAST_WQE_REACHED by QP number until its owner takes it.
// Other events are logged at debug level.
//
// Thread safety: every method may be called from any thread (one mutex; poll() skips when another
// thread is polling, since that thread takes the same events).
#pragma once

#include <infiniband/verbs.h>
#include <ucs/type/status.h>

#include <cstdint>
#include <mutex>
#include <unordered_set>

namespace gmd::md {

class DeviceEvents {
 public:
  // Where the events come from: rdma-core's ibv_get_async_event / ibv_ack_async_event, or a test's.
  using Reader = int (*)(ibv_context*, ibv_async_event*);
  using Acker = void (*)(ibv_async_event*);

  DeviceEvents() = default;
  DeviceEvents(Reader read, Acker ack) noexcept : read_(read), ack_(ack) {}
  DeviceEvents(const DeviceEvents&) = delete;
  DeviceEvents& operator=(const DeviceEvents&) = delete;

  // Makes ctx's async event fd non-blocking. Logs and returns UCS_ERR_IO_ERROR when it cannot.
  ucs_status_t init(ibv_context* ctx, const char* dev_name) noexcept;
  // For a test's reader: no fd to set up.
  void initForTest(ibv_context* ctx) noexcept { ctx_ = ctx; }

  // Reads every pending event.
  void poll() noexcept;
  // True (once) when LAST_WQE_REACHED came for QP `qpn`; the event is forgotten then.
  bool takeLastWqe(std::uint32_t qpn) noexcept;
  // QP `qpn` is destroyed: an event kept for it is dropped (its number may be reused).
  void forget(std::uint32_t qpn) noexcept;

 private:
  Reader read_ = ibv_get_async_event;
  Acker ack_ = ibv_ack_async_event;
  ibv_context* ctx_ = nullptr;
  const char* name_ = "";
  std::mutex mu_;
  std::unordered_set<std::uint32_t> last_wqe_;  // guarded by mu_
};

}  // namespace gmd::md
