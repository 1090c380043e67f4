// The UCX edge of md/topology.h: system device ids from UCX's topology registry
// (ucs_topo_find_device_by_bus_id, which registers an address it has not seen), for the gmd_rc
// resources (sys_device) and mem_query of CUDA memory (sys_dev).
//
// Thread safety: as topology::SysDevices; the process-wide instance is built on first use.
#pragma once

#include <cstdint>

#include "md/topology.h"

namespace gmd::md {

// ucs_topo_find_device_by_bus_id; false (debug log) when UCX refuses the address.
bool ucsSysDeviceLookup(const topology::PciAddress& address, std::uint8_t* sys_device) noexcept;

// The process-wide instance: sysfs at /sys, UCX's registry.
topology::SysDevices& sysDevices() noexcept;

}  // namespace gmd::md
