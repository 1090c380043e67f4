// A gmd memory domain: one verbs device, its protection domain, and a Registrar (registration cache +
// backends) fed by libucm unmap events and CUDA free hooks.
//
// Thread safety: the UCX MD ops may be called from any thread, except close (no other call may be in
// flight, as UCX requires).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

#include "md/device_events.h"
#include "md/gpudirect.h"
#include "md/md_config.h"
#include "md/registrar.h"
#include "md/ucx_abi.h"
#include "md/verbs_backend.h"
#include "rcache/rcache.h"

namespace gmd::md {

class Md;

// What UCX holds as uct_md_h: UCX's MD header first, then a pointer to the C++ object.
struct MdHandle {
  ucx::MdHeader header;
  Md* md;
};

class Md {
 public:
  // Opens device `name` (an ibv device name). Logs and returns a status on failure.
  static ucs_status_t open(ucx::Component* component, const char* name, const MdConfig& config,
                           uct_md_h* md_p) noexcept;
  ~Md();

  static Md* from(uct_md_h md) noexcept { return reinterpret_cast<MdHandle*>(md)->md; }
  uct_md_h handle() noexcept { return reinterpret_cast<uct_md_h>(&handle_); }

  const std::string& name() const noexcept { return name_; }
  ibv_context* context() const noexcept { return ctx_; }
  ibv_pd* pd() const noexcept { return pd_; }
  Registrar& registrar() noexcept { return *registrar_; }
  const MdConfig& config() const noexcept { return config_; }
  const ibv_device_attr& deviceAttr() const noexcept { return dev_attr_; }
  // The device context's async events, shared by every iface on this MD.
  DeviceEvents& events() noexcept { return events_; }
  // Whether device memory registrations here take the caller's dma-buf (GpuDirectBackend).
  bool takesDmabuf() noexcept { return cuda_backend_ != nullptr && cuda_backend_->takesDmabuf(); }

 private:
  Md() = default;
  MdHandle handle_{};
  std::string name_;
  MdConfig config_{};
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_device_attr dev_attr_{};
  DeviceEvents events_;
  std::unique_ptr<VerbsBackend> host_backend_;
  std::unique_ptr<GpuDirectBackend> cuda_backend_;
  std::unique_ptr<Registrar> registrar_;
  std::unique_ptr<rcache::Monitor> cpu_monitor_;
  bool cpu_subscribed_ = false;
  bool cuda_subscribed_ = false;
};

// The gmd component (md/component.cc).
ucx::Component* component() noexcept;

// Routes gmd's logger (common/log.h) to UCX's, level for level (every MD open calls it).
void useUcxLogger() noexcept;

// The memory types an MD with this registrar registers (reg_mem_types): host; CUDA when it has a
// GPUDirect backend (md/gpudirect.h: a method on every GPU for this NIC); CUDA managed under
// UCX_GMD_CUDA_MANAGED=host-pages with a driver.
std::uint64_t regMemTypes(const Registrar& registrar) noexcept;

// UCS_MEM_FLAG_REGISTRABLE (ucs/memory/memory_type.h from UCX 1.22; md/abi/edge_md.cc checks it).
inline constexpr std::uint8_t kMemFlagRegistrable = 1u << 0;

// mem_query's mem_flags (UCX 1.22 on) for memory of `type`: kMemFlagRegistrable when this MD
// registers that type (it is in reg_mem_types), as UCX's IB MD requires of the memory it registers
// (required_mem_flags); 0 otherwise, unknown types included.
std::uint8_t memFlags(std::uint64_t reg_mem_types, ucs_memory_type_t type) noexcept;

}  // namespace gmd::md
