// The MD ops tables for this build's UCX generation, adapted to an MD implementation (md/md.cc's,
// md/copy/copy_md.cc's; md/abi/edge.h). Each adapter below matches one signature a slot has had in
// some UCX release; the slot's type in md/abi/ucx_<major>_<minor>.h picks it. Slots only some
// generations have are filled when the table has them.
#include <ucs/debug/log_def.h>
#include <ucs/memory/memory_type.h>

#include <cstring>

#include "md/abi/edge.h"
#include "md/md.h"

namespace gmd::md {
namespace {

#if UCT_VERNO_MAJOR == 1 && UCT_VERNO_MINOR >= 22
static_assert(kMemFlagRegistrable == UCS_MEM_FLAG_REGISTRABLE, "UCX 1.22 UCS_MEM_FLAG_REGISTRABLE");
#endif

// The adapters of one MD implementation (Impl: md/md.cc's mdImpl, md/copy/copy_md.cc's
// copy::mdImpl); each static member matches one signature a slot has had.
template <const MdImpl& (*Impl)() noexcept>
struct Edge {
  static void close(uct_md_h md) { Impl().close(md); }

  // query: the public attributes (1.13).
  [[maybe_unused]] static ucs_status_t query(uct_md_h md, uct_md_attr_t* attr) {
    return Impl().query(md, attr);
  }

  // query: uct_md_attr_v2_t (1.14 on). Filled from the public attributes, plus what only v2 has.
  template <typename Attr>
  static ucs_status_t query(uct_md_h md, Attr* attr) {
    uct_md_attr_t v1;
    if (const ucs_status_t st = Impl().query(md, &v1); st != UCS_OK) return st;
    const std::uint64_t mask = attr->field_mask;
    std::memset(attr, 0, sizeof(*attr));
    attr->field_mask = mask;
    attr->max_alloc = v1.cap.max_alloc;
    attr->max_reg = v1.cap.max_reg;
    attr->flags = v1.cap.flags;
    // UCP from 1.15 on tests the v2 flag for endpoints with peer error handling.
    if constexpr (ucx::kMdInvalidateRma) {
      if (v1.cap.flags & UCT_MD_FLAG_INVALIDATE) attr->flags |= Attr::kFlagInvalidateRma;
    }
    attr->reg_mem_types = v1.cap.reg_mem_types;
    if constexpr (requires { attr->reg_nonblock_mem_types; }) attr->reg_nonblock_mem_types = 0;
    // Registrations may be cached by the caller (gmd invalidates its own on unmap and CUDA free as
    // well): UCP from 1.16 registers through its cache, and its datatype iterator takes only MDs
    // that allow it.
    attr->cache_mem_types = v1.cap.reg_mem_types;
    if constexpr (requires { attr->gva_mem_types; }) attr->gva_mem_types = 0;
    attr->detect_mem_types = v1.cap.detect_mem_types;
    attr->alloc_mem_types = v1.cap.alloc_mem_types;
    attr->access_mem_types = v1.cap.access_mem_types;
    attr->dmabuf_mem_types = 0;
    attr->reg_cost = v1.reg_cost;
    std::memcpy(attr->component_name, v1.component_name, sizeof(attr->component_name));
    attr->rkey_packed_size = v1.rkey_packed_size;
    attr->local_cpus = v1.local_cpus;
    attr->exported_mkey_packed_size = 0;
    if constexpr (requires { attr->reg_alignment; }) {
      // Any byte range registers (ibv_reg_mr pins whole pages itself).
      attr->reg_alignment = 1;
    }
    if constexpr (requires { attr->required_mem_flags; }) attr->required_mem_flags = 0;
    return UCS_OK;
  }

  // mem_alloc: gmd allocates nothing. Without (up to 1.18) and with (1.19 on) a system device.
  [[maybe_unused]] static ucs_status_t memAlloc(uct_md_h, size_t*, void**, ucs_memory_type_t,
                                                unsigned, const char*, uct_mem_h*) {
    return UCS_ERR_UNSUPPORTED;
  }
  [[maybe_unused]] static ucs_status_t memAlloc(uct_md_h, size_t*, void**, ucs_memory_type_t,
                                                ucs_sys_device_t, unsigned, const char*,
                                                uct_mem_h*) {
    return UCS_ERR_UNSUPPORTED;
  }
  static ucs_status_t memFree(uct_md_h, uct_mem_h) { return UCS_ERR_UNSUPPORTED; }
  static ucs_status_t memAdvise(uct_md_h, uct_mem_h, void*, size_t, unsigned) {
    return UCS_ERR_UNSUPPORTED;
  }

