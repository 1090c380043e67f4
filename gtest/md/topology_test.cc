// md/topology: PCI addresses of verbs devices from a fake sysfs tree, of CUDA devices from the fake
// driver, and their UCX system devices (through a recording lookup and through UCX's registry).
#include "md/topology.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <ucs/sys/topo/base/topo.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "md/ucs_topology.h"
#include "memtype/memtype.h"

namespace gmd::md::topology {
namespace {

namespace fs = std::filesystem;

// The fake driver (GMD_CUDA_DRIVER_PATH) with two GPUs at 0000:3b:00.0 and 0000:af:00.0
// (gtest/md/CMakeLists.txt sets the environment).
#define GMD_REQUIRE_FAKE_GPUS()                                                       \
  do {                                                                                \
    if (!GMD_HAVE_CUDA) GTEST_SKIP() << "CUDA compiled out (GMD_WITH_CUDA=OFF)";      \
    ASSERT_TRUE(memtype::Classifier::instance().cudaAvailable()) << "no fake driver"; \
  } while (0)

TEST(PciAddress, ParsesTheFormsSysfsAndTheDriverWrite) {
  const PciAddress a{0, 0x3b, 0, 0};
  EXPECT_EQ(parsePciAddress("0000:3b:00.0"), a);
  EXPECT_EQ(parsePciAddress("0000:3B:00.0"), a);
  EXPECT_EQ(parsePciAddress("00000000:3B:00.0"), a) << "nvidia-smi's 8-digit domain";
  EXPECT_EQ(parsePciAddress("3b:00.0"), a) << "no domain";
  EXPECT_EQ(parsePciAddress("ffff:ff:1f.7"), (PciAddress{0xffff, 0xff, 0x1f, 7}));
  EXPECT_EQ(toString(PciAddress{0x10, 0xaf, 0x1e, 3}), "0010:af:1e.3");
  EXPECT_EQ(parsePciAddress(toString(PciAddress{0x10, 0xaf, 0x1e, 3})),
            (PciAddress{0x10, 0xaf, 0x1e, 3}));
}

TEST(PciAddress, RefusesWhatIsNotOne) {
  for (const char* bad : {"", "rxe0", "0000:3b:00", "0000:3b:00.", "0000:3b:00.8", "0000:3b:20.0",
                          "10000:3b:00.0", "0000:3b:00.0 ", "0000:3b:00.0/", "0000:3b:000.0",
                          "0:0:0:0.0", "0000:3g:00.0", "virtio0", "0000::00.0"}) {
    EXPECT_FALSE(parsePciAddress(bad).has_value()) << '"' << bad << '"';
  }
}

// A sysfs tree shaped like the kernel's: class links into devices/, a PCI NIC with a `device` link,
// a virtual device (rxe) without one, and one whose parent is not PCI.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gmd-sysfs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    const std::string nic = "devices/pci0000:00/0000:00:03.0/0000:3b:00.0";
    device(nic + "/infiniband/mlx5_0", "../../../0000:3b:00.0");
    device("devices/pci0000:80/0000:80:01.0/0000:af:00.1/infiniband/mlx5_1",
           "../../../0000:af:00.1");
    device("devices/virtual/infiniband/rxe0", "");
    device("devices/platform/soc/infiniband/plat0", "../..");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // devices/.../infiniband/<name>, linked from class/infiniband/<name>; `parent` ("" for none) is
  // where its `device` link points, relative to it.
  void device(const std::string& path, const std::string& parent) {
    const fs::path dir = root_ / path;
    fs::create_directories(dir);
    if (!parent.empty()) fs::create_directory_symlink(parent, dir / "device");
    fs::create_directories(root_ / "class/infiniband");
    fs::create_directory_symlink(fs::path("../..") / path,
                                 root_ / "class/infiniband" / dir.filename());
  }
  fs::path root_;
};

TEST_F(FakeSysfs, PciNicsHaveTheirAddress) {
  EXPECT_EQ(verbsDevicePci(root_, "mlx5_0"), (PciAddress{0, 0x3b, 0, 0}));
  EXPECT_EQ(verbsDevicePci(root_, "mlx5_1"), (PciAddress{0, 0xaf, 0, 1}));
}

TEST_F(FakeSysfs, VirtualAndNonPciDevicesHaveNone) {
  EXPECT_FALSE(verbsDevicePci(root_, "rxe0").has_value());
  EXPECT_FALSE(verbsDevicePci(root_, "plat0").has_value());
  EXPECT_FALSE(verbsDevicePci(root_, "no_such0").has_value());
  EXPECT_FALSE(verbsDevicePci(root_, "").has_value());
  EXPECT_FALSE(verbsDevicePci(root_, "../../devices/pci0000:00").has_value());
  EXPECT_FALSE(verbsDevicePci(root_ / "missing", "mlx5_0").has_value());
}

// A lookup that hands out indices in order and records what it was asked.
std::vector<PciAddress> g_asked;
bool recordingLookup(const PciAddress& a, std::uint8_t* sys) noexcept {
  g_asked.push_back(a);
  if (a.bus == 0xee) return false;  // "UCX refuses"
  *sys = static_cast<std::uint8_t>(g_asked.size() - 1);
  return true;
}

TEST_F(FakeSysfs, SysDevicesOfVerbsDevicesGoThroughTheLookup) {
  g_asked.clear();
  SysDevices devs(root_, &recordingLookup);
  EXPECT_EQ(devs.verbsDevice("mlx5_0"), 0);
  EXPECT_EQ(devs.verbsDevice("mlx5_1"), 1);
  EXPECT_EQ(devs.verbsDevice("rxe0"), kUnknownSysDevice);
  EXPECT_EQ(devs.verbsDevice("plat0"), kUnknownSysDevice);
  ASSERT_EQ(g_asked.size(), 2u) << "virtual devices are not looked up";
  EXPECT_EQ(g_asked[0], (PciAddress{0, 0x3b, 0, 0}));
  EXPECT_EQ(g_asked[1], (PciAddress{0, 0xaf, 0, 1}));
  SysDevices none(root_, nullptr);
  EXPECT_EQ(none.verbsDevice("mlx5_0"), kUnknownSysDevice);
}

TEST(CudaTopology, TheDriverNamesEachGpusPciAddress) {
  GMD_REQUIRE_FAKE_GPUS();
  ASSERT_EQ(memtype::Classifier::instance().deviceCount(), 2);
  char id[32];
  ASSERT_TRUE(memtype::cudaDevicePciBusId(0, id, sizeof(id)));
  EXPECT_EQ(parsePciAddress(id), (PciAddress{0, 0x3b, 0, 0})) << id;
  EXPECT_EQ(cudaDevicePci(1), (PciAddress{0, 0xaf, 0, 0}));
  EXPECT_FALSE(cudaDevicePci(2).has_value());
  EXPECT_FALSE(cudaDevicePci(-1).has_value());
  char small[4] = {'x', 0, 0, 0};
  EXPECT_FALSE(memtype::cudaDevicePciBusId(0, small, sizeof(small)));
  EXPECT_EQ(small[0], 'x') << "untouched on failure";
}

TEST(CudaTopology, SysDevicesOfGpusAreLookedUpOnceEach) {
  GMD_REQUIRE_FAKE_GPUS();
  g_asked.clear();
  SysDevices devs("/nonexistent", &recordingLookup);
  EXPECT_EQ(devs.cudaDevice(1), 0);
  EXPECT_EQ(devs.cudaDevice(0), 1);
  EXPECT_EQ(devs.cudaDevice(1), 0);
  EXPECT_EQ(devs.cudaDevice(0), 1);
  EXPECT_EQ(g_asked.size(), 2u) << "cached after the first answer";
  EXPECT_EQ(devs.cudaDevice(2), kUnknownSysDevice);
  EXPECT_EQ(devs.cudaDevice(-1), kUnknownSysDevice);
  EXPECT_EQ(devs.cudaDevice(SysDevices::kMaxCudaDevices), kUnknownSysDevice);
}

// UCX's registry: the NIC and a GPU on the same PCI function get the same system device (that is
// how UCX pairs them); its bus id reads back.
TEST_F(FakeSysfs, UcxRegistryPairsAGpuWithTheNicAtTheSameAddress) {
  GMD_REQUIRE_FAKE_GPUS();
  SysDevices devs(root_, &ucsSysDeviceLookup);
  const std::uint8_t nic = devs.verbsDevice("mlx5_0");
  ASSERT_NE(nic, kUnknownSysDevice);
  ucs_sys_bus_id_t bus = {};
  ASSERT_EQ(ucs_topo_get_device_bus_id(nic, &bus), UCS_OK);
  EXPECT_EQ(bus.domain, 0);
  EXPECT_EQ(bus.bus, 0x3b);
  EXPECT_EQ(bus.slot, 0);
  EXPECT_EQ(bus.function, 0);
  EXPECT_EQ(devs.cudaDevice(0), nic) << "GPU 0 is 0000:3b:00.0 in this test";
  const std::uint8_t other = devs.cudaDevice(1);
  EXPECT_NE(other, kUnknownSysDevice);
  EXPECT_NE(other, nic);
  EXPECT_EQ(devs.verbsDevice("rxe0"), kUnknownSysDevice);
}

}  // namespace
}  // namespace gmd::md::topology
