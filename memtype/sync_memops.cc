// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on a device allocation (memtype/copier.h).
#include "memtype/copier.h"
#include "memtype/cuda_driver.h"

#if GMD_HAVE_CUDA
#include <cuda.h>
#endif

namespace gmd::memtype {

namespace {

constexpr int kAttrSyncMemops = 6;     // CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
constexpr int kAttrDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL

#if GMD_HAVE_CUDA
static_assert(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS == kAttrSyncMemops, "SYNC_MEMOPS mirrors cuda.h");
static_assert(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == kAttrDeviceOrdinal, "mirrors cuda.h");
#endif

}  // namespace

// -1 also when the driver lacks cuPointerSetAttribute: to the caller both mean "not available".
int setSyncMemops(const void* ptr) noexcept {
  const detail::DriverApi* api = detail::driver();
  if (api == nullptr || api->pointerSetAttribute == nullptr) return -1;
  const unsigned int on = 1;  // the attribute's value is an unsigned int used as a boolean
  const auto p = reinterpret_cast<detail::CuDevicePtr>(ptr);
  // Like a copy, it needs a context: on a thread without one, the pointer's device's primary context
  // is pushed for the call and popped after (the Copier's rule, memtype/copier.h).
  detail::CuContext cur = nullptr;
  detail::CuContext primary = nullptr;
  int ordinal = -1;
  int dev = 0;
  if (api->hasCopyApi() && api->ctxGetCurrent(&cur) == 0 && cur == nullptr &&
      api->pointerGetAttribute(&ordinal, kAttrDeviceOrdinal, p) == 0 && ordinal >= 0 &&
      api->deviceGet(&dev, ordinal) == 0 && api->devicePrimaryCtxRetain(&primary, dev) == 0) {
    detail::CuResult r = api->ctxPushCurrent(primary);
    if (r == 0) {
      r = api->pointerSetAttribute(&on, kAttrSyncMemops, p);
      detail::CuContext popped = nullptr;
      api->ctxPopCurrent(&popped);
    }
    api->devicePrimaryCtxRelease(dev);
    return r;
  }
  return api->pointerSetAttribute(&on, kAttrSyncMemops, p);
}

}  // namespace gmd::memtype