  // mem_reg: flags (1.13), a parameter struct (1.14 on).
  [[maybe_unused]] static ucs_status_t memReg(uct_md_h md, void* address, size_t length,
                                              unsigned flags, uct_mem_h* memh_p) {
    return Impl().mem_reg(md, address, length, flags, memh_p);
  }
  template <typename Params>
  static ucs_status_t memReg(uct_md_h md, void* address, size_t length, const Params* params,
                             uct_mem_h* memh_p) {
    if (params == nullptr) return UCS_ERR_INVALID_PARAM;
    const int fd = (params->field_mask & Params::kFieldDmabufFd) ? params->dmabuf_fd
                                                                  : Params::kDmabufFdInvalid;
    std::uint64_t flags = (params->field_mask & Params::kFieldFlags) ? params->flags : 0;
    if (flags & Params::kFlagGva) return UCS_ERR_UNSUPPORTED;
    // A hint: gmd's remote keys are the device's, equal only when the device makes them so.
    flags &= ~Params::kFlagSymmetricRkey;
    // Newer UCP registers ucp_mem_map buffers without access flags (1.23 does, for ucp_perftest's):
    // UCX's own MDs grant every access then, and so does gmd.
    if ((flags & UCT_MD_MEM_ACCESS_ALL) == 0) flags |= UCT_MD_MEM_ACCESS_ALL;
    // Every UCT_MD_MEM_* flag fits the 32 bits the registrar takes; one beyond them is refused
    // there.
    const unsigned narrow = static_cast<unsigned>(flags) | (flags >> 32 != 0 ? 1u << 31 : 0u);
    if (fd != Params::kDmabufFdInvalid) {
      // Given where gmd advertises UCT_MD_FLAG_REG_DMABUF (md/md.cc).
      if (Impl().mem_reg_dmabuf == nullptr) return UCS_ERR_UNSUPPORTED;
      const size_t offset =
          (params->field_mask & Params::kFieldDmabufOffset) ? params->dmabuf_offset : 0;
      return Impl().mem_reg_dmabuf(md, address, length, narrow, fd, offset, memh_p);
    }
    return Impl().mem_reg(md, address, length, narrow, memh_p);
  }

  static ucs_status_t memDereg(uct_md_h md, const ucx::DeregParams* params) {
    return Impl().mem_dereg(md, params);
  }

  // mem_query: the public attributes (up to 1.21), their v2 extension (1.22 on).
  [[maybe_unused]] static ucs_status_t memQuery(uct_md_h md, const void* address, size_t length,
                                                uct_md_mem_attr_t* attr) {
    return Impl().mem_query(md, address, length, attr);
  }
  template <typename Attr>
  static ucs_status_t memQuery(uct_md_h md, const void* address, size_t length, Attr* attr) {
    uct_md_mem_attr_t v1{};
    v1.field_mask = attr->field_mask &
                    (UCT_MD_MEM_ATTR_FIELD_MEM_TYPE | UCT_MD_MEM_ATTR_FIELD_SYS_DEV |
                     UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS | UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH);
    // The flags depend on the memory type: classify even when the caller did not ask for it.
    if (attr->field_mask & Attr::kFieldMemFlags) v1.field_mask |= UCT_MD_MEM_ATTR_FIELD_MEM_TYPE;
    if (const ucs_status_t st = Impl().mem_query(md, address, length, &v1); st != UCS_OK) {
      return st;
    }
    if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_MEM_TYPE) attr->mem_type = v1.mem_type;
    if (v1.field_mask & UCT_MD_MEM_ATTR_FIELD_SYS_DEV) attr->sys_dev = v1.sys_dev;
    if (v1.field_mask & UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS) attr->base_address = v1.base_address;
    if (v1.field_mask & UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH) attr->alloc_length = v1.alloc_length;
    if (attr->field_mask & Attr::kFieldDmabufFd) attr->dmabuf_fd = Attr::kDmabufFdInvalid;
    if (attr->field_mask & Attr::kFieldDmabufOffset) attr->dmabuf_offset = 0;
    // UCS_MEM_FLAG_REGISTRABLE where this MD registers the memory: UCP (1.22 on) maps a buffer
    // only on MDs whose required_mem_flags its detected flags cover, and UCX's IB MD requires
    // this one.
    if (attr->field_mask & Attr::kFieldMemFlags) {
      attr->mem_flags = Impl().mem_flags != nullptr ? Impl().mem_flags(md, v1.mem_type) : 0;
    }
    return UCS_OK;
  }

