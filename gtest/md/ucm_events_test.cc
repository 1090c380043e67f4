// gmd loaded into UCX as its plugin raises libucm's memory-type events for (fake) CUDA memory
// (md/ucm_events.h): UCX's own memtype cache answers CUDA inside device allocations and nothing
// after their free, host memory stays unknown to it, a libucm handler sees the frees, allocations
// made before gmd was loaded are found, UCX_GMD_CUDA_EVENTS=n raises nothing, and gmd stands down
// where UCX's own CUDA support is loaded.
//
// Each test case runs in a process of its own (ctest runs them one by one): what gmd decides when
// UCX first lists its MDs holds for the process. The fake driver (gtest/memtype/fake_cuda/) is
// libcuda.so.1 on LD_LIBRARY_PATH.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <ucm/api/ucm.h>
#include <uct/api/uct.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
#include <ucs/datastruct/pgtable.h>
}
#include <ucs/memory/memtype_cache.h>

#include "gtest/common/load_gmd.h"

namespace {

constexpr std::size_t kSize = 1 << 20;

using AllocFn = int (*)(std::uint64_t*, std::size_t);
using FreeFn = int (*)(std::uint64_t);

// The fake driver's entry points, looked up anew each time (a pointer taken before gmd hooked the
// driver would bypass the hooks, as a real program's would).
struct Fake {
  void* handle = nullptr;

  bool load() {
    handle = dlopen("libcuda.so.1", RTLD_NOW);
    if (handle == nullptr || dlsym(handle, "gmd_fake_cuda_driver") == nullptr) return false;
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(handle, "cuInit"));
    return init != nullptr && init(0) == 0;
  }
  std::uint64_t alloc(std::size_t size) const {
    auto fn = reinterpret_cast<AllocFn>(dlsym(handle, "cuMemAlloc_v2"));
    std::uint64_t p = 0;
    return fn != nullptr && fn(&p, size) == 0 ? p : 0;
  }
  int free(std::uint64_t p) const {
    auto fn = reinterpret_cast<FreeFn>(dlsym(handle, "cuMemFree_v2"));
    return fn != nullptr ? fn(p) : -1;
  }
};

// Loads the plugin and has UCX list its MDs (gtest/common/load_gmd.h).
void loadGmd() { gmd::test::loadGmdComponent(GMD_PLUGIN_PATH); }

ucs_status_t lookup(std::uint64_t address, std::size_t length, ucs_memory_info_t* info) {
  return ucs_memtype_cache_lookup(reinterpret_cast<const void*>(address), length, info);
}

// Regions in UCX's memtype cache, which a lookup creates. Not necessarily 0 without gmd's events:
// another libucm memory-type module (Debian 13's UCX has ROCm's) marks PROT_NONE ranges as unknown.
std::size_t cachedRegions() {
  ucs_memory_info_t info{};
  (void)lookup(0, 1, &info);
  return ucs_memtype_cache_global_instance != nullptr
             ? ucs_memtype_cache_global_instance->pgtable.num_regions
             : 0;
}

// The mem-type events a libucm handler saw (handlers must not allocate: fixed storage).
struct Seen {
  int count = 0;
  int type = 0;
  void* address = nullptr;
  std::size_t size = 0;
  ucs_memory_type_t mem_type = UCS_MEMORY_TYPE_UNKNOWN;
};
Seen g_frees;
void onFree(ucm_event_type_t type, ucm_event_t* event, void*) {
  ++g_frees.count;
  g_frees.type = type;
  g_frees.address = event->mem_type.address;
  g_frees.size = event->mem_type.size;
  g_frees.mem_type = event->mem_type.mem_type;
}

class UcmEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fake_.load()) GTEST_SKIP() << "the fake CUDA driver is not libcuda.so.1 here";
    ASSERT_EQ(UCS_OK, ucm_set_event_handler(UCM_EVENT_MEM_TYPE_FREE, 0, onFree, nullptr));
  }
  void TearDown() override { ucm_unset_event_handler(UCM_EVENT_MEM_TYPE_FREE, onFree, nullptr); }

  // Inside [p, p + kSize): OK, CUDA, and the region covers the whole allocation.
  void expectCuda(std::uint64_t p) {
    ucs_memory_info_t info{};
    ASSERT_EQ(UCS_OK, lookup(p + 4096, 100, &info));
    EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, info.type);
    EXPECT_LE(reinterpret_cast<std::uintptr_t>(info.base_address), p);
    EXPECT_GE(reinterpret_cast<std::uintptr_t>(info.base_address) + info.alloc_length, p + kSize);
  }
  void expectNoElem(std::uint64_t p, std::size_t length = 100) {
    ucs_memory_info_t info{};
    EXPECT_EQ(UCS_ERR_NO_ELEM, lookup(p, length, &info)) << "type " << info.type;
  }
  // A free of p reached the libucm handler with its range.
  void expectFreeSeen(std::uint64_t p) {
    EXPECT_EQ(1, g_frees.count);
    EXPECT_EQ(UCM_EVENT_MEM_TYPE_FREE, g_frees.type);
    EXPECT_EQ(reinterpret_cast<void*>(p), g_frees.address);
    EXPECT_GE(g_frees.size, kSize);
    EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, g_frees.mem_type);
  }

  Fake fake_;
};

