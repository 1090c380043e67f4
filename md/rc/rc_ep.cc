#include "md/rc/rc_ep.h"

#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cstring>

#include "md/rc/rc_iface.h"
#include "rcache/rcache.h"

namespace gmd::md::rc {
namespace {

// Records `status` in `comp` and calls it when its count reaches zero.
void complete(uct_completion_t* comp, ucs_status_t status) noexcept {
  if (comp == nullptr) return;
  if (status != UCS_OK) comp->status = status;
  if (--comp->count == 0) comp->func(comp);
}

}  // namespace

ucs_status_t iovToSge(const uct_iov_t* iov, std::size_t iovcnt, ibv_sge* sge, int* nsge,
                      std::uint64_t* total) noexcept {
  for (std::size_t i = 0; i < iovcnt; ++i) {
    const std::size_t len = iov[i].length * iov[i].count;
    if (len == 0) continue;
    if (iov[i].memh == UCT_MEM_HANDLE_NULL) {
      ucs_debug("gmd_rc: zero-copy buffer %p without a memory handle", iov[i].buffer);
      return UCS_ERR_INVALID_PARAM;
    }
    if (iov[i].count > 1 && iov[i].stride != iov[i].length && iov[i].stride != 0) {
      ucs_debug("gmd_rc: strided iov entries are not supported");
      return UCS_ERR_UNSUPPORTED;
    }
    sge[*nsge].addr = reinterpret_cast<std::uintptr_t>(iov[i].buffer);
    sge[*nsge].length = static_cast<std::uint32_t>(len);
    sge[*nsge].lkey = static_cast<const rcache::Region*>(iov[i].memh)->registration().lkey;
    ++*nsge;
    *total += len;
  }
  return UCS_OK;
}

Ep::Ep(Iface* iface) : iface_(iface) {
  handle_.super.iface = iface->handle();
  handle_.self = this;
}

Ep::~Ep() = default;

bool Ep::canPost() const noexcept {
  return state_ == State::kReady && ring_.size() - inflight_ >= need_slots_ &&
         iface_->tx_free_ >= static_cast<long>(need_slots_) && (!need_credit_ || fc_credits_ > 0) &&
         (!need_bounce_ || iface_->bounce_.available() > 0);
}

bool Ep::queuedBehindPending() noexcept {
  if (pending_.empty() || dispatching_) return false;
  // The pending queue goes first (see the file comment of md/rc/rc_ep.h); progress dispatches it.
  if (!in_pending_list_ && canPost()) iface_->schedulePending(this);
  return true;
}

ucs_status_t Ep::reserve(bool credit, bool bounce) noexcept {
  if (error_ != UCS_OK) return error_;
  if (queuedBehindPending()) return UCS_ERR_NO_RESOURCE;
  need_slots_ = 1;
  need_credit_ = credit;
  need_bounce_ = bounce;
  if (!canPost()) {
    if (state_ == State::kReady) iface_->starved(need_bounce_ && iface_->bounce_.available() == 0);
    return UCS_ERR_NO_RESOURCE;
  }
  need_credit_ = need_bounce_ = false;
  return UCS_OK;
}

ucs_status_t Ep::rdma(ibv_wr_opcode opcode, const uct_iov_t* iov, std::size_t iovcnt,
                      std::uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t* comp) noexcept {
  if (error_ != UCS_OK) return error_;
  if (state_ != State::kReady || queuedBehindPending()) return UCS_ERR_NO_RESOURCE;
  if (iovcnt > iface_->maxIov(opcode)) {
    ucs_error("gmd_rc: %s_zcopy: Invalid iov count %zu, at most %zu",
              opcode == IBV_WR_RDMA_READ ? "get" : "put", iovcnt, iface_->maxIov(opcode));
    return UCS_ERR_INVALID_PARAM;
  }
  ibv_sge sge[kMaxSge];
  int nsge = 0;
  std::uint64_t total = 0;
  if (ucs_status_t st = iovToSge(iov, iovcnt, sge, &nsge, &total); st != UCS_OK) return st;
  if (nsge == 0) return UCS_OK;
  if (total > iface_->limits_.max_msg) {
    ucs_error("gmd_rc: %s_zcopy: Invalid length %llu, at most %llu bytes (the port's maximal "
              "message size)",
              opcode == IBV_WR_RDMA_READ ? "get" : "put", static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(iface_->limits_.max_msg));
    return UCS_ERR_INVALID_PARAM;
  }

  // A READ larger than the iface's READ size goes out as several work requests; only the last
  // carries the caller's completion (RC completes them in order, and a failure of any fails the
  // endpoint, so the last one's status is the operation's).
  std::uint64_t part = total;
  std::size_t nwr = 1;
  if (opcode == IBV_WR_RDMA_READ && total > iface_->readSize()) {
    const std::size_t most = std::min<std::size_t>(ring_.size(), iface_->limits_.cq_len);
    part = iface_->readSize();
    nwr = static_cast<std::size_t>((total + part - 1) / part);
    if (nwr > most) {  // a short send queue: fewer, larger READs
      part = (total + most - 1) / most;
      nwr = static_cast<std::size_t>((total + part - 1) / part);
    }
  }
  need_slots_ = nwr;  // what pendingAdd/dispatch wait for when refused now
  need_credit_ = need_bounce_ = false;
  if (!canPost()) {
    if (state_ == State::kReady) iface_->starved(false);
    return UCS_ERR_NO_RESOURCE;
  }
  need_slots_ = 1;
  const auto rkey32 = static_cast<std::uint32_t>(rkey);
  if (nwr == 1) return postRdma(opcode, sge, nsge, remote_addr, rkey32, comp);

  ibv_sge piece[kMaxSge];
  int cur = 0;             // sge[cur] is being split
  std::uint32_t used = 0;  // bytes of sge[cur] already posted
  std::uint64_t done = 0;
  for (std::size_t w = 0; w < nwr; ++w) {
    std::uint64_t want = std::min(part, total - done);
    const std::uint64_t len = want;
    int n = 0;
    while (want > 0) {
      const auto take =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(want, sge[cur].length - used));
      piece[n] = sge[cur];
      piece[n].addr += used;
      piece[n].length = take;
      ++n;
      used += take;
      want -= take;
      if (used == sge[cur].length) {
        ++cur;
        used = 0;
      }
    }
    const ucs_status_t st = postRdma(opcode, piece, n, remote_addr + done, rkey32,
                                     w + 1 == nwr ? comp : nullptr);
    if (st != UCS_INPROGRESS) {
      // The READs already posted complete without a callback; the operation as a whole failed.
      return w == 0 ? st : UCS_ERR_IO_ERROR;
    }
    done += len;
  }
  return UCS_INPROGRESS;
}

