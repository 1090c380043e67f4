// The UCX edge: where gmd's implementations of an MD, a component and a transport meet the ops
// tables of the UCX generation it is built for (md/ucx_abi.h). There are two of each: the verbs MD
// with gmd_rc (md/md.cc, md/rc/), and the CUDA copy MD with gmd_copy (md/copy/).
//
// An MD implements its operations once, in UCX 1.13's terms (MdImpl). md/abi/edge_md.cc builds the
// generation's MD ops table from one, one thin adapter per signature UCX has used (overloads and
// templates: the table's slot type picks the adapter at compile time; the implementation is a
// template parameter, so each MD gets its own table); md/abi/edge_iface.cc does the same for each
// transport's iface internal ops. A new release whose slots
// only take shapes seen before needs no change here, only its lines in md/abi/layout.h.
//
// Thread safety: the tables are immutable after static initialisation; the adapters are as
// thread-safe as the operations they forward to.
#pragma once

#include <cstdint>

#include "md/ucx_abi.h"

namespace gmd::md {

// The generation-neutral MD operations (md/md.cc).
struct MdImpl {
  void (*close)(uct_md_h md);
  ucs_status_t (*query)(uct_md_h md, uct_md_attr_t* attr);  // the public v1 attributes
  ucs_status_t (*mem_reg)(uct_md_h md, void* address, size_t length, unsigned flags,
                          uct_mem_h* memh_p);
  ucs_status_t (*mem_dereg)(uct_md_h md, const ucx::DeregParams* params);
  ucs_status_t (*mem_query)(uct_md_h md, const void* address, size_t length,
                            uct_md_mem_attr_t* attr);
  ucs_status_t (*mkey_pack)(uct_md_h md, uct_mem_h memh, void* rkey_buffer);
  ucs_status_t (*detect_memory_type)(uct_md_h md, const void* address, size_t length,
                                     ucs_memory_type_t* mem_type_p);
  // mem_reg with the caller's dma-buf of the memory (UCX 1.14 on): `address` is at byte `offset`
  // of `fd`, which stays the caller's.
  ucs_status_t (*mem_reg_dmabuf)(uct_md_h md, void* address, size_t length, unsigned flags, int fd,
                                 size_t offset, uct_mem_h* memh_p) = nullptr;
  // mem_query's mem_flags (UCX 1.22 on) for memory of mem_type; nullptr answers 0.
  std::uint8_t (*mem_flags)(uct_md_h md, ucs_memory_type_t mem_type) = nullptr;
};
const MdImpl& mdImpl() noexcept;  // md/md.cc

// The MD ops table of this build's UCX generation (md/abi/edge_md.cc).
ucx::MdOps* mdOps() noexcept;

}  // namespace gmd::md

namespace gmd::md::rc {

// The internal-ops table gmd_rc's ifaces hand to libuct: libuct's default one up to 1.15, gmd_rc's
// own from 1.16 (md/abi/edge_iface.cc).
ucx::IfaceInternalOps* ifaceInternalOps() noexcept;

// Sets the uct_iface_attr_t fields that only some generations have (ctl_device from 1.22).
void finishIfaceAttr(uct_iface_attr_t* attr) noexcept;

}  // namespace gmd::md::rc

namespace gmd::md::copy {

// The CUDA copy MD's operations (md/copy/copy_md.cc) and its generation's ops table.
const MdImpl& mdImpl() noexcept;
ucx::MdOps* mdOps() noexcept;

// gmd_copy's internal-ops table (libuct's default one up to 1.15, its own from 1.16).
ucx::IfaceInternalOps* ifaceInternalOps() noexcept;

}  // namespace gmd::md::copy
