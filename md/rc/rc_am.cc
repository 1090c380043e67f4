// Active messages of a gmd_rc endpoint (declared in md/rc/rc_ep.h): am_short, am_short_iov,
// am_bcopy, am_zcopy, and the sender's side of the credits. The receiving side is md/rc/rc_recv.cc.
//
// Caller mistakes (an AM id out of range, a header, iov count or payload above the advertised
// limits) return UCS_ERR_INVALID_PARAM before anything is posted, with one error-level line ("Invalid
// active message id", "Invalid length", "Invalid iov count"), as UCX's own transports log them when
// built with parameter checks (Debian's UCX is).
#include <arpa/inet.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cstring>

#include "md/rc/rc_ep.h"
#include "md/rc/rc_iface.h"
#include "md/rc/rc_wire.h"

namespace gmd::md::rc {
namespace {

constexpr unsigned kInline = IBV_SEND_INLINE;

ucs_status_t checkId(std::uint8_t id) noexcept {
  if (id < UCT_AM_ID_MAX) return UCS_OK;
  ucs_error("gmd_rc: Invalid active message id %u (ids go from 0 to %u)", id,
            static_cast<unsigned>(UCT_AM_ID_MAX - 1));
  return UCS_ERR_INVALID_PARAM;
}

}  // namespace

ucs_status_t Ep::sendAm(std::uint8_t id, ibv_sge* sge, int nsge, unsigned send_flags,
                        uct_completion_t* comp, std::int32_t bounce) noexcept {
  Imm imm;
  imm.kind = id;
  const bool was_requested = fc_requested_;
  if (!fc_requested_ && fc_credits_ - 1 <= iface_->limits_.fc_wnd / 2) {
    imm.request = true;
    fc_requested_ = true;
  }
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = send_flags;
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.imm_data = htonl(packImm(imm));
  const ucs_status_t st = post(wr, comp, bounce);
  if (st != UCS_INPROGRESS) {
    fc_requested_ = was_requested;
    return st;
  }
  --fc_credits_;
  return UCS_INPROGRESS;
}

void Ep::creditsGranted(unsigned credits) noexcept {
  fc_credits_ += credits;
  fc_requested_ = false;
  if (!pending_.empty() && !in_pending_list_ && canPost()) iface_->schedulePending(this);
}

ucs_status_t Ep::amShortPieces(std::uint8_t id, const Piece* pieces, std::size_t n,
                               std::size_t total) noexcept {
  if (ucs_status_t st = checkId(id); st != UCS_OK) return st;
  if (total > iface_->amMaxShort()) {
    ucs_error("gmd_rc: am_short: Invalid length %zu, at most %zu bytes (am_short: 8-byte header "
              "included)", total, iface_->amMaxShort());
    return UCS_ERR_INVALID_PARAM;
  }
  const bool inl = total <= iface_->txInline() && n <= iface_->limits_.qp.max_send_sge;
  if (ucs_status_t st = reserve(true, !inl); st != UCS_OK) return st;
  ibv_sge sge[kMaxSge];
  int nsge = 0;
  std::int32_t bounce = -1;
  if (inl) {
    for (std::size_t i = 0; i < n; ++i) {
      if (pieces[i].length == 0) continue;
      sge[nsge++] = {reinterpret_cast<std::uintptr_t>(pieces[i].data),
                     static_cast<std::uint32_t>(pieces[i].length), 0};
    }
  } else {
    const std::uint32_t b = iface_->bounce_.get();
    std::uint8_t* p = iface_->bounce_.buffer(b);
    for (std::size_t i = 0; i < n; ++i) {
      std::memcpy(p, pieces[i].data, pieces[i].length);
      p += pieces[i].length;
    }
    bounce = static_cast<std::int32_t>(b);
    sge[nsge++] = {reinterpret_cast<std::uintptr_t>(iface_->bounce_.buffer(b)),
                   static_cast<std::uint32_t>(total), iface_->bounce_.lkey()};
  }
  const ucs_status_t st = sendAm(id, sge, nsge, inl ? kInline : 0u, nullptr, bounce);
  if (st == UCS_INPROGRESS) return UCS_OK;  // the data is copied
  if (bounce >= 0) iface_->releaseBounce(static_cast<std::uint32_t>(bounce));
  return st;
}

ucs_status_t Ep::amShort(std::uint8_t id, std::uint64_t header, const void* payload,
                         unsigned length) noexcept {
  const Piece pieces[2] = {{&header, sizeof(header)}, {payload, length}};
  return amShortPieces(id, pieces, 2, sizeof(header) + length);
}

ucs_status_t Ep::amShortIov(std::uint8_t id, const uct_iov_t* iov, std::size_t iovcnt) noexcept {
  if (iovcnt > iface_->amMaxIov()) {
    ucs_error("gmd_rc: am_short_iov: Invalid iov count %zu, at most %zu", iovcnt,
              iface_->amMaxIov());
    return UCS_ERR_INVALID_PARAM;
  }
  Piece pieces[kMaxSge];
  std::size_t total = 0;
  for (std::size_t i = 0; i < iovcnt; ++i) {
    pieces[i] = {iov[i].buffer, iov[i].length * std::max<unsigned>(iov[i].count, 1)};
    if (iov[i].count > 1 && iov[i].stride != iov[i].length && iov[i].stride != 0) {
      ucs_debug("gmd_rc: strided iov entries are not supported");
      return UCS_ERR_UNSUPPORTED;
    }
    total += pieces[i].length;
  }
  return amShortPieces(id, pieces, iovcnt, total);
}

ssize_t Ep::amBcopy(std::uint8_t id, uct_pack_callback_t pack, void* arg, unsigned) noexcept {
  if (ucs_status_t st = checkId(id); st != UCS_OK) return st;
  if (ucs_status_t st = reserve(true, true); st != UCS_OK) return st;
  const std::uint32_t b = iface_->bounce_.get();
  std::uint8_t* buf = iface_->bounce_.buffer(b);
  const std::size_t len = pack(buf, arg);
  if (len > iface_->limits_.seg_size) {
    iface_->releaseBounce(b);
    ucs_error("gmd_rc: am_bcopy: Invalid length %zu packed, at most %zu bytes", len,
              iface_->limits_.seg_size);
    return UCS_ERR_INVALID_PARAM;
  }
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), static_cast<std::uint32_t>(len),
              iface_->bounce_.lkey()};
  // Small enough to go inline: the buffer is free again at once.
  const bool inl = len <= iface_->txInline();
  const ucs_status_t st = sendAm(id, &sge, len == 0 ? 0 : 1, inl ? kInline : 0u, nullptr,
                                 inl ? -1 : static_cast<std::int32_t>(b));
  if (inl || st != UCS_INPROGRESS) iface_->releaseBounce(b);
  return st == UCS_INPROGRESS ? static_cast<ssize_t>(len) : static_cast<ssize_t>(st);
}

