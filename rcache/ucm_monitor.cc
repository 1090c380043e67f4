#include "rcache/ucm_monitor.h"

#include <ucm/api/ucm.h>

namespace gmd::rcache {
namespace {

// Runs inside the unmapping call: only forwards the range (InvalidationSink::invalidate is
// hook-safe).
void onVmUnmapped(ucm_event_type_t type, ucm_event_t* event, void* arg) {
  if (type != UCM_EVENT_VM_UNMAPPED || event == nullptr) return;
  static_cast<InvalidationSink*>(arg)->invalidate(event->vm_unmapped.address,
                                                  event->vm_unmapped.size);
}

}  // namespace

Status UcmMonitor::subscribe(InvalidationSink* sink) noexcept {
  if (sink == nullptr) return Status::kInvalidParam;
  const ucs_status_t st =
      ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, priority_, onVmUnmapped, sink);
  return st == UCS_OK ? Status::kOk : Status::kUnsupported;
}

void UcmMonitor::unsubscribe(InvalidationSink* sink) noexcept {
  if (sink == nullptr) return;
  ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, onVmUnmapped, sink);
}

}  // namespace gmd::rcache
