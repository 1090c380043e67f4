// GPUDirect on real RDMA devices through the public UCT API, with the fake CUDA driver (a GPU that
// reports dma-buf support). Soft-RoCE imports no dma-buf, so without peer memory a gmd MD on rxe
// must not list CUDA in reg_mem_types (it still detects CUDA memory); with a peer-memory marker it
// must (registration by ibv_reg_mr on the device pointer).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

constexpr std::uint64_t kCuda = UCS_BIT(UCS_MEMORY_TYPE_CUDA);

class GpuDirectRxe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GMD_HAVE_CUDA) GTEST_SKIP() << "CUDA compiled out (GMD_WITH_CUDA=OFF)";
    GMD_REQUIRE_RDMA_DEVICES(1);
    const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
    ASSERT_NE(path, nullptr) << "gtest/md/CMakeLists.txt names the fake driver";
    void* drv = dlopen(path, RTLD_NOW);
    ASSERT_NE(drv, nullptr) << dlerror();
    ASSERT_NE(dlsym(drv, "gmd_fake_cuda_driver"), nullptr);
    comp_ = findComponent("gmd", &md_names_);
    ASSERT_NE(nullptr, comp_) << "component gmd is not listed by uct_query_components";
    for (const std::string& name : md_names_) {
      if (name.rfind("rxe", 0) == 0) rxe_.push_back(name);
    }
    if (rxe_.empty()) GTEST_SKIP() << "no soft-RoCE device among gmd's MDs";
  }
  // The MD's memory types, as ucx_info -d shows them.
  void query(const std::string& name, uct_md_attr_t* attr) {
    ucs_status_t st;
    uct_md_h md = openMd(comp_, name, &st);
    ASSERT_EQ(UCS_OK, st) << name;
    ASSERT_EQ(UCS_OK, uct_md_query(md, attr));
    uct_md_close(md);
  }

  uct_component_h comp_ = nullptr;
  std::vector<std::string> md_names_;
  std::vector<std::string> rxe_;
};

TEST_F(GpuDirectRxe, NoDmabufImportAndNoPeerMemoryMeansCudaIsNotRegistered) {
  if (access("/sys/module/nvidia_peermem", F_OK) == 0 ||
      access("/sys/kernel/mm/memory_peers/nv_mem", F_OK) == 0 ||
      access("/sys/module/nv_peer_mem", F_OK) == 0) {
    GTEST_SKIP() << "a peer-memory module is loaded here";
  }
  for (const std::string& name : rxe_) {
    uct_md_attr_t attr{};
    query(name, &attr);
    EXPECT_EQ(0u, attr.cap.reg_mem_types & kCuda) << name << ": rxe imports no dma-buf";
    EXPECT_TRUE(attr.cap.reg_mem_types & UCS_BIT(UCS_MEMORY_TYPE_HOST)) << name;
    EXPECT_TRUE(attr.cap.detect_mem_types & kCuda) << name << ": CUDA memory is still detected";
  }
}

// The guest's /sys/kernel/mm gets a tmpfs with the nv_mem marker, in this command's own mount
// namespace (the VM gives each command one), and loses it again at the end.
TEST_F(GpuDirectRxe, PeerMemoryMarkerMakesCudaRegistrable) {
  if (std::getenv("GMD_RXE_VM") == nullptr || geteuid() != 0) {
    GTEST_SKIP() << "fakes a peer-memory module under /sys: only as root in the soft-RoCE VM";
  }
  ASSERT_EQ(0, mount("none", "/sys/kernel/mm", "tmpfs", 0, nullptr)) << std::strerror(errno);
  const bool made = mkdir("/sys/kernel/mm/memory_peers", 0755) == 0 &&
                    mkdir("/sys/kernel/mm/memory_peers/nv_mem", 0755) == 0;
  for (const std::string& name : rxe_) {
    if (!made) break;
    uct_md_attr_t attr{};
    query(name, &attr);
    EXPECT_EQ(kCuda, attr.cap.reg_mem_types & kCuda) << name << ": peer memory registers CUDA";
  }
  EXPECT_TRUE(made) << std::strerror(errno);
  EXPECT_EQ(0, umount("/sys/kernel/mm")) << std::strerror(errno);
}

}  // namespace
}  // namespace gmd::test
