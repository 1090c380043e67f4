// With UCX's own CUDA memory hooks loaded (libucm_cuda, which patches the driver's allocation and
// free entry points in place; the fake's can be patched, fake_cuda.cc) and gmd loaded into UCX as
// its plugin, a libucm memory-type handler sees each allocation and each free of (fake) device
// memory exactly once: UCX raises them, gmd stands down (md/ucm_events.cc: it raises nothing where
// libucm_cuda is loaded). Through dlsym, through cuGetProcAddress (how a static cudart reaches the
// driver), stream-ordered, managed, and VMM mappings.
//
// Both orders of loading: libucm's handler set first, then gmd (UcxCudaEventsTest); and gmd first,
// its CUDA hooks installed as UCX lists its MDs, before anything asked libucm for memory-type
// events (UcxCudaEventsGmdFirstTest), as when UCP opens gmd's MDs before it creates its memory-type
// cache. Then gmd has libucm install its hooks before its own (md/ucm_events.h,
// installUcxHooksFirst), and the driver's symbols lead through gmd's wrappers into libucm's.
//
// Skipped where the running UCX has no libucm_cuda (a UCX built without CUDA, or UCX_MODULES
// leaving it out). The fake driver (gtest/memtype/fake_cuda/) is libcuda.so.1 on LD_LIBRARY_PATH,
// with the fake NVML beside it (UCX's libuct_cuda needs one to load).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>
#include <ucm/api/ucm.h>
#include <uct/api/uct.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "gtest/common/load_gmd.h"

namespace {

constexpr std::size_t kSize = 1 << 20;

// The memory-type events a libucm handler saw for one address (handlers must not allocate: fixed
// storage, plain counters; the events come on the calling thread).
struct Seen {
  std::uint64_t address = 0;
  int allocs = 0;
  int frees = 0;
  std::size_t free_size = 0;
  ucs_memory_type_t free_type = UCS_MEMORY_TYPE_UNKNOWN;
};
Seen g_seen;
void onEvent(ucm_event_type_t type, ucm_event_t* event, void*) {
  if (reinterpret_cast<std::uint64_t>(event->mem_type.address) != g_seen.address) return;
  if (type == UCM_EVENT_MEM_TYPE_ALLOC) ++g_seen.allocs;
  if (type == UCM_EVENT_MEM_TYPE_FREE) {
    ++g_seen.frees;
    g_seen.free_size = event->mem_type.size;
    g_seen.free_type = event->mem_type.mem_type;
  }
}

int findUcmCuda(dl_phdr_info* info, std::size_t, void* found) {
  if (info->dlpi_name == nullptr) return 0;
  std::string_view name(info->dlpi_name);
  if (const auto slash = name.rfind('/'); slash != std::string_view::npos) {
    name.remove_prefix(slash + 1);
  }
  if (name.starts_with("libucm_cuda.so")) {
    *static_cast<std::string*>(found) = info->dlpi_name;
    return 1;
  }
  return 0;
}

// Loads the plugin and has UCX list its MDs (gtest/common/load_gmd.h).
void loadGmd() { gmd::test::loadGmdComponent(GMD_PLUGIN_PATH); }

using AllocFn = int (*)(std::uint64_t*, std::size_t);
using FreeFn = int (*)(std::uint64_t);

class UcxCudaEventsTest : public ::testing::Test {
 protected:
  // Allocation events carry the address only once the driver returned it: the handler watches the
  // address an earlier allocation of the same size had (the fake reuses freed space lowest address
  // first), checked against the address the allocation returns. `rounds` allocations after the first,
  // each freed: every one raised once.
  void allocAndFreeSeenOnce(AllocFn alloc, FreeFn release, int rounds) {
    ASSERT_NE(alloc, nullptr);
    ASSERT_NE(release, nullptr);
    std::uint64_t first = 0;
    ASSERT_EQ(0, alloc(&first, kSize));
    watch(first);
    ASSERT_EQ(0, release(first));
    expectFreeSeenOnce(first, kSize, UCS_MEMORY_TYPE_CUDA);
    for (int i = 0; i < rounds; ++i) {
      watch(first);
      std::uint64_t p = 0;
      ASSERT_EQ(0, alloc(&p, kSize));
      ASSERT_EQ(first, p) << "the fake did not reuse the freed range";
      expectAllocSeen(p);
      ASSERT_EQ(0, release(p));
      expectFreeSeenOnce(p, kSize, UCS_MEMORY_TYPE_CUDA);
    }
  }

  void SetUp() override { start(false); }

