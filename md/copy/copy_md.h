// The component `gmd_copy` and its one memory domain `gmd_cuda`: what lets UCP copy between host
// and CUDA memory on a UCX built without CUDA (docs/gpu.md).
//
// UCP builds its memory-type copy endpoint only from transports whose MD has the memory type in
// access_mem_types. This MD says CUDA and CUDA_MANAGED there (and in detect_mem_types), registers
// host and CUDA memory without doing anything (REG without NEED_MEMH or NEED_RKEY: UCP skips
// registration for the copy lane, remote keys are empty), and answers mem_query through memtype/'s
// Classifier. Its one transport, gmd_copy (md/copy/copy_iface.h), copies through memtype's Copier.
// The resource exists only when memtype/ finds a CUDA driver with a device.
//
// Thread safety: the MD holds no mutable state; every op may be called from any thread.
#pragma once

#include "md/ucx_abi.h"

namespace gmd::md::copy {

inline constexpr const char* kComponentName = "gmd_copy";
inline constexpr const char* kMdName = "gmd_cuda";

// What UCX holds as uct_md_h.
struct CopyMd {
  ucx::MdHeader header;
};

// The MD configuration: no variables of its own (prefix UCX_GMD_COPY_, shared with the transport).
struct MdConfig {
  ucx::MdConfigBase super;
};

// The component descriptor; registerComponent() links it and its transport into libuct. Called
// once, from the module's constructor after the load-time check (md/component.cc).
ucx::Component* component() noexcept;
void registerComponent() noexcept;

}  // namespace gmd::md::copy
