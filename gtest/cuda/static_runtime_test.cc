// A program linked with the static CUDA runtime (libcudart_static.a; label cuda): the runtime has
// no exported cudaFree for gmd to redirect and reaches the driver only through pointers it got from
// cuGetProcAddress (after gmd: through gmd's wrapper). gmd must still see every free before the
// address can be reused. Skips on the fake driver (see runtime_fixture.h).
#include "gtest/cuda/runtime_fixture.h"

namespace gmd::memtype::cudacheck {
namespace {

class StaticRuntime : public RuntimeFixture {};

TEST_F(StaticRuntime, CudaFreeIsSeenBeforeTheAddressIsReused) { checkCudaFree(); }

TEST_F(StaticRuntime, CudaFreeOfManagedMemoryIsSeenBeforeTheAddressIsReused) { checkManaged(); }

TEST_F(StaticRuntime, CudaFreeAsyncAndSyncIsSeenBeforeTheAddressIsReused) { checkCudaFreeAsync(); }

// The static runtime's allocations reach the driver through cuGetProcAddress'd pointers only.
TEST_F(StaticRuntime, EveryAllocationIsOneEvent) { checkAllocationEvents(); }

}  // namespace
}  // namespace gmd::memtype::cudacheck
