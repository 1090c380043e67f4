// memtype/ classification cost.
//
//   MemtypeHost_nocuda         classify a host pointer in a process without a CUDA driver
//   MemtypeDevice_gmd          classify a cached device pointer (fake driver), hooks mode
//   MemtypeDevice_gmd_validate the same with FreeMode::kValidate (one buffer-ID query per hit)
//   MemtypeHost_gmd_cuda       classify a host pointer with a driver loaded (one driver query)
//   MemtypeDevice_ucs          ucs_memtype_cache_lookup of the same device range, same run
//
// The device benchmarks need the fake CUDA driver built with the tests. gmd_bench looks for it at
// ../gtest/memtype/fake_cuda/libcuda.so.1 next to its own folder unless GMD_CUDA_DRIVER_PATH is set;
// with a real driver they are skipped (allocating needs a context this benchmark does not create).
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/ucs_compat.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace {

using gmd::memtype::Classifier;
using gmd::memtype::FreeMode;
using gmd::MemType;

// Points GMD_CUDA_DRIVER_PATH at the fake driver of this build tree before anything loads a driver.
struct UseFakeDriver {
  UseFakeDriver() {
    if (std::getenv("GMD_CUDA_DRIVER_PATH") != nullptr) return;
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));  // .../bench
    const std::string fake = dir.substr(0, dir.rfind('/')) + "/gtest/memtype/fake_cuda/libcuda.so.1";
    if (access(fake.c_str(), R_OK) == 0) setenv("GMD_CUDA_DRIVER_PATH", fake.c_str(), 0);
  }
} g_use_fake_driver;

// One device allocation from the fake driver, made once.
std::uintptr_t fakeDeviceBuffer(std::size_t size) {
  static std::uintptr_t ptr = [size]() -> std::uintptr_t {
    const gmd::memtype::detail::DriverApi* api = gmd::memtype::detail::driver();
    if (api == nullptr || !api->is_fake) return 0;
    auto alloc = reinterpret_cast<int (*)(std::uint64_t*, std::size_t)>(
        dlsym(api->handle, "cuMemAlloc_v2"));
    std::uint64_t p = 0;
    return alloc != nullptr && alloc(&p, size) == 0 ? p : 0;
  }();
  return ptr;
}

constexpr std::size_t kDeviceBytes = 8 << 20;

void MemtypeHost_nocuda(benchmark::State& state) {
  gmd::memtype::detail::simulateNoDriver(true);
  std::vector<char> buf(4096);
  auto& c = Classifier::instance();
  for (auto _ : state) {
    auto info = c.classify(buf.data(), buf.size());
    benchmark::DoNotOptimize(info);
  }
  gmd::memtype::detail::simulateNoDriver(false);
}
BENCHMARK(MemtypeHost_nocuda);

void deviceBench(benchmark::State& state, FreeMode mode) {
  auto& c = Classifier::instance();
  const std::uintptr_t p = fakeDeviceBuffer(kDeviceBytes);
  if (!c.cudaAvailable() || p == 0) {
    state.SkipWithError("needs the fake CUDA driver (see the comment at the top)");
    return;
  }
  c.setFreeMode(mode);
  const auto* ptr = reinterpret_cast<const char*>(p) + 4096;
  if (c.classify(ptr, 4096).type != MemType::kCuda) {
    state.SkipWithError("device pointer not classified as CUDA");
    return;
  }
  for (auto _ : state) {
    auto info = c.classify(ptr, 4096);
    benchmark::DoNotOptimize(info);
  }
  c.setFreeMode(FreeMode::kHooks);
}

void MemtypeDevice_gmd(benchmark::State& state) { deviceBench(state, FreeMode::kHooks); }
BENCHMARK(MemtypeDevice_gmd)->ThreadRange(1, 2);

void MemtypeDevice_gmd_validate(benchmark::State& state) { deviceBench(state, FreeMode::kValidate); }
BENCHMARK(MemtypeDevice_gmd_validate);

void MemtypeHost_gmd_cuda(benchmark::State& state) {
  auto& c = Classifier::instance();
  if (!c.cudaAvailable()) {
    state.SkipWithError("needs a CUDA driver (the fake one will do)");
    return;
  }
  std::vector<char> buf(4096);
  for (auto _ : state) {
    auto info = c.classify(buf.data(), buf.size());
    benchmark::DoNotOptimize(info);
  }
}
BENCHMARK(MemtypeHost_gmd_cuda);

// UCX 1.13 creates its global memtype cache only when libucm delivers memory-type events, which
// needs UCX's CUDA module (Debian's build has none). The cache's layout is public (a rwlock and a
// page table), so the benchmark builds one itself and installs it as the global instance; lookup
// and update then run UCX's own code on it.
ucs_pgt_dir_t* ucsDirAlloc(const ucs_pgtable_t*) {
  return static_cast<ucs_pgt_dir_t*>(
      std::aligned_alloc(UCS_PGT_ENTRY_MIN_ALIGN,
                         (sizeof(ucs_pgt_dir_t) + UCS_PGT_ENTRY_MIN_ALIGN - 1) &
                             ~std::size_t{UCS_PGT_ENTRY_MIN_ALIGN - 1}));
}
void ucsDirRelease(const ucs_pgtable_t*, ucs_pgt_dir_t* dir) { std::free(dir); }

bool installUcsCache() {
  static ucs_memtype_cache_t cache;
  if (!gmd::bench::ucsMemtypeCacheLockInit(cache)) return false;
  if (ucs_pgtable_init(&cache.pgtable, ucsDirAlloc, ucsDirRelease) != UCS_OK) return false;
  ucs_memtype_cache_global_instance = &cache;
  // libucs's destructor would free the global instance: hand it back empty before that.
  std::atexit([] { ucs_memtype_cache_global_instance = nullptr; });
  return true;
}

void MemtypeDevice_ucs(benchmark::State& state) {
  const std::uintptr_t p = fakeDeviceBuffer(kDeviceBytes);
  if (p == 0) {
    state.SkipWithError("needs the fake CUDA driver (see the comment at the top)");
    return;
  }
  if (ucs_memtype_cache_global_instance == nullptr) ucs_memtype_cache_global_init();
  if (ucs_memtype_cache_global_instance == nullptr && !installUcsCache()) {
    state.SkipWithError("could not create a UCX memtype cache");
    return;
  }
  const auto* base = reinterpret_cast<const void*>(p);
  gmd::bench::ucsMemtypeCacheUpdate(base, kDeviceBytes, UCS_MEMORY_TYPE_CUDA);
  const auto* ptr = reinterpret_cast<const char*>(p) + 4096;
  ucs_memory_info_t info;
  if (ucs_memtype_cache_lookup(ptr, 4096, &info) != UCS_OK || info.type != UCS_MEMORY_TYPE_CUDA) {
    state.SkipWithError("ucs_memtype_cache_lookup did not find the range");
    return;
  }
  for (auto _ : state) {
    ucs_status_t s = ucs_memtype_cache_lookup(ptr, 4096, &info);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(info);
  }
}
BENCHMARK(MemtypeDevice_ucs)->ThreadRange(1, 2);

}  // namespace