ucs_status_t Ep::postRdma(ibv_wr_opcode opcode, ibv_sge* sge, int nsge,
                          std::uint64_t remote_addr, std::uint32_t rkey,
                          uct_completion_t* comp) noexcept {
  ibv_send_wr wr{};
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = opcode;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  return post(wr, comp, -1);
}

ucs_status_t Ep::post(ibv_send_wr& wr, uct_completion_t* comp, std::int32_t bounce) noexcept {
  const std::uint64_t sn = posted_ + 1;
  // A caller may ask for a signal (IBV_SEND_SIGNALED already set: work requests that unpack data).
  // While the iface's send-CQ credits run low every work request is signaled (as rc_verbs does):
  // otherwise endpoints that each hold a few unsignaled ones could use up the credits with no
  // completion left to come, and every endpoint would wait for ever.
  const bool signaled = comp != nullptr || (wr.send_flags & IBV_SEND_SIGNALED) != 0 ||
                        sn - last_signaled_ >= iface_->limits_.signal_interval ||
                        iface_->tx_free_ <= static_cast<long>(iface_->limits_.signal_interval) ||
                        inflight_ + 1 == ring_.size() ||
                        (bounce >= 0 && iface_->bounce_.available() < iface_->bounce_.count() / 4);
  wr.wr_id = sn;
  wr.next = nullptr;
  if (signaled) wr.send_flags |= IBV_SEND_SIGNALED;
  if (fence_ || fence_epoch_ != iface_->fenceEpoch()) {
    wr.send_flags |= IBV_SEND_FENCE;
    fence_ = false;
    fence_epoch_ = iface_->fenceEpoch();
  }
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    ucs_error("gmd_rc: ibv_post_send: %s", std::strerror(rc));
    return rc == ENOMEM ? UCS_ERR_NO_RESOURCE : UCS_ERR_IO_ERROR;
  }
  ring_[(ring_head_ + inflight_) % ring_.size()] = {comp, bounce};
  ++inflight_;
  posted_ = sn;
  if (signaled) last_signaled_ = sn;
  --iface_->tx_free_;
  return UCS_INPROGRESS;
}

ucs_status_t Ep::postNop(bool force) noexcept {
  if (inflight_ == ring_.size() || (!force && iface_->tx_free_ <= 0)) return UCS_ERR_NO_RESOURCE;
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  return post(wr, nullptr, -1);
}

