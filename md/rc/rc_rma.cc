// Small RMA of a gmd_rc endpoint (declared in md/rc/rc_ep.h): put_short, put_bcopy, get_bcopy, and
// their limits in the iface attributes. Zero-copy put/get are in md/rc/rc_ep.cc.
//
// put_short is an inline RDMA WRITE when the device takes the bytes inline, else a WRITE from a send
// bounce buffer (the data is copied either way: UCS_OK at once). put_bcopy packs into a bounce buffer
// and writes from it. get_bcopy READs into a bounce buffer; the ring slot (md/rc/rc_ep.h, Slot) holds
// the caller's unpack callback, called with the data when the READ completed successfully and before
// the completion. A failed READ completes with its error and unpacks nothing. Work requests that
// unpack are always signaled: after a failure, a later flush error retires the unsignaled requests
// before it as done, which they may not be.
//
// Caller mistakes (a length above the advertised limit, a packer that wrote more than max_bcopy)
// return UCS_ERR_INVALID_PARAM before anything is posted, with one error-level line ("Invalid
// length"), as UCX's own transports log them when built with parameter checks.
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cstring>

#include "md/rc/rc_ep.h"
#include "md/rc/rc_iface.h"

namespace gmd::md::rc {
namespace {

// A put_short too long to go inline goes through a bounce buffer up to this size.
constexpr std::size_t kPutShortViaBounce = 256;

ibv_send_wr rdmaWr(ibv_wr_opcode opcode, ibv_sge* sge, std::size_t length,
                   std::uint64_t remote_addr, uct_rkey_t rkey, bool inl) noexcept {
  ibv_send_wr wr{};
  wr.opcode = opcode;
  wr.send_flags = inl ? static_cast<unsigned>(IBV_SEND_INLINE) : 0u;
  wr.sg_list = sge;
  wr.num_sge = length == 0 ? 0 : 1;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = static_cast<std::uint32_t>(rkey);
  return wr;
}

}  // namespace

std::size_t Iface::putMaxShort() const noexcept {
  return std::min(std::max(tx_inline_, kPutShortViaBounce), limits_.seg_size);
}

std::size_t Iface::putMaxBcopy() const noexcept {
  return static_cast<std::size_t>(std::min<std::uint64_t>(limits_.seg_size, limits_.max_msg));
}

std::size_t Iface::getMaxBcopy() const noexcept {
  // One READ into one bounce buffer.
  return std::min(putMaxBcopy(), readSize());
}

void Iface::queryRma(uct_iface_attr_t* attr) const noexcept {
  attr->cap.put.max_short = putMaxShort();
  attr->cap.put.max_bcopy = putMaxBcopy();
  attr->cap.get.max_short = 0;
  attr->cap.get.max_bcopy = getMaxBcopy();
  attr->cap.flags |= UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY | UCT_IFACE_FLAG_GET_BCOPY;
}

ucs_status_t Ep::putShort(const void* buffer, unsigned length, std::uint64_t remote_addr,
                          uct_rkey_t rkey) noexcept {
  if (length > iface_->putMaxShort()) {
    ucs_error("gmd_rc: put_short: Invalid length %u, at most %zu bytes", length,
              iface_->putMaxShort());
    return UCS_ERR_INVALID_PARAM;
  }
  const bool inl = length <= iface_->txInline();
  if (ucs_status_t st = reserve(false, !inl); st != UCS_OK) return st;
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer), length, 0};
  std::int32_t bounce = -1;
  if (!inl) {
    const std::uint32_t b = iface_->bounce_.get();
    std::memcpy(iface_->bounce_.buffer(b), buffer, length);
    sge = {reinterpret_cast<std::uintptr_t>(iface_->bounce_.buffer(b)), length,
           iface_->bounce_.lkey()};
    bounce = static_cast<std::int32_t>(b);
  }
  ibv_send_wr wr = rdmaWr(IBV_WR_RDMA_WRITE, &sge, length, remote_addr, rkey, inl);
  const ucs_status_t st = post(wr, nullptr, bounce);
  if (st == UCS_INPROGRESS) return UCS_OK;  // the data is copied
  if (bounce >= 0) iface_->releaseBounce(static_cast<std::uint32_t>(bounce));
  return st;
}

ssize_t Ep::putBcopy(uct_pack_callback_t pack, void* arg, std::uint64_t remote_addr,
                     uct_rkey_t rkey) noexcept {
  if (ucs_status_t st = reserve(false, true); st != UCS_OK) return st;
  const std::uint32_t b = iface_->bounce_.get();
  std::uint8_t* buf = iface_->bounce_.buffer(b);
  const std::size_t len = pack(buf, arg);
  if (len > iface_->putMaxBcopy()) {
    iface_->releaseBounce(b);
    ucs_error("gmd_rc: put_bcopy: Invalid length %zu packed, at most %zu bytes", len,
              iface_->putMaxBcopy());
    return UCS_ERR_INVALID_PARAM;
  }
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), static_cast<std::uint32_t>(len),
              iface_->bounce_.lkey()};
  // Small enough to go inline: the buffer is free again at once.
  const bool inl = len <= iface_->txInline();
  ibv_send_wr wr = rdmaWr(IBV_WR_RDMA_WRITE, &sge, len, remote_addr, rkey, inl);
  const ucs_status_t st = post(wr, nullptr, inl ? -1 : static_cast<std::int32_t>(b));
  if (inl || st != UCS_INPROGRESS) iface_->releaseBounce(b);
  return st == UCS_INPROGRESS ? static_cast<ssize_t>(len) : static_cast<ssize_t>(st);
}

ucs_status_t Ep::getBcopy(uct_unpack_callback_t unpack, void* arg, std::size_t length,
                          std::uint64_t remote_addr, uct_rkey_t rkey,
                          uct_completion_t* comp) noexcept {
  if (length > iface_->getMaxBcopy()) {
    ucs_error("gmd_rc: get_bcopy: Invalid length %zu, at most %zu bytes", length,
              iface_->getMaxBcopy());
    return UCS_ERR_INVALID_PARAM;
  }
  if (ucs_status_t st = reserve(false, true); st != UCS_OK) return st;
  const std::uint32_t b = iface_->bounce_.get();
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(iface_->bounce_.buffer(b)),
              static_cast<std::uint32_t>(length), iface_->bounce_.lkey()};
  ibv_send_wr wr = rdmaWr(IBV_WR_RDMA_READ, &sge, length, remote_addr, rkey, false);
  wr.send_flags |= IBV_SEND_SIGNALED;  // its own status decides the unpack (see the file comment)
  const ucs_status_t st = post(wr, comp, static_cast<std::int32_t>(b));
  if (st != UCS_INPROGRESS) {
    iface_->releaseBounce(b);
    return st;
  }
  Slot& slot = newestSlot();
  slot.unpack = unpack;
  slot.unpack_arg = arg;
  slot.length = static_cast<std::uint32_t>(length);
  return UCS_INPROGRESS;
}

}  // namespace gmd::md::rc
