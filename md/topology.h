// Where gmd's devices sit on the PCI bus, so that UCX can pair a GPU with its nearest NIC as it
// does for its own transports: each gmd_rc resource reports the verbs device's system device
// (uct_tl_device_resource_t::sys_device) and mem_query reports the GPU's for CUDA memory
// (uct_md_mem_attr_t::sys_dev). Virtual devices (rxe, siw: no PCI parent) and host memory are
// "unknown" (UCS_SYS_DEVICE_ID_UNKNOWN).
//
// This file is UCX-free: PCI addresses come from sysfs (verbs devices; the sysfs root is injected,
// "/sys" in production, a fake tree in tests) and from the CUDA driver through memtype/
// (cuDeviceGetPCIBusId). Turning an address into a UCX system device index is a lookup injected
// into SysDevices (md/ucs_topology.h provides UCX's, ucs_topo_find_device_by_bus_id).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace gmd::md::topology {

// A PCI function address, as sysfs and the CUDA driver write it: [domain:]bus:device.function.
struct PciAddress {
  std::uint16_t domain = 0;
  std::uint8_t bus = 0;
  std::uint8_t slot = 0;      // device, 0-0x1f
  std::uint8_t function = 0;  // 0-7
  // Spelled out, not defaulted: the GPU check builds this file with whatever compiler the GPU
  // machine has (GCC 9's C++2a has no defaulted comparisons).
  bool operator==(const PciAddress& o) const {
    return domain == o.domain && bus == o.bus && slot == o.slot && function == o.function;
  }
};

// Parses "dddd:bb:ss.f" or "bb:ss.f" (hex, either case; the domain may have up to 8 digits, as
// nvidia-smi writes it, but must fit 16 bits). nullopt for anything else, trailing text included.
std::optional<PciAddress> parsePciAddress(std::string_view text) noexcept;

// "dddd:bb:ss.f" in lower case, as sysfs names PCI devices.
std::string toString(const PciAddress& address);

// The PCI address of verbs device `ibdev` (e.g. "mlx5_0"): the device its
// <sysfs_root>/class/infiniband/<ibdev>/device link resolves to, when that is a PCI function.
// nullopt for a virtual device (no such link), a parent that is not PCI, or an unknown name.
std::optional<PciAddress> verbsDevicePci(const std::string& sysfs_root,
                                         std::string_view ibdev) noexcept;

// The PCI address of CUDA device `ordinal`, from the driver (memtype's). nullopt without a driver,
// for an ordinal the driver does not have, or when it answers something that is not an address.
std::optional<PciAddress> cudaDevicePci(int ordinal) noexcept;

inline constexpr std::uint8_t kUnknownSysDevice = 0xff;  // UCS_SYS_DEVICE_ID_UNKNOWN

// Finds (or registers) the system device of a PCI address; false when it cannot.
using SysDeviceLookup = bool (*)(const PciAddress& address, std::uint8_t* sys_device) noexcept;

// System device ids of verbs devices and CUDA devices, through an injected lookup.
//
// Thread safety: any method from any thread. CUDA answers are computed once per ordinal (racing
// first callers may both compute; they get the same answer) and read with one atomic load after.
class SysDevices {
 public:
  static constexpr int kMaxCudaDevices = 64;

  SysDevices(std::string sysfs_root, SysDeviceLookup find)
      : sysfs_root_(std::move(sysfs_root)), lookup_(find) {
    for (auto& d : cuda_) d.store(kNotLooked, std::memory_order_relaxed);
  }

  // Reads sysfs on each call (resource queries are rare).
  std::uint8_t verbsDevice(std::string_view ibdev) const noexcept;
  // The hot one (every mem_query of CUDA memory): cached per ordinal. Unknown for ordinals < 0 or
  // >= kMaxCudaDevices.
  std::uint8_t cudaDevice(int ordinal) noexcept;

 private:
  static constexpr std::int16_t kNotLooked = -1;
  std::uint8_t lookup(const std::optional<PciAddress>& address) const noexcept;

  const std::string sysfs_root_;
  const SysDeviceLookup lookup_;
  std::array<std::atomic<std::int16_t>, kMaxCudaDevices> cuda_;
};

}  // namespace gmd::md::topology
