// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on a device allocation (memtype/copier.h).
#include "memtype/copier.h"
#include "memtype/cuda_driver.h"

#if GMD_HAVE_CUDA
#include <cuda.h>
#endif

namespace gmd::memtype {

namespace {

constexpr int kAttrSyncMemops = 6;  // CU_POINTER_ATTRIBUTE_SYNC_MEMOPS

#if GMD_HAVE_CUDA
static_assert(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS == kAttrSyncMemops, "SYNC_MEMOPS mirrors cuda.h");
#endif

}  // namespace

// -1 also when the driver lacks cuPointerSetAttribute: to the caller both mean "not available".
int setSyncMemops(const void* ptr) noexcept {
  const detail::DriverApi* api = detail::driver();
  if (api == nullptr || api->pointerSetAttribute == nullptr) return -1;
  const unsigned int on = 1;  // the attribute's value is an unsigned int used as a boolean
  return api->pointerSetAttribute(&on, kAttrSyncMemops, reinterpret_cast<detail::CuDevicePtr>(ptr));
}

}  // namespace gmd::memtype
