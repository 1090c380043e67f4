// 64-bit atomics of a gmd_rc endpoint (declared in md/rc/rc_ep.h) and their iface attributes.
//
// Verbs offers two atomics, both 64-bit and both fetching: FETCH_AND_ADD and CMP_AND_SWP. gmd_rc
// exposes exactly those: atomic64_post ADD (a fetch-add whose result is discarded), atomic64_fetch
// FADD, atomic_cswap64. Swap, and/or/xor and every 32-bit operation return UCS_ERR_UNSUPPORTED and are
// not advertised, so UCP uses its software atomics over active messages for them (its AMO lane needs
// the full set).
//
// The old value lands in an 8-byte slice of a send bounce buffer (registered, local write); the ring
// slot (md/rc/rc_ep.h, Slot) copies it to the caller's result when the work request completed
// successfully, before the completion is called. Verbs returns it in host byte order (rdma_rxe
// converts the network-order reply of the responder; UCX's rc_verbs does not swap either).
//
// UCT_IFACE_FLAG_ATOMIC_DEVICE and the op flags are advertised only when the device reports atomic
// support (ibv_device_attr.atomic_cap other than IBV_ATOMIC_NONE); the target memory must be
// registered with UCT_MD_MEM_ACCESS_REMOTE_ATOMIC (md/mapping.cc adds IBV_ACCESS_REMOTE_ATOMIC).
//
// Caller mistakes (an unsupported opcode, a remote address that is not 8-byte aligned) return their
// status before anything is posted, logged at debug level.
#include <ucs/debug/log_def.h>
#include <ucs/sys/compiler_def.h>

#include <cstring>

#include "md/md.h"
#include "md/rc/rc_ep.h"
#include "md/rc/rc_iface.h"

namespace gmd::md::rc {
namespace {

constexpr std::uint32_t kAtomicSize = sizeof(std::uint64_t);

// The unpack of a fetching atomic: the old value into the caller's result.
void copyResult(void* result, const void* data, std::size_t length) noexcept {
  std::memcpy(result, data, length);
}

ucs_status_t unsupported(const char* what, unsigned opcode) noexcept {
  ucs_debug("gmd_rc: %s of atomic op %u is not supported (verbs: fetch-add and compare-swap)",
            what, opcode);
  return UCS_ERR_UNSUPPORTED;
}

}  // namespace

bool Iface::hasAtomics() const noexcept { return md_->deviceAttr().atomic_cap != IBV_ATOMIC_NONE; }

void Iface::queryAtomics(uct_iface_attr_t* attr) const noexcept {
  if (!hasAtomics()) return;
  attr->cap.atomic64.op_flags = UCS_BIT(UCT_ATOMIC_OP_ADD);
  attr->cap.atomic64.fop_flags = UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_CSWAP);
  attr->cap.flags |= UCT_IFACE_FLAG_ATOMIC_DEVICE;
}

ucs_status_t Ep::postAtomic(ibv_wr_opcode opcode, std::uint64_t compare_add, std::uint64_t swap,
                            std::uint64_t remote_addr, uct_rkey_t rkey, std::uint64_t* result,
                            uct_completion_t* comp) noexcept {
  if (!iface_->hasAtomics()) {
    ucs_debug("gmd_rc %s: the device offers no atomics", iface_->name());
    return UCS_ERR_UNSUPPORTED;
  }
  if (remote_addr % kAtomicSize != 0) {
    ucs_debug("gmd_rc: atomic on remote address 0x%llx, not 8-byte aligned",
              static_cast<unsigned long long>(remote_addr));
    return UCS_ERR_INVALID_PARAM;
  }
  if (ucs_status_t st = reserve(false, true); st != UCS_OK) return st;
  const std::uint32_t b = iface_->bounce_.get();
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(iface_->bounce_.buffer(b)), kAtomicSize,
              iface_->bounce_.lkey()};
  ibv_send_wr wr{};
  wr.opcode = opcode;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.atomic.remote_addr = remote_addr;
  wr.wr.atomic.compare_add = compare_add;
  wr.wr.atomic.swap = swap;
  wr.wr.atomic.rkey = static_cast<std::uint32_t>(rkey);
  if (result != nullptr) wr.send_flags = IBV_SEND_SIGNALED;  // see md/rc/rc_rma.cc
  const ucs_status_t st = post(wr, comp, static_cast<std::int32_t>(b));
  if (st != UCS_INPROGRESS) {
    iface_->releaseBounce(b);
    return st;
  }
  if (result != nullptr) {
    Slot& slot = newestSlot();
    slot.unpack = copyResult;
    slot.unpack_arg = result;
    slot.length = kAtomicSize;
  }
  return UCS_INPROGRESS;
}

ucs_status_t Ep::atomic64Post(unsigned opcode, std::uint64_t value, std::uint64_t remote_addr,
                              uct_rkey_t rkey) noexcept {
  if (opcode != UCT_ATOMIC_OP_ADD) return unsupported("atomic64_post", opcode);
  const ucs_status_t st =
      postAtomic(IBV_WR_ATOMIC_FETCH_AND_ADD, value, 0, remote_addr, rkey, nullptr, nullptr);
  return st == UCS_INPROGRESS ? UCS_OK : st;  // posted: flush tells when it is done
}

ucs_status_t Ep::atomic64Fetch(unsigned opcode, std::uint64_t value, std::uint64_t* result,
                               std::uint64_t remote_addr, uct_rkey_t rkey,
                               uct_completion_t* comp) noexcept {
  if (opcode != UCT_ATOMIC_OP_ADD) return unsupported("atomic64_fetch", opcode);
  return postAtomic(IBV_WR_ATOMIC_FETCH_AND_ADD, value, 0, remote_addr, rkey, result, comp);
}

ucs_status_t Ep::atomicCswap64(std::uint64_t compare, std::uint64_t swap,
                               std::uint64_t remote_addr, uct_rkey_t rkey, std::uint64_t* result,
                               uct_completion_t* comp) noexcept {
  return postAtomic(IBV_WR_ATOMIC_CMP_AND_SWP, compare, swap, remote_addr, rkey, result, comp);
}

}  // namespace gmd::md::rc