  // gmd_first: gmd loaded (and its CUDA hooks installed) before the handler is set.
  void start(bool gmd_first) {
    driver_ = dlopen("libcuda.so.1", RTLD_NOW);
    if (driver_ == nullptr || dlsym(driver_, "gmd_fake_cuda_driver") == nullptr) {
      GTEST_SKIP() << "the fake CUDA driver is not libcuda.so.1 here";
    }
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(driver_, "cuInit"));
    ASSERT_NE(init, nullptr);
    ASSERT_EQ(0, init(0));
    if (gmd_first) {
      loadGmd();
      Dl_info info{};
      ASSERT_NE(0, dladdr(dlsym(driver_, "cuMemAlloc_v2"), &info));
      ASSERT_NE(nullptr, info.dli_fname);
      ASSERT_NE(nullptr, std::strstr(info.dli_fname, "libuct_gmd"))
          << "gmd's CUDA hooks are not installed: cuMemAlloc_v2 resolves into " << info.dli_fname;
    }
    // Loads libucm's modules (libucm_cuda where UCX has one), which install their hooks now: a
    // hook that cannot be installed fails this call.
    const ucs_status_t st = ucm_set_event_handler(
        UCM_EVENT_MEM_TYPE_ALLOC | UCM_EVENT_MEM_TYPE_FREE, 0, onEvent, nullptr);
    std::string ucm_cuda;
    dl_iterate_phdr(findUcmCuda, &ucm_cuda);
    if (ucm_cuda.empty()) {
      if (st == UCS_OK)
        ucm_unset_event_handler(UCM_EVENT_MEM_TYPE_ALLOC | UCM_EVENT_MEM_TYPE_FREE, onEvent,
                                nullptr);
      GTEST_SKIP() << "UCX's libucm_cuda is not loaded (a UCX without CUDA, or UCX_MODULES)";
    }
    ASSERT_EQ(UCS_OK, st) << "libucm refused the memory-type handler with " << ucm_cuda
                          << " loaded: its CUDA hooks could not be installed on the fake driver ("
                          << ucs_status_string(st) << ")";
    handler_set_ = true;
    ucm_cuda_ = dlopen(ucm_cuda.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!gmd_first) loadGmd();
  }
  void TearDown() override {
    if (handler_set_) {
      ucm_unset_event_handler(UCM_EVENT_MEM_TYPE_ALLOC | UCM_EVENT_MEM_TYPE_FREE, onEvent, nullptr);
    }
  }

  template <typename F>
  F sym(const char* name) {
    void* fn = dlsym(driver_, name);  // looked up anew: whatever binding gmd may have redirected
    EXPECT_NE(fn, nullptr) << name;
    return reinterpret_cast<F>(fn);
  }
  template <typename F>
  F proc(const char* name) {
    using GetProc = int (*)(const char*, void**, int, std::uint64_t, int*);
    auto get_proc = sym<GetProc>("cuGetProcAddress_v2");
    void* fn = nullptr;
    int status = -1;
    EXPECT_EQ(0, get_proc(name, &fn, 12000, 0, &status)) << name;
    return reinterpret_cast<F>(fn);
  }

  // Watches p: its allocation (already made) is to have been seen once.
  void expectAllocSeen(std::uint64_t p) {
    EXPECT_EQ(1, g_seen.allocs) << "allocation events for 0x" << std::hex << p;
  }
  void watch(std::uint64_t p) { g_seen = Seen{p}; }
  void expectFreeSeenOnce(std::uint64_t p, std::size_t size, ucs_memory_type_t type,
                          const char* how = "") {
    EXPECT_EQ(1, g_seen.frees) << "free events for 0x" << std::hex << p << " " << how;
    EXPECT_GE(g_seen.free_size, size);
    EXPECT_EQ(type, g_seen.free_type);
  }

  // Whether this UCX's libucm_cuda hooks the entry point (its replacement is ucm_<name>).
  bool ucxHooks(const char* name) {
    const std::string replacement = std::string("ucm_") + name;
    return ucm_cuda_ != nullptr && dlsym(ucm_cuda_, replacement.c_str()) != nullptr;
  }

  void throughDlsym() {
    allocAndFreeSeenOnce(sym<AllocFn>("cuMemAlloc_v2"), sym<FreeFn>("cuMemFree_v2"), 3);
  }

  // Pointers from cuGetProcAddress reach the patched entry points too.
  void throughGetProcAddress() {
    allocAndFreeSeenOnce(proc<AllocFn>("cuMemAlloc"), proc<FreeFn>("cuMemFree"), 1);
  }