ucs_status_t Ep::pendingAdd(uct_pending_req_t* req, unsigned) noexcept {
  if (pending_.empty() && (canPost() || state_ == State::kFailed)) return UCS_ERR_BUSY;
  try {
    pending_.push_back(req);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  if (canPost()) iface_->schedulePending(this);
  return UCS_OK;
}

void Ep::pendingPurge(uct_pending_purge_callback_t cb, void* arg) noexcept {
  std::deque<uct_pending_req_t*> reqs;
  reqs.swap(pending_);
  for (uct_pending_req_t* req : reqs) {
    if (cb != nullptr) cb(req, arg);
  }
}

ucs_status_t Ep::flush(unsigned flags, uct_completion_t* comp) noexcept {
  if (flags & UCT_FLUSH_FLAG_CANCEL) {
    pending_.clear();
    if (inflight_ > 0 && qp_ != nullptr) {
      if (unsignaledTail()) postNop(true);  // retires silently completed ones (Iface::failPeerGone)
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      ibv_modify_qp(qp_, &a, IBV_QP_STATE);
      if (fail(UCS_ERR_CANCELED)) error_reported_ = true;  // the caller asked for it
    }
  } else if (state_ != State::kFailed && queuedBehindPending()) {
    // Behind the queue, as every operation (a failed endpoint never dispatches it: it is purged).
    // A flush that a dispatched request calls (UCP queues its flushes) goes on.
    return UCS_ERR_NO_RESOURCE;
  }
  if (inflight_ == 0) return UCS_OK;
  if (state_ == State::kReady && unsignaledTail() && postNop(false) != UCS_INPROGRESS) {
    return UCS_ERR_NO_RESOURCE;
  }
  if (comp != nullptr) {
    try {
      flushes_.push_back({posted_, comp});
    } catch (...) {
      return UCS_ERR_NO_MEMORY;
    }
  }
  return UCS_INPROGRESS;
}

ucs_status_t Ep::fence() noexcept {
  fence_ = true;
  return UCS_OK;
}

ucs_status_t Ep::check(unsigned flags, uct_completion_t* comp) noexcept {
  if (flags != 0 || comp != nullptr) return UCS_ERR_UNSUPPORTED;  // UCT 1.13: both reserved
  if (error_ != UCS_OK) {
    iface_->failed(this);  // no-op when the handler heard of it already
    return UCS_OK;
  }
  if (state_ != State::kReady) return UCS_OK;  // a failing connect reports itself
  // The probe: a zero-length WRITE needs no remote key or address (IB spec C9-88) and is
  // acknowledged by the peer's RC transport, not by software: it fails only when the peer's QP is
  // gone.
  const ucs_status_t st = postNop(false);
  return st == UCS_INPROGRESS ? UCS_OK : st;
}


void Ep::retire(std::uint64_t sn, ucs_status_t status) noexcept {
  while (inflight_ > 0 && completed_ < sn) {
    const Slot slot = ring_[ring_head_];
    ring_head_ = (ring_head_ + 1) % ring_.size();
    --inflight_;
    ++completed_;
    ++iface_->tx_free_;
    // Work requests before `sn` completed successfully (in order).
    const ucs_status_t slot_status = completed_ == sn ? status : UCS_OK;
    if (slot.unpack != nullptr && slot_status == UCS_OK && !destroyed_) {
      slot.unpack(slot.unpack_arg, iface_->bounce_.buffer(static_cast<std::uint32_t>(slot.bounce)),
                  slot.length);
    }
    if (slot.bounce >= 0) iface_->releaseBounce(static_cast<std::uint32_t>(slot.bounce));
    if (destroyed_) continue;
    // Callbacks may post, flush or destroy this endpoint; the iface defers destruction to the end
    // of progress.
    complete(slot.comp, slot_status);
    while (!flushes_.empty() && flushes_.front().sn <= completed_) {
      uct_completion_t* f = flushes_.front().comp;
      flushes_.pop_front();
      complete(f, error_);
    }
  }
}

void Ep::cancelOutstanding() noexcept {
  // Detached first: nothing a callback does reaches them again, and the slots' work requests,
  // when they come back from the CQ, find no completion to call.
  std::deque<FlushWaiter> flushes;
  flushes.swap(flushes_);
  for (std::size_t i = 0; i < inflight_; ++i) {
    Slot& slot = ring_[(ring_head_ + i) % ring_.size()];
    uct_completion_t* comp = slot.comp;
    slot.comp = nullptr;
    slot.unpack = nullptr;
    complete(comp, UCS_ERR_CANCELED);
    // Flushes in order with the operations they wait for (work request sn = completed_ + 1 + i).
    while (!flushes.empty() && flushes.front().sn <= completed_ + 1 + i) {
      complete(flushes.front().comp, UCS_ERR_CANCELED);
      flushes.pop_front();
    }
  }
  for (const FlushWaiter& f : flushes) complete(f.comp, UCS_ERR_CANCELED);
}

bool Ep::fail(ucs_status_t status) noexcept {
  if (error_ != UCS_OK) return false;
  error_ = status;
  state_ = State::kFailed;
  return true;
}

bool Ep::connectedTo(const uct_device_addr_t* dev_addr,
                     const uct_iface_addr_t* iface_addr) const noexcept {
  DeviceAddress d;
  IfaceAddress i;
  if (dev_addr == nullptr || iface_addr == nullptr ||
      unpackDeviceAddress(dev_addr, &d) != UCS_OK || unpackIfaceAddress(iface_addr, &i) != UCS_OK) {
    return false;
  }
  return i.ipv4_be == peer_iface_.ipv4_be && i.port_be == peer_iface_.port_be &&
         d.lid == peer_dev_.lid &&
         std::memcmp(d.gid.raw, peer_dev_.gid.raw, sizeof(d.gid.raw)) == 0;
}

}  // namespace gmd::md::rc
