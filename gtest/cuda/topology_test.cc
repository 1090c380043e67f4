// md/topology against the CUDA driver (label cuda): every GPU's PCI address, as gmd reports it to
// UCX for mem_query's sys_dev, is one the kernel knows (/sys/bus/pci/devices) and agrees with the
// driver's PCI attributes. With the fake driver: its default addresses (0000:3b:00.0 for GPU 0,
// 0000:3c:00.0 for GPU 1).
#include "md/topology.h"

#include <cuda.h>

#include <filesystem>

#include "gtest/cuda/cuda_fixture.h"

namespace gmd::memtype::cudacheck {
namespace {

using md::topology::cudaDevicePci;
using md::topology::toString;

class Topology : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = whyNotRunnable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(Topology, EveryGpuHasAPciAddressTheKernelKnows) {
  const int n = Classifier::instance().deviceCount();
  ASSERT_GT(n, 0);
  for (int d = 0; d < n; ++d) {
    const auto pci = cudaDevicePci(d);
    ASSERT_TRUE(pci.has_value()) << "GPU " << d;
    const std::string name = toString(*pci);
    int bus = -1, slot = -1, domain = -1;
    const detail::DriverApi* api = detail::driver();
    ASSERT_EQ(api->deviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d), 0);
    ASSERT_EQ(api->deviceGetAttribute(&slot, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d), 0);
    ASSERT_EQ(api->deviceGetAttribute(&domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d), 0);
    EXPECT_EQ(pci->bus, bus) << name;
    EXPECT_EQ(pci->slot, slot) << name;
    EXPECT_EQ(pci->domain, domain) << name;
    if (fakeDriver()) {
      EXPECT_EQ(*pci, (md::topology::PciAddress{0, static_cast<std::uint8_t>(0x3b + d), 0, 0}));
    } else {
      EXPECT_TRUE(std::filesystem::exists("/sys/bus/pci/devices/" + name))
          << "GPU " << d << " at " << name << " is not a PCI device of this kernel";
    }
    std::printf("GPU %d: PCI %s\n", d, name.c_str());
  }
  EXPECT_FALSE(cudaDevicePci(n).has_value());
}

}  // namespace
}  // namespace gmd::memtype::cudacheck
