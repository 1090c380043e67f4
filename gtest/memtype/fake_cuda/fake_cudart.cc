// A stand-in for a dynamically linked CUDA runtime in gmd's unit tests: it calls the (fake) driver
// through its PLT, as libraries linked against libcuda do, and exports cudaFree/cudaFreeAsync so
// that the hooks on the runtime's entry points are exercised.
#include <cstddef>
#include <cstdint>

extern "C" {
int cuMemAlloc_v2(std::uint64_t* ptr, std::size_t size);
int cuMemFree_v2(std::uint64_t ptr);
int cuMemFreeAsync(std::uint64_t ptr, void* stream);

int cudaMalloc(void** ptr, std::size_t size) {
  std::uint64_t p = 0;
  const int r = cuMemAlloc_v2(&p, size);
  if (r == 0) *ptr = reinterpret_cast<void*>(p);
  return r;
}
int cudaFree(void* ptr) { return cuMemFree_v2(reinterpret_cast<std::uint64_t>(ptr)); }
int cudaFreeAsync(void* ptr, void* stream) {
  return cuMemFreeAsync(reinterpret_cast<std::uint64_t>(ptr), stream);
}
// A driver free made through this library's own GOT (the binding gmd patches at install).
int gmd_fake_cudart_driver_free(std::uint64_t ptr) { return cuMemFree_v2(ptr); }
}
