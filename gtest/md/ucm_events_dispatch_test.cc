// md/ucm_events without the plugin: its dispatch into this process's libucm (events raised by direct
// calls, as the allocation and free hooks raise them) and mem_query's write-back into UCX's memtype
// cache, against the fake CUDA driver. Each test case runs in a process of its own.
#include "md/ucm_events.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>

extern "C" {
#include <ucs/datastruct/pgtable.h>
}
#include <ucs/memory/memtype_cache.h>

#include "gtest/memtype/fake_driver.h"
#include "md/abi/edge.h"

namespace gmd::md::ucm_events {
namespace {

constexpr std::size_t kSize = 1 << 20;

ucs_status_t lookup(std::uintptr_t address, std::size_t length, ucs_memory_info_t* info) {
  return ucs_memtype_cache_lookup(reinterpret_cast<const void*>(address), length, info);
}

class UcmEventsDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fake_.load()) GTEST_SKIP() << "the fake CUDA driver is not libcuda.so.1 here";
  }
  memtype::test::FakeDriver fake_;
};

TEST_F(UcmEventsDispatchTest, StartsOnceAndRaisesDirectCalls) {
  ASSERT_EQ(State::kNotStarted, state());
  ASSERT_EQ(State::kActive, start(true));
  EXPECT_EQ(State::kActive, start(false));  // the first call decided
  ASSERT_NE(nullptr, ucs_memtype_cache_global_instance);

  // Any range: the dispatch does not check it against the driver.
  void* area = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, area);
  const auto a = reinterpret_cast<std::uintptr_t>(area);
  ucs_memory_info_t info{};
  ASSERT_EQ(UCS_ERR_NO_ELEM, lookup(a, 64, &info));

  raiseAlloc({a, kSize, MemType::kCuda, 0});
  ASSERT_EQ(UCS_OK, lookup(a + 4096, 64, &info));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, info.type);
  EXPECT_EQ(area, info.base_address);
  EXPECT_EQ(kSize, info.alloc_length);

  raiseFree(a, kSize);
  EXPECT_EQ(UCS_ERR_NO_ELEM, lookup(a + 4096, 64, &info));

  raiseAlloc({a, kSize, MemType::kCudaManaged, -1});
  ASSERT_EQ(UCS_OK, lookup(a, 64, &info));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA_MANAGED, info.type);
  raiseFree(a, kSize);
  EXPECT_EQ(UCS_ERR_NO_ELEM, lookup(a, 64, &info));
  munmap(area, kSize);
}

TEST_F(UcmEventsDispatchTest, OffRaisesNothing) {
  ucs_memory_info_t info{};
  (void)lookup(0, 1, &info);  // creates the cache (another libucm module may fill it: count it)
  ASSERT_NE(nullptr, ucs_memtype_cache_global_instance);
  const std::size_t regions = ucs_memtype_cache_global_instance->pgtable.num_regions;
  ASSERT_EQ(State::kDisabled, start(false));
  void* area = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, area);
  const auto a = reinterpret_cast<std::uintptr_t>(area);
  raiseAlloc({a, kSize, MemType::kCuda, 0});
  EXPECT_EQ(UCS_ERR_NO_ELEM, lookup(a, 64, &info));
  EXPECT_EQ(regions, ucs_memtype_cache_global_instance->pgtable.num_regions);
  munmap(area, kSize);
}

// gmd's mem_query writes device answers back with their exact range, and removes host answers
// that fall in a range held as unknown (here a PROT_NONE reservation the maps scan found).
TEST_F(UcmEventsDispatchTest, MemQueryWritesBack) {
  void* reserved = mmap(nullptr, kSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, reserved);
  const auto r = reinterpret_cast<std::uintptr_t>(reserved);
  ASSERT_EQ(State::kActive, start(true));
  ucs_memory_info_t info{};
  ASSERT_EQ(UCS_OK, lookup(r + 8192, 64, &info));
  ASSERT_EQ(UCS_MEMORY_TYPE_UNKNOWN, info.type);

  uct_md_mem_attr_t attr{};
  attr.field_mask = UCT_MD_MEM_ATTR_FIELD_MEM_TYPE | UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS |
                    UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH;
  ASSERT_EQ(UCS_OK, mdImpl().mem_query(nullptr, reinterpret_cast<void*>(r + 8192), 64, &attr));
  EXPECT_EQ(UCS_MEMORY_TYPE_HOST, attr.mem_type);
  EXPECT_EQ(UCS_ERR_NO_ELEM, lookup(r + 8192, 64, &info));
  // The rest of the reservation stays unknown.
  ASSERT_EQ(UCS_OK, lookup(r, 64, &info));
  EXPECT_EQ(UCS_MEMORY_TYPE_UNKNOWN, info.type);

  // Device memory the cache does not know (the allocation hooks are not what this test is about):
  // mem_query puts its exact range in.
  const std::uint64_t p = fake_.alloc(kSize);
  ASSERT_NE(0u, p);
  raiseFree(p, kSize);  // whatever the hooks raised: start from an unknown address
  ASSERT_EQ(UCS_ERR_NO_ELEM, lookup(p + 4096, 64, &info));
  ASSERT_EQ(UCS_OK, mdImpl().mem_query(nullptr, reinterpret_cast<void*>(p + 4096), 64, &attr));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, attr.mem_type);
  ASSERT_EQ(UCS_OK, lookup(p + 4096, 64, &info));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, info.type);
  EXPECT_EQ(p, reinterpret_cast<std::uintptr_t>(info.base_address));
  EXPECT_EQ(kSize, info.alloc_length);
  // Freed through the hooked driver (the fake's pointers were taken before gmd hooked it).
  auto hooked_free = reinterpret_cast<int (*)(std::uint64_t)>(dlsym(fake_.handle, "cuMemFree_v2"));
  ASSERT_NE(nullptr, hooked_free);
  ASSERT_EQ(0, hooked_free(p));
  EXPECT_EQ(UCS_ERR_NO_ELEM, lookup(p + 4096, 64, &info));
  munmap(reserved, kSize);
}

TEST_F(UcmEventsDispatchTest, MemQueryWritesNothingWhenOff) {
  ASSERT_EQ(State::kDisabled, start(false));
  ASSERT_TRUE(memtype::Classifier::instance().cudaAvailable());  // loads and initialises the driver
  const std::uint64_t p = fake_.alloc(kSize);
  ASSERT_NE(0u, p);
  uct_md_mem_attr_t attr{};
  attr.field_mask = UCT_MD_MEM_ATTR_FIELD_MEM_TYPE;
  ASSERT_EQ(UCS_OK, mdImpl().mem_query(nullptr, reinterpret_cast<void*>(p), 64, &attr));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, attr.mem_type);
  ucs_memory_info_t info{};
  EXPECT_EQ(UCS_ERR_NO_ELEM, lookup(p, 64, &info));
  fake_.memFree(p);
}

TEST(UcmEventsNoUcxCuda, NotLoadedHere) { EXPECT_FALSE(ucxHasCuda()); }

}  // namespace
}  // namespace gmd::md::ucm_events
