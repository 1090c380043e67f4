#include "md/rc/rc_recv.h"

#include <arpa/inet.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "md/rc/rc_iface.h"
#include "md/rc/rc_wire.h"

namespace gmd::md::rc {
namespace {

// How long a closed passive QP waits for IBV_EVENT_QP_LAST_WQE_REACHED before it is destroyed anyway.
constexpr auto kDrainTimeout = std::chrono::seconds(2);
// Receive work requests posted per ibv_post_srq_recv call.
constexpr unsigned kPostChunk = 64;

}  // namespace

// --- Handoff (listener thread → iface thread) -----------------------------------------------------

bool Handoff::push(ibv_qp* qp, bool closed) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    events_.push_back({qp, closed});
  } catch (...) {
    return false;
  }
  queued_.store(true, std::memory_order_release);
  return true;
}

std::vector<Handoff::Event> Handoff::take() noexcept {
  std::vector<Event> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(events_);
  queued_.store(false, std::memory_order_relaxed);
  return out;
}

// --- RecvPath --------------------------------------------------------------------------------------

ucs_status_t RecvPath::init(Iface* iface, ucx::BaseIface* base, ibv_context* ctx,
                            DeviceEvents* events, ibv_pd* pd, ibv_comp_channel* channel,
                            const Limits& limits, std::size_t rx_headroom, std::size_t align,
                            std::size_t align_offset, const char* dev_name) noexcept {
  iface_ = iface;
  base_ = base;
  events_ = events;
  name_ = dev_name;
  headroom_ = rx_headroom;
  // Segments start on `align`: pad so that pad + slot + headroom + align_offset is a multiple.
  pad_ = (align - (kSlot + headroom_ + align_offset) % align) % align;
  seg_size_ = limits.seg_size;
  queue_len_ = limits.rx_queue_len;
  batch_ = std::max(1u, std::min(queue_len_ / 8, kPostChunk));
  try {
    peers_.reserve(64);
    grant_waiters_.reserve(64);
    backlog_.reserve(16);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  cq_ = ibv_create_cq(ctx, static_cast<int>(queue_len_ + kGrantSlots + 1), nullptr, channel, 0);
  if (cq_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_cq (receive): %s", dev_name, std::strerror(errno));
    return UCS_ERR_NO_RESOURCE;
  }
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = queue_len_;
  sa.attr.max_sge = 1;
  srq_ = ibv_create_srq(pd, &sa);
  if (srq_ == nullptr) {
    ucs_error("gmd_rc %s: ibv_create_srq(%u): %s", dev_name, queue_len_, std::strerror(errno));
    return UCS_ERR_NO_RESOURCE;
  }
  // A quarter more segments than the SRQ holds, for descriptors handlers keep.
  const std::size_t count = queue_len_ + std::max(16u, queue_len_ / 4);
  if (ucs_status_t st = pool_.init(pd, count, pad_ + kSlot + headroom_ + seg_size_,
                                   "receive buffers", dev_name, align);
      st != UCS_OK) {
    return st;
  }
  release_.super.cb = releaseCb;
  release_.self = this;
  for (std::uint32_t i = 0; i < count; ++i) {
    auto* slot = reinterpret_cast<uct_recv_desc_t**>(pool_.buffer(i) + pad_);
    *slot = &release_.super;
  }
  refill();
  if (posted_ == 0) {
    ucs_error("gmd_rc %s: cannot post receive buffers", dev_name);
    return UCS_ERR_NO_RESOURCE;
  }
  return UCS_OK;
}

RecvPath::~RecvPath() { shutdown(); }

void RecvPath::shutdown() noexcept {
  for (const Handoff::Event& e : handoff_.take()) {
    if (!e.closed && peers_.count(e.qp->qp_num) == 0) ibv_destroy_qp(e.qp);
  }
  for (auto& [qpn, p] : peers_) {
    if (ibv_destroy_qp(p.qp) != 0) {
      ucs_warn("gmd_rc %s: ibv_destroy_qp: %s", name_, std::strerror(errno));
    }
    if (events_ != nullptr) events_->forget(qpn);
  }
  peers_.clear();
  draining_.clear();
  grant_waiters_.clear();
  if (srq_ != nullptr) ibv_destroy_srq(srq_);
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  srq_ = nullptr;
  cq_ = nullptr;
}

void RecvPath::releaseCb(uct_recv_desc_t* self, void* desc) {
  RecvPath* me = reinterpret_cast<ReleaseDesc*>(self)->self;
  me->pool_.put(me->pool_.indexOf(static_cast<std::uint8_t*>(desc) - kSlot));
}

void RecvPath::takeHandoffs() noexcept {
  for (const Handoff::Event& e : handoff_.take()) {
    const std::uint32_t qpn = e.qp->qp_num;
    if (!e.closed) {
      try {
        peers_.try_emplace(qpn, Peer{e.qp});
      } catch (...) {
        ucs_error("gmd_rc %s: out of memory taking over a passive QP", name_);
        ibv_destroy_qp(e.qp);
      }
      continue;
    }
    if (auto it = peers_.find(qpn); it != peers_.end() && !it->second.closing) {
      startDrain(it->second);
      try {
        draining_.push_back(qpn);
      } catch (...) {
        destroyPeer(qpn);
      }
    }
  }
}

unsigned RecvPath::progress() noexcept {
  if (handoff_.queued_.load(std::memory_order_acquire)) takeHandoffs();
  unsigned n = 0;
  if (!backlog_.empty()) {
    std::vector<ibv_wc> kept;
    kept.swap(backlog_);
    for (const ibv_wc& wc : kept) handle(wc);
    n += static_cast<unsigned>(kept.size());
    kept.clear();
    if (backlog_.empty()) backlog_.swap(kept);  // keep the capacity
  }
  ibv_wc wc[16];
  const int k = ibv_poll_cq(cq_, 16, wc);
  if (k < 0) ucs_error("gmd_rc %s: ibv_poll_cq (receive) failed", name_);
  for (int i = 0; i < k; ++i) handle(wc[i]);
  if (k > 0) n += static_cast<unsigned>(k);
  // Refill in batches (refill() decides); nothing to do while a batch's worth is still posted.
  if (posted_ + batch_ <= queue_len_ && pool_.available() > 0) refill();
  if (!grant_waiters_.empty()) sendWaitingGrants();
  if (!draining_.empty()) pollDraining();
  return n;
}

bool RecvPath::arm() noexcept {
  if (ibv_req_notify_cq(cq_, 0) != 0) {
    ucs_error("gmd_rc %s: ibv_req_notify_cq (receive): %s", name_, std::strerror(errno));
    return true;  // BUSY: the caller keeps polling
  }
  ibv_wc wc[16];
  const int k = ibv_poll_cq(cq_, 16, wc);
  for (int i = 0; i < k; ++i) backlog_.push_back(wc[i]);  // capacity 16 reserved at init
  return hasWork();
}

bool RecvPath::hasWork() const noexcept {
  return !backlog_.empty() || handoff_.queued_.load(std::memory_order_acquire) ||
         !grant_waiters_.empty();
}

void RecvPath::handle(const ibv_wc& wc) noexcept {
  if (wc.wr_id == kGrantWrId) {
    grantDone(wc.qp_num);
    return;
  }
  --posted_;
  const auto seg = static_cast<std::uint32_t>(wc.wr_id);
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      ucs_debug("gmd_rc %s: receive on QP 0x%x failed: %s", name_, wc.qp_num,
                ibv_wc_status_str(wc.status));
    }
    pool_.put(seg);
    return;
  }
  Imm imm;
  if (!(wc.wc_flags & IBV_WC_WITH_IMM) || unpackImm(ntohl(wc.imm_data), &imm) != UCS_OK) {
    ucs_warn("gmd_rc %s: dropped a malformed message (%u bytes) on QP 0x%x", name_, wc.byte_len,
             wc.qp_num);
    pool_.put(seg);
    return;
  }
  if (imm.kind == kImmGrant) {
    pool_.put(seg);
    iface_->creditsGranted(wc.qp_num, imm.credits);
    return;
  }
  dispatch(wc.qp_num, seg, imm.kind, wc.byte_len, imm.request);
}