  // mkey_pack: without (up to 1.15) and with (1.16 on) the address range; the key covers the
  // handle.
  [[maybe_unused]] static ucs_status_t mkeyPack(uct_md_h md, uct_mem_h memh,
                                                const ucx::MkeyPackParams*, void* buffer) {
    return Impl().mkey_pack(md, memh, buffer);
  }
  [[maybe_unused]] static ucs_status_t mkeyPack(uct_md_h md, uct_mem_h memh, void*, size_t,
                                                const ucx::MkeyPackParams*, void* buffer) {
    return Impl().mkey_pack(md, memh, buffer);
  }

  // mem_attach (1.14 on): gmd exports no memory keys.
  template <typename Params>
  static ucs_status_t memAttach(uct_md_h, const void*, Params*, uct_mem_h*) {
    return UCS_ERR_UNSUPPORTED;
  }

  [[maybe_unused]] static int isSockaddrAccessible(uct_md_h, const ucs_sock_addr_t*,
                                                   uct_sockaddr_accessibility_t) {
    return 0;
  }

  static ucs_status_t detectMemoryType(uct_md_h md, const void* address, size_t length,
                                       ucs_memory_type_t* mem_type_p) {
    return Impl().detect_memory_type(md, address, length, mem_type_p);
  }

  // mem_elem_pack (device-side memory elements): not offered. 1.21-1.22 without, 1.23 with a
  // release handle.
  [[maybe_unused]] static ucs_status_t memElemPack(uct_md_h, uct_mem_h, uct_rkey_t, void*) {
    return UCS_ERR_UNSUPPORTED;
  }
  [[maybe_unused]] static ucs_status_t memElemPack(uct_md_h, uct_mem_h, uct_rkey_t, void*, void**) {
    return UCS_ERR_UNSUPPORTED;
  }
  [[maybe_unused]] static void memElemRelease(uct_md_h, void*) {}

  // Trailing slots a later release of the same generation may add (called as anything, they only
  // return an error code: UCX's status and ssize_t returns read it as UCS_ERR_UNSUPPORTED).
  [[maybe_unused]] static long spareSlot() { return UCS_ERR_UNSUPPORTED; }
};

template <typename Ops, const MdImpl& (*Impl)() noexcept>
constexpr Ops makeMdOps() {
  using E = Edge<Impl>;
  Ops ops{};
  ops.close = E::close;
  ops.query = E::query;
  ops.mem_alloc = E::memAlloc;
  ops.mem_free = E::memFree;
  ops.mem_advise = E::memAdvise;
  ops.mem_reg = E::memReg;
  ops.mem_dereg = E::memDereg;
  ops.mem_query = E::memQuery;
  ops.mkey_pack = E::mkeyPack;
  if constexpr (requires { ops.mem_attach; }) ops.mem_attach = E::memAttach;
  if constexpr (requires { ops.is_sockaddr_accessible; }) {
    ops.is_sockaddr_accessible = E::isSockaddrAccessible;
  }
  ops.detect_memory_type = E::detectMemoryType;
  if constexpr (requires { ops.mem_elem_pack; }) ops.mem_elem_pack = E::memElemPack;
  if constexpr (requires { ops.mem_elem_release; }) ops.mem_elem_release = E::memElemRelease;
  if constexpr (requires { ops.spare; }) {
    for (auto& slot : ops.spare) slot = E::spareSlot;
  }
  return ops;
}

template <const MdImpl& (*Impl)() noexcept>
constinit ucx::MdOps g_md_ops = makeMdOps<ucx::MdOps, Impl>();

}  // namespace

ucx::MdOps* mdOps() noexcept { return &g_md_ops<mdImpl>; }

ucx::MdOps* copy::mdOps() noexcept { return &g_md_ops<copy::mdImpl>; }

}  // namespace gmd::md
