// Test helpers for gmd_copy: "device" memory of the fake CUDA driver (gtest/memtype/fake_cuda), and
// the driver's own copies to put bytes there and read them back. Under GMD_FAKE_CUDA_CPU_ACCESS=0
// the fake's device memory is PROT_NONE: the tests never touch it with the CPU, so a CPU access by
// UCX or gmd shows as a crash.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace gmd::test {

class FakeDevice {
 public:
  // Loads the driver named by GMD_CUDA_DRIVER_PATH (else libcuda.so.1). Empty string when all that
  // the tests need is there, else what is missing.
  std::string load() {
    const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
    handle_ = dlopen(path != nullptr && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW);
    if (handle_ == nullptr) return std::string("no CUDA driver: ") + dlerror();
    if (dlsym(handle_, "gmd_fake_cuda_driver") == nullptr) return "the driver is not gmd's fake";
    std::string missing;
    sym(init_, "cuInit", &missing);
    sym(alloc_, "cuMemAlloc_v2", &missing);
    sym(free_, "cuMemFree_v2", &missing);
    sym(htod_, "cuMemcpyHtoD_v2", &missing);
    sym(dtoh_, "cuMemcpyDtoH_v2", &missing);
    sym(get_, "gmd_fake_cuda_get", &missing);
    sym(set_, "gmd_fake_cuda_set", &missing);
    if (!missing.empty()) return "the fake driver lacks" + missing;
    init_(0);
    return {};
  }

  // A device allocation of len bytes (0 on failure). The entry points are looked up anew each time:
  // a pointer taken before gmd hooked the driver would bypass the hooks (and gmd's CUDA memory
  // events), which a real program calling through its symbol table does not.
  std::uint64_t alloc(std::size_t len) {
    sym(alloc_, "cuMemAlloc_v2", nullptr);
    std::uint64_t p = 0;
    return alloc_(&p, len) == 0 ? p : 0;
  }
  void free(std::uint64_t p) {
    sym(free_, "cuMemFree_v2", nullptr);
    free_(p);
  }
  // The driver's copies (CUresult, 0 on success).
  int toDevice(std::uint64_t dst, const void* src, std::size_t len) { return htod_(dst, src, len); }
  int toHost(void* dst, std::uint64_t src, std::size_t len) { return dtoh_(dst, src, len); }
  std::vector<std::uint8_t> read(std::uint64_t src, std::size_t len) {
    std::vector<std::uint8_t> v(len);
    if (len > 0 && toHost(v.data(), src, len) != 0) v.clear();
    return v;
  }
  // The fake's counters and controls (gmd_fake_cuda_get).
  long counter(const char* key) { return get_(key); }
  void set(const char* key, long value) { set_(key, value); }

 private:
  template <typename F>
  void sym(F& f, const char* name, std::string* missing) {
    F found = reinterpret_cast<F>(dlsym(handle_, name));
    if (found != nullptr || missing != nullptr) f = found;
    if (found == nullptr && missing != nullptr) *missing += std::string(" ") + name;
  }

  void* handle_ = nullptr;
  int (*init_)(unsigned) = nullptr;
  int (*alloc_)(std::uint64_t*, std::size_t) = nullptr;
  int (*free_)(std::uint64_t) = nullptr;
  int (*htod_)(std::uint64_t, const void*, std::size_t) = nullptr;
  int (*dtoh_)(void*, std::uint64_t, std::size_t) = nullptr;
  long (*get_)(const char*) = nullptr;
  void (*set_)(const char*, long) = nullptr;
};

// A recognisable byte pattern, different per seed.
inline std::vector<std::uint8_t> pattern(std::size_t len, unsigned seed) {
  std::vector<std::uint8_t> v(len);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::uint8_t>(x >> 24);
  }
  return v;
}

}  // namespace gmd::test
