// A stand-in for a dynamically linked CUDA runtime in gmd's unit tests: it calls the (fake) driver
// through its PLT, as libraries linked against libcuda do, and exports the runtime's allocation and
// free entry points, so that the hooks on them (and the one-report-per-call rule when the runtime's
// wrapper reaches the driver's) are exercised.
//
// The fake driver has no memory pools: cudaMallocFromPoolAsync ignores its pool and calls
// cuMemAllocAsync.
#include <cstddef>
#include <cstdint>

extern "C" {
int cuMemAlloc_v2(std::uint64_t* ptr, std::size_t size);
int cuMemAllocManaged(std::uint64_t* ptr, std::size_t size, unsigned flags);
int cuMemAllocPitch_v2(std::uint64_t* ptr, std::size_t* pitch, std::size_t width,
                       std::size_t height, unsigned element);
int cuMemAllocAsync(std::uint64_t* ptr, std::size_t size, void* stream);
int cuMemFree_v2(std::uint64_t ptr);
int cuMemFreeAsync(std::uint64_t ptr, void* stream);

namespace {
// The result of an allocation call that stored into p: *ptr set on success only.
int out(void** ptr, int r, const std::uint64_t& p) {
  if (r == 0) *ptr = reinterpret_cast<void*>(p);
  return r;
}
}  // namespace

int cudaMalloc(void** ptr, std::size_t size) {
  std::uint64_t p = 0;
  return out(ptr, cuMemAlloc_v2(&p, size), p);
}
int cudaMallocManaged(void** ptr, std::size_t size, unsigned flags) {
  std::uint64_t p = 0;
  return out(ptr, cuMemAllocManaged(&p, size, flags), p);
}
int cudaMallocPitch(void** ptr, std::size_t* pitch, std::size_t width, std::size_t height) {
  std::uint64_t p = 0;
  return out(ptr, cuMemAllocPitch_v2(&p, pitch, width, height, 4), p);
}
int cudaMallocAsync(void** ptr, std::size_t size, void* stream) {
  std::uint64_t p = 0;
  return out(ptr, cuMemAllocAsync(&p, size, stream), p);
}
int cudaMallocFromPoolAsync(void** ptr, std::size_t size, void* /*pool*/, void* stream) {
  std::uint64_t p = 0;
  return out(ptr, cuMemAllocAsync(&p, size, stream), p);
}
int cudaFree(void* ptr) { return cuMemFree_v2(reinterpret_cast<std::uint64_t>(ptr)); }
int cudaFreeAsync(void* ptr, void* stream) {
  return cuMemFreeAsync(reinterpret_cast<std::uint64_t>(ptr), stream);
}
// A driver free made through this library's own GOT (the binding gmd patches at install).
int gmd_fake_cudart_driver_free(std::uint64_t ptr) { return cuMemFree_v2(ptr); }
}
