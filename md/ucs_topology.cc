// UCX's topology registry behind topology::SysDevices.
#include "md/ucs_topology.h"

#include <ucs/debug/log_def.h>
#include <ucs/sys/topo/base/topo.h>

namespace gmd::md {

static_assert(topology::kUnknownSysDevice == UCS_SYS_DEVICE_ID_UNKNOWN);
static_assert(sizeof(ucs_sys_device_t) == sizeof(std::uint8_t));

bool ucsSysDeviceLookup(const topology::PciAddress& a, std::uint8_t* sys_device) noexcept {
  ucs_sys_bus_id_t bus_id = {};
  bus_id.domain = a.domain;
  bus_id.bus = a.bus;
  bus_id.slot = a.slot;
  bus_id.function = a.function;
  ucs_sys_device_t sys = UCS_SYS_DEVICE_ID_UNKNOWN;
  const ucs_status_t status = ucs_topo_find_device_by_bus_id(&bus_id, &sys);
  if (status != UCS_OK) {
    ucs_debug("gmd: no UCX system device for PCI %04x:%02x:%02x.%x: %s", a.domain, a.bus, a.slot,
              a.function, ucs_status_string(status));
    return false;
  }
  *sys_device = sys;
  return true;
}

topology::SysDevices& sysDevices() noexcept {
  static topology::SysDevices devices("/sys", &ucsSysDeviceLookup);
  return devices;
}

}  // namespace gmd::md