ucs_status_t Ep::amZcopy(std::uint8_t id, const void* header, unsigned header_length,
                         const uct_iov_t* iov, std::size_t iovcnt, unsigned,
                         uct_completion_t* comp) noexcept {
  if (ucs_status_t st = checkId(id); st != UCS_OK) return st;
  if (header_length > iface_->amMaxHdr()) {
    ucs_error("gmd_rc: am_zcopy: Invalid length %u of the header, at most %zu bytes",
              header_length, iface_->amMaxHdr());
    return UCS_ERR_INVALID_PARAM;
  }
  if (iovcnt > iface_->amMaxIov()) {
    ucs_error("gmd_rc: am_zcopy: Invalid iov count %zu, at most %zu", iovcnt, iface_->amMaxIov());
    return UCS_ERR_INVALID_PARAM;
  }
  ibv_sge sge[kMaxSge];
  int nsge = 1;  // sge[0]: the header
  std::uint64_t payload = 0;
  if (ucs_status_t st = iovToSge(iov, iovcnt, sge, &nsge, &payload); st != UCS_OK) return st;
  // The payload within am.max_zcopy (with the header, within one receive segment).
  if (payload > iface_->amMaxZcopy()) {
    ucs_error("gmd_rc: am_zcopy: Invalid length %llu of the payload, at most %zu bytes",
              static_cast<unsigned long long>(payload), iface_->amMaxZcopy());
    return UCS_ERR_INVALID_PARAM;
  }
  const std::uint64_t total = header_length + payload;
  // All of it inline: copied at post time, complete now.
  const bool inl = total <= iface_->txInline();
  const bool bounce = !inl && header_length > 0;
  if (ucs_status_t st = reserve(true, bounce); st != UCS_OK) return st;
  std::int32_t b = -1;
  int first = 0;
  if (inl) {
    sge[0] = {reinterpret_cast<std::uintptr_t>(header), header_length, 0};
  } else if (bounce) {
    b = static_cast<std::int32_t>(iface_->bounce_.get());
    std::uint8_t* p = iface_->bounce_.buffer(static_cast<std::uint32_t>(b));
    std::memcpy(p, header, header_length);
    sge[0] = {reinterpret_cast<std::uintptr_t>(p), header_length, iface_->bounce_.lkey()};
  }
  if (header_length == 0) first = 1;  // no header SGE
  const ucs_status_t st = sendAm(id, sge + first, nsge - first, inl ? kInline : 0u,
                                 inl ? nullptr : comp, b);
  if (st != UCS_INPROGRESS) {
    if (b >= 0) iface_->releaseBounce(static_cast<std::uint32_t>(b));
    return st;
  }
  return inl ? UCS_OK : UCS_INPROGRESS;
}

}  // namespace gmd::md::rc
