// memtype/ classification cost against the loaded CUDA driver, for the GPU check (run-on-gpu prints
// these figures). The machine that check runs on has no Google Benchmark, so this is a small
// stand-alone harness: each case runs in timed batches for about 0.2 s, five times; it prints the
// median, min and max nanoseconds per call. bench/memtype_bench.cc holds the Google Benchmark
// versions (against the fake driver, beside UCX's memtype cache).
//
//   classify_host_nodriver   host pointer, the process answering as if it had no driver
//   classify_host_driver     host pointer with a driver loaded (one cuPointerGetAttributes)
//   driver_query_host        the cuPointerGetAttributes call classify() makes, on a host pointer
//   driver_query_device      the same on a device pointer
//   driver_buffer_id         cuPointerGetAttribute(BUFFER_ID): what validation adds per hit
//   classify_device_hooks    cached device pointer, FreeMode::kHooks (1 and 2 threads)
//   classify_device_both     cached device pointer, FreeMode::kHooksAndValidate
//
// Usage: gmd_cuda_classify_bench [seconds-per-repetition]. Exits 77 without a usable driver.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/cuda/driver_truth.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace {

using gmd::MemType;
using gmd::memtype::Classifier;
using gmd::memtype::FreeMode;
using gmd::memtype::cudacheck::truth;
using Clock = std::chrono::steady_clock;

double g_seconds = 0.2;
constexpr int kRepetitions = 5;

template <typename T>
inline void keep(const T& value) {
  asm volatile("" : : "g"(&value) : "memory");
}

// ns per call of fn over one repetition of about g_seconds.
template <typename Fn>
double repetition(Fn& fn) {
  std::uint64_t iters = 0;
  std::uint64_t batch = 64;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(g_seconds);
  Clock::time_point now;
  do {
    for (std::uint64_t i = 0; i < batch; ++i) fn();
    iters += batch;
    batch = std::min<std::uint64_t>(batch * 2, 1u << 20);
    now = Clock::now();
  } while (now < deadline);
  return std::chrono::duration<double, std::nano>(now - start).count() / static_cast<double>(iters);
}

// Runs fn on `threads` threads at once; each reports its own ns per call; the figure is their mean.
template <typename Fn>
void report(const char* name, Fn fn, int threads = 1) {
  std::array<double, kRepetitions> ns{};
  for (double& r : ns) {
    std::vector<double> per(threads);
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
      pool.emplace_back([&, t] {
        Fn copy = fn;
        per[t] = repetition(copy);
      });
    }
    Fn copy = fn;
    per[0] = repetition(copy);
    for (auto& th : pool) th.join();
    r = 0;
    for (double v : per) r += v / threads;
  }
  std::sort(ns.begin(), ns.end());
  std::printf("bench %-28s %9.1f ns/call  (min %.1f, max %.1f; %d x %.2g s%s)\n", name,
              ns[kRepetitions / 2], ns.front(), ns.back(), kRepetitions, g_seconds,
              threads > 1 ? ", per thread, 2 threads" : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_seconds = std::max(0.01, std::atof(argv[1]));
  auto& c = Classifier::instance();
  if (!c.cudaAvailable()) {
    std::printf("bench skipped: no CUDA driver or no GPU\n");
    return 77;
  }
  const gmd::memtype::detail::DriverApi* api = gmd::memtype::detail::driver();
  auto retain =
      reinterpret_cast<int (*)(void**, int)>(dlsym(api->handle, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<int (*)(void*)>(dlsym(api->handle, "cuCtxSetCurrent"));
  auto mem_alloc =
      reinterpret_cast<int (*)(std::uint64_t*, std::size_t)>(dlsym(api->handle, "cuMemAlloc_v2"));
  auto mem_free = reinterpret_cast<int (*)(std::uint64_t)>(dlsym(api->handle, "cuMemFree_v2"));
  void* ctx = nullptr;
  std::uint64_t dev = 0;
  if (retain == nullptr || set_current == nullptr || mem_alloc == nullptr || mem_free == nullptr ||
      retain(&ctx, 0) != 0 || set_current(ctx) != 0 || mem_alloc(&dev, 8 << 20) != 0) {
    std::printf("bench failed: could not allocate device memory\n");
    return 1;
  }
  std::printf("bench driver %s, version %d, %d device(s)\n", api->is_fake ? "fake" : "real",
              api->version, api->device_count);
  std::vector<char> host(4096);
  const void* hp = host.data();
  const void* dp = reinterpret_cast<const void*>(dev + 4096);
  if (c.classify(dp, 4096).type != MemType::kCuda) {
    std::printf("bench failed: device memory not classified as CUDA\n");
    return 1;
  }

  gmd::memtype::detail::simulateNoDriver(true);
  report("classify_host_nodriver", [&] { keep(c.classify(hp, 4096)); });
  gmd::memtype::detail::simulateNoDriver(false);
  report("classify_host_driver", [&] { keep(c.classify(hp, 4096)); });

  report("driver_query_host", [&] { keep(truth(reinterpret_cast<std::uintptr_t>(hp))); });
  report("driver_query_device", [&] { keep(truth(reinterpret_cast<std::uintptr_t>(dp))); });
  report("driver_buffer_id", [&] {
    unsigned long long id = 0;
    keep(api->pointerGetAttribute(&id, 7, reinterpret_cast<std::uint64_t>(dp)));
    keep(id);
  });

  c.setFreeMode(FreeMode::kHooks);
  report("classify_device_hooks", [&] { keep(c.classify(dp, 4096)); });
  report(
      "classify_device_hooks/2", [&] { keep(c.classify(dp, 4096)); }, 2);
  c.setFreeMode(FreeMode::kHooksAndValidate);
  report("classify_device_both", [&] { keep(c.classify(dp, 4096)); });
  c.setFreeMode(FreeMode::kHooks);

  const gmd::memtype::Stats s = c.stats();
  std::printf(
      "bench counters: %llu lookups, %llu cache hits, %llu driver queries, %llu hook slots\n",
      static_cast<unsigned long long>(s.lookups), static_cast<unsigned long long>(s.cache_hits),
      static_cast<unsigned long long>(s.driver_queries),
      static_cast<unsigned long long>(s.hook_slots));
  mem_free(dev);
  return 0;
}