void RecvPath::dispatch(std::uint32_t qpn, std::uint32_t seg, std::uint8_t id,
                        std::uint32_t length, bool request) noexcept {
  const ucx::AmHandler& h = base_->am[id];
  const ucs_status_t st = h.cb(h.arg, payload(seg), length, UCT_CB_PARAM_FLAG_DESC);
  if (st != UCS_INPROGRESS) pool_.put(seg);
  auto it = peers_.find(qpn);
  if (it == peers_.end() && handoff_.queued_.load(std::memory_order_acquire)) {
    takeHandoffs();
    it = peers_.find(qpn);
  }
  if (it == peers_.end()) return;  // a QP being torn down: its sender is gone
  Peer& p = it->second;
  ++p.unacked;
  if (request) p.grant_wanted = true;
  if (p.grant_wanted) sendGrant(qpn, p);
}

void RecvPath::sendGrant(std::uint32_t qpn, Peer& p) noexcept {
  if (p.closing || p.unacked == 0) {
    p.grant_wanted = false;
    return;
  }
  if (grant_credits_ == 0 || p.grants_inflight >= kPeerSendQueue) {
    if (!p.waiting) {
      try {
        grant_waiters_.push_back(qpn);
        p.waiting = true;
      } catch (...) {
        ucs_error("gmd_rc %s: out of memory queueing a credit grant", name_);
      }
    }
    return;
  }
  const auto credits = static_cast<std::uint16_t>(std::min(p.unacked, 0xffffu));
  Imm imm;
  imm.kind = kImmGrant;
  imm.credits = credits;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = kGrantWrId;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(packImm(imm));
  if (const int rc = ibv_post_send(p.qp, &wr, &bad); rc != 0) {
    ucs_debug("gmd_rc %s: cannot send a credit grant on QP 0x%x: %s", name_, qpn,
              std::strerror(rc));
    return;
  }
  p.unacked -= credits;
  p.grant_wanted = false;
  ++p.grants_inflight;
  --grant_credits_;
}

