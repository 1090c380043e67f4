// Topology through the public UCT API, on real RDMA devices (soft-RoCE in the VM): every gmd_rc
// resource reports its verbs device's system device (unknown for virtual devices such as rxe), and
// mem_query reports the GPU's for CUDA memory (the fake driver here, its GPU at 0000:3b:00.0) and
// unknown for host memory.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <uct/api/uct.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "md/topology.h"
#include "md/ucs_topology.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

class Topology : public ::testing::Test {
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    comp_ = findComponent("gmd", &md_names_);
    ASSERT_NE(nullptr, comp_) << "component gmd is not listed by uct_query_components";
    ASSERT_FALSE(md_names_.empty());
  }
  uct_component_h comp_ = nullptr;
  std::vector<std::string> md_names_;
};

TEST_F(Topology, EveryResourceReportsItsDevicesSystemDevice) {
  for (const std::string& name : md_names_) {
    ucs_status_t st;
    uct_md_h md = openMd(comp_, name, &st);
    ASSERT_EQ(UCS_OK, st) << name;
    uct_tl_resource_desc_t* res = nullptr;
    unsigned n = 0;
    ASSERT_EQ(UCS_OK, uct_md_query_tl_resources(md, &res, &n));
    EXPECT_GT(n, 0u) << name << ": no active port";
    const auto pci = md::topology::verbsDevicePci("/sys", name);
    std::uint8_t expected = UCS_SYS_DEVICE_ID_UNKNOWN;
    if (pci.has_value()) {
      ASSERT_TRUE(md::ucsSysDeviceLookup(*pci, &expected));
    }
    for (unsigned i = 0; i < n; ++i) {
      EXPECT_STREQ("gmd_rc", res[i].tl_name);
      EXPECT_EQ(expected, res[i].sys_device) << res[i].dev_name;
      if (name.rfind("rxe", 0) == 0) {
        EXPECT_EQ(UCS_SYS_DEVICE_ID_UNKNOWN, res[i].sys_device) << "rxe is a virtual device";
      } else if (res[i].sys_device != UCS_SYS_DEVICE_ID_UNKNOWN) {
        ucs_sys_bus_id_t bus = {};
        ASSERT_EQ(UCS_OK, ucs_topo_get_device_bus_id(res[i].sys_device, &bus));
        EXPECT_EQ(md::topology::toString({bus.domain, bus.bus, bus.slot, bus.function}),
                  md::topology::toString(*pci));
      }
    }
    uct_release_tl_resource_list(res);
    uct_md_close(md);
  }
}

TEST_F(Topology, MemQueryNamesTheGpuOfCudaMemoryAndNoneForHost) {
  if (!GMD_HAVE_CUDA) GTEST_SKIP() << "CUDA compiled out (GMD_WITH_CUDA=OFF)";
  // The fake driver, loaded here as an application would (the plugin loads the same library).
  const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
  ASSERT_NE(path, nullptr) << "gtest/md/CMakeLists.txt names the fake driver";
  void* drv = dlopen(path, RTLD_NOW);
  ASSERT_NE(drv, nullptr) << dlerror();
  ASSERT_NE(dlsym(drv, "gmd_fake_cuda_driver"), nullptr);
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(drv, "cuInit"));
  auto alloc = reinterpret_cast<int (*)(std::uint64_t*, std::size_t)>(dlsym(drv, "cuMemAlloc_v2"));
  ASSERT_NE(init, nullptr);
  ASSERT_NE(alloc, nullptr);
  ASSERT_EQ(0, init(0));
  std::uint64_t dev = 0;
  ASSERT_EQ(0, alloc(&dev, 1 << 20));

  ucs_status_t st;
  uct_md_h md = openMd(comp_, md_names_[0], &st);
  ASSERT_EQ(UCS_OK, st);
  uct_md_mem_attr_t attr = {};
  attr.field_mask = UCT_MD_MEM_ATTR_FIELD_MEM_TYPE | UCT_MD_MEM_ATTR_FIELD_SYS_DEV;
  ASSERT_EQ(UCS_OK, uct_md_mem_query(md, reinterpret_cast<void*>(dev + 4096), 4096, &attr));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, attr.mem_type);
  std::uint8_t gpu = UCS_SYS_DEVICE_ID_UNKNOWN;
  ASSERT_TRUE(md::ucsSysDeviceLookup({0, 0x3b, 0, 0}, &gpu));
  EXPECT_EQ(gpu, attr.sys_dev) << "the fake GPU is at 0000:3b:00.0";

  std::vector<char> host(8192);
  attr = {};
  attr.field_mask = UCT_MD_MEM_ATTR_FIELD_MEM_TYPE | UCT_MD_MEM_ATTR_FIELD_SYS_DEV;
  ASSERT_EQ(UCS_OK, uct_md_mem_query(md, host.data(), host.size(), &attr));
  EXPECT_EQ(UCS_MEMORY_TYPE_HOST, attr.mem_type);
  EXPECT_EQ(UCS_SYS_DEVICE_ID_UNKNOWN, attr.sys_dev);
  uct_md_close(md);
}

}  // namespace
}  // namespace gmd::test