// An allocation made before gmd was loaded is found when UCX lists gmd's MDs; its free is raised.
TEST_F(UcmEventsTest, ExistingAllocationFoundAtLoadAndFreed) {
  const std::uint64_t p = fake_.alloc(kSize);
  ASSERT_NE(0u, p);
  loadGmd();
  expectCuda(p);
  g_frees = {};
  ASSERT_EQ(0, fake_.free(p));
  expectNoElem(p + 4096);
  expectFreeSeen(p);
}

// After gmd is loaded, an allocation is raised as it happens.
TEST_F(UcmEventsTest, AllocationRaisedAndFreed) {
  loadGmd();
  const std::uint64_t p = fake_.alloc(kSize);
  ASSERT_NE(0u, p);
  expectCuda(p);
  g_frees = {};
  ASSERT_EQ(0, fake_.free(p));
  expectNoElem(p + 4096);
  expectFreeSeen(p);
  // The same address again (the fake reuses it): CUDA again.
  const std::uint64_t q = fake_.alloc(kSize);
  ASSERT_EQ(p, q);
  expectCuda(q);
  ASSERT_EQ(0, fake_.free(q));
}

// cudaMalloc / cudaFree through a dynamically linked runtime.
TEST_F(UcmEventsTest, CudaMallocThroughFakeRuntime) {
  void* rt = dlopen("libgmd_fake_cudart.so", RTLD_NOW);
  ASSERT_NE(nullptr, rt) << dlerror();
  auto cuda_malloc = reinterpret_cast<int (*)(void**, std::size_t)>(dlsym(rt, "cudaMalloc"));
  auto cuda_free = reinterpret_cast<int (*)(void*)>(dlsym(rt, "cudaFree"));
  ASSERT_NE(nullptr, cuda_malloc);
  ASSERT_NE(nullptr, cuda_free);
  loadGmd();
  void* p = nullptr;
  ASSERT_EQ(0, cuda_malloc(&p, kSize));
  const auto addr = reinterpret_cast<std::uint64_t>(p);
  expectCuda(addr);
  g_frees = {};
  ASSERT_EQ(0, cuda_free(p));
  expectNoElem(addr + 4096);
  expectFreeSeen(addr);
}

// Host memory stays out of the cache (UCP then takes it for host without asking any MD); a
// PROT_NONE range that existed before gmd was loaded is held as unknown (UCP asks the MDs).
TEST_F(UcmEventsTest, HostMemoryStaysNoElemReservationsUnknown) {
  void* reserved = mmap(nullptr, kSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, reserved);
  loadGmd();
  void* small = std::malloc(100);
  void* large = std::malloc(8 * kSize);
  ASSERT_NE(nullptr, small);
  ASSERT_NE(nullptr, large);
  int on_stack = 0;
  expectNoElem(reinterpret_cast<std::uint64_t>(small));
  expectNoElem(reinterpret_cast<std::uint64_t>(large), 8 * kSize);
  expectNoElem(reinterpret_cast<std::uint64_t>(&on_stack), sizeof(on_stack));
  ucs_memory_info_t info{};
  ASSERT_EQ(UCS_OK, lookup(reinterpret_cast<std::uint64_t>(reserved) + 4096, 100, &info));
  EXPECT_EQ(UCS_MEMORY_TYPE_UNKNOWN, info.type);
  EXPECT_EQ(0, g_frees.count);
  std::free(large);
  std::free(small);
  munmap(reserved, kSize);
}

// UCX_GMD_CUDA_EVENTS=n: nothing is raised; the cache holds what it held before gmd was loaded.
TEST_F(UcmEventsTest, OffRaisesNothing) {
  ASSERT_EQ(0, setenv("UCX_GMD_CUDA_EVENTS", "n", 1));
  const std::uint64_t before = fake_.alloc(kSize);
  ASSERT_NE(0u, before);
  const std::size_t regions = cachedRegions();
  loadGmd();
  EXPECT_EQ(regions, cachedRegions()) << "gmd's load changed UCX's memtype cache";
  const std::uint64_t after = fake_.alloc(kSize);
  ASSERT_NE(0u, after);
  expectNoElem(before + 4096);
  expectNoElem(after + 4096);
  g_frees = {};
  ASSERT_EQ(0, fake_.free(before));
  ASSERT_EQ(0, fake_.free(after));
  EXPECT_EQ(0, g_frees.count);
  EXPECT_EQ(regions, cachedRegions());
}

// Where UCX's own CUDA support is loaded (a library named like libucm_cuda here), gmd raises
// nothing: UCX would raise every event itself.
TEST_F(UcmEventsTest, StandsDownWhereUcxHasCuda) {
  void* ucm_cuda = dlopen(GMD_FAKE_UCM_CUDA_PATH, RTLD_NOW);
  ASSERT_NE(nullptr, ucm_cuda) << dlerror();
  const std::uint64_t before = fake_.alloc(kSize);
  ASSERT_NE(0u, before);
  loadGmd();
  expectNoElem(before + 4096);
  g_frees = {};
  ASSERT_EQ(0, fake_.free(before));
  EXPECT_EQ(0, g_frees.count);
}

}  // namespace