void RecvPath::sendWaitingGrants() noexcept {
  std::vector<std::uint32_t> waiters;
  waiters.swap(grant_waiters_);
  for (std::uint32_t qpn : waiters) {
    auto it = peers_.find(qpn);
    if (it == peers_.end()) continue;
    it->second.waiting = false;
    sendGrant(qpn, it->second);
  }
  if (grant_waiters_.empty()) {
    waiters.clear();
    grant_waiters_.swap(waiters);  // keep the capacity
  }
}

void RecvPath::grantDone(std::uint32_t qpn) noexcept {
  auto it = peers_.find(qpn);
  if (it == peers_.end()) return;  // counted back when the peer was destroyed
  --it->second.grants_inflight;
  ++grant_credits_;
}

void RecvPath::refill() noexcept {
  const unsigned want = std::min<unsigned>(queue_len_ - posted_,
                                           static_cast<unsigned>(pool_.available()));
  if (want == 0 || (want < batch_ && posted_ >= batch_)) return;
  ibv_recv_wr wrs[kPostChunk];
  ibv_sge sges[kPostChunk];
  for (unsigned done = 0; done < want;) {
    const unsigned n = std::min(want - done, kPostChunk);
    for (unsigned i = 0; i < n; ++i) {
      const std::uint32_t seg = pool_.get();
      sges[i].addr = reinterpret_cast<std::uintptr_t>(payload(seg));
      sges[i].length = static_cast<std::uint32_t>(seg_size_);
      sges[i].lkey = pool_.lkey();
      wrs[i].wr_id = seg;
      wrs[i].sg_list = &sges[i];
      wrs[i].num_sge = 1;
      wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_srq_recv(srq_, wrs, &bad); rc != 0) {
      // The ones from `bad` on were not posted.
      unsigned posted = 0;
      for (ibv_recv_wr* w = wrs; w != bad; w = w->next) ++posted;
      for (ibv_recv_wr* w = bad; w != nullptr; w = w->next) {
        pool_.put(static_cast<std::uint32_t>(w->wr_id));
      }
      posted_ += posted;
      ucs_error("gmd_rc %s: ibv_post_srq_recv: %s", name_, std::strerror(rc));
      return;
    }
    posted_ += n;
    done += n;
  }
}

void RecvPath::startDrain(Peer& p) noexcept {
  p.closing = true;
  p.closed_at = std::chrono::steady_clock::now();
  events_->forget(p.qp->qp_num);  // an event kept from an earlier QP of this number is stale
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (ibv_modify_qp(p.qp, &a, IBV_QP_STATE) != 0) {
    ucs_debug("gmd_rc %s: cannot move passive QP 0x%x to the error state: %s", name_,
              p.qp->qp_num, std::strerror(errno));
  }
}

void RecvPath::pollDraining() noexcept {
  events_->poll();
  const auto now = std::chrono::steady_clock::now();
  std::size_t kept = 0;
  for (const std::uint32_t qpn : draining_) {
    auto it = peers_.find(qpn);
    if (it == peers_.end()) continue;
    if (events_->takeLastWqe(qpn)) {
      ucs_debug("gmd_rc %s: passive QP 0x%x drained (last WQE reached)", name_, qpn);
    } else if (now - it->second.closed_at >= kDrainTimeout) {
      ucs_diag("gmd_rc %s: passive QP 0x%x destroyed without its last-WQE event after %lld s",
               name_, qpn,
               static_cast<long long>(
                   std::chrono::duration_cast<std::chrono::seconds>(kDrainTimeout).count()));
    } else {
      draining_[kept++] = qpn;
      continue;
    }
    destroyPeer(qpn);
  }
  draining_.resize(kept);
}

void RecvPath::destroyPeer(std::uint32_t qpn) noexcept {
  auto it = peers_.find(qpn);
  if (it == peers_.end()) return;
  grant_credits_ += it->second.grants_inflight;
  if (ibv_destroy_qp(it->second.qp) != 0) {
    ucs_warn("gmd_rc %s: ibv_destroy_qp: %s", name_, std::strerror(errno));
  }
  events_->forget(qpn);
  peers_.erase(it);
}

}  // namespace gmd::md::rc