  // Stream-ordered and managed allocations, each freed once.
  void asyncAndManaged() {
    auto alloc_async = sym<int (*)(std::uint64_t*, std::size_t, void*)>("cuMemAllocAsync");
    auto free_async = sym<int (*)(std::uint64_t, void*)>("cuMemFreeAsync");
    auto alloc_managed = sym<int (*)(std::uint64_t*, std::size_t, unsigned)>("cuMemAllocManaged");
    auto release = sym<FreeFn>("cuMemFree_v2");
    ASSERT_NE(alloc_async, nullptr);
    ASSERT_NE(free_async, nullptr);
    ASSERT_NE(alloc_managed, nullptr);
    ASSERT_NE(release, nullptr);
    std::uint64_t p = 0;
    ASSERT_EQ(0, alloc_async(&p, kSize, nullptr));
    watch(p);
    ASSERT_EQ(0, free_async(p, nullptr));
    // libucm types a stream-ordered free CUDA_MANAGED before 1.18, CUDA from 1.18 on (the release
    // that also began hooking cuMemMap).
    const ucs_memory_type_t async_type =
        ucxHooks("cuMemMap") ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_CUDA_MANAGED;
    expectFreeSeenOnce(p, kSize, async_type, "(cuMemFreeAsync)");
    std::uint64_t m = 0;
    ASSERT_EQ(0, alloc_managed(&m, kSize, 1 /* CU_MEM_ATTACH_GLOBAL */));
    watch(m);
    ASSERT_EQ(0, release(m));
    expectFreeSeenOnce(m, kSize, UCS_MEMORY_TYPE_CUDA, "(managed, cuMemFree_v2)");
  }

  void* driver_ = nullptr;
  void* ucm_cuda_ = nullptr;
  bool handler_set_ = false;
};

class UcxCudaEventsGmdFirstTest : public UcxCudaEventsTest {
 protected:
  void SetUp() override { start(true); }
};

TEST_F(UcxCudaEventsTest, DriverEntryPointsThroughDlsym) { throughDlsym(); }
TEST_F(UcxCudaEventsTest, DriverEntryPointsThroughGetProcAddress) { throughGetProcAddress(); }
TEST_F(UcxCudaEventsTest, AsyncAndManaged) { asyncAndManaged(); }

TEST_F(UcxCudaEventsGmdFirstTest, DriverEntryPointsThroughDlsym) { throughDlsym(); }
TEST_F(UcxCudaEventsGmdFirstTest, DriverEntryPointsThroughGetProcAddress) {
  throughGetProcAddress();
}
TEST_F(UcxCudaEventsGmdFirstTest, AsyncAndManaged) { asyncAndManaged(); }

// A VMM mapping: mapped once, unmapped once (the unmap is the free UCX raises).
TEST_F(UcxCudaEventsTest, VmmMapAndUnmap) {
  if (!ucxHooks("cuMemMap") || !ucxHooks("cuMemUnmap")) {
    GTEST_SKIP() << "this UCX's libucm_cuda does not hook cuMemMap/cuMemUnmap (before 1.18)";
  }
  auto reserve =
      sym<int (*)(std::uint64_t*, std::size_t, std::size_t, std::uint64_t, unsigned long long)>(
          "cuMemAddressReserve");
  auto create =
      sym<int (*)(std::uint64_t*, std::size_t, const void*, unsigned long long)>("cuMemCreate");
  auto map =
      sym<int (*)(std::uint64_t, std::size_t, std::size_t, std::uint64_t, unsigned long long)>(
          "cuMemMap");
  auto unmap = sym<int (*)(std::uint64_t, std::size_t)>("cuMemUnmap");
  auto release = sym<int (*)(std::uint64_t)>("cuMemRelease");
  auto address_free = sym<int (*)(std::uint64_t, std::size_t)>("cuMemAddressFree");
  ASSERT_TRUE(reserve && create && map && unmap && release && address_free);
  const std::size_t size = 4 * kSize;
  std::uint64_t va = 0, handle = 0;
  ASSERT_EQ(0, reserve(&va, size, 0, 0, 0));
  const int prop[8] = {1, 0, 1, 0};  // PINNED, no handle types, on device 0
  ASSERT_EQ(0, create(&handle, size, prop, 0));
  watch(va);
  ASSERT_EQ(0, map(va, size, 0, handle, 0));
  expectAllocSeen(va);
  ASSERT_EQ(0, unmap(va, size));
  expectFreeSeenOnce(va, size, UCS_MEMORY_TYPE_UNKNOWN);
  ASSERT_EQ(0, release(handle));
  ASSERT_EQ(0, address_free(va, size));
}

}  // namespace
