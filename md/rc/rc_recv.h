// gmd_rc's receive path: the iface's shared receive queue (SRQ) and receive CQ, the registered
// segment pool that refills the SRQ in batches, active-message dispatch, the receiver's side of flow
// control, and the passive QPs.
//
// Every QP of an iface receives into its SRQ. An endpoint's (active) QP receives credit grants; a
// passive QP (accepted by the listener for a peer's endpoint) receives that endpoint's active
// messages and sends the grants back. A passive QP's send completions (grants) come to the receive
// CQ too, so this path polls one CQ.
//
// Passive QPs: the listener thread creates and connects them and hands them over through Handoff
// before it answers the peer, so no message can arrive on a QP the iface does not know. From then
// on the iface owns them (QP number → peer map). When the peer's TCP connection ends the QP goes to
// the error state and is destroyed after IBV_EVENT_QP_LAST_WQE_REACHED, which the MD's DeviceEvents
// reads for every iface on the device context (md/device_events.h), or kDrainTimeout later when that
// event never comes (logged).
//
// Segment layout: [padding][release slot][rx_headroom][payload, seg_size bytes]. The SRQ work
// request covers the payload; an active-message handler gets data = payload with rx_headroom
// writable bytes before it. The padding (the same in every segment; none by default) puts
// payload + am_align_offset on an am_alignment boundary (uct_iface_params_t): segments start on
// that boundary (md/rc/rc_pool.h), so every message, short, bcopy or zcopy, kept or not, lands
// aligned. A handler returning UCS_INPROGRESS keeps the segment until uct_iface_release_desc(data -
// rx_headroom), which finds this path's release callback in the slot just before that address.
//
// Flow control, receiver side: per passive QP, the messages consumed since the last grant. A message
// whose request bit is set (md/rc/rc_wire.h) makes this path return them all in one grant. Grants
// are not flow controlled themselves: at most kGrantSlots are in flight per iface.
//
// Thread safety: everything runs on the iface's thread, except Handoff::accepted/closed, which the
// listener thread calls (a mutex; the iface's side checks an atomic flag first).
#pragma once

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "md/device_events.h"
#include "md/rc/rc_config.h"
#include "md/rc/rc_pool.h"
#include "md/ucx_abi.h"

namespace gmd::md::rc {

class Iface;

// Passive QPs on their way from the listener thread to the iface.
class Handoff {
 public:
  // Listener thread. False (nothing queued) when out of memory: the listener then refuses.
  bool accepted(ibv_qp* qp) noexcept { return push(qp, false); }
  // Listener thread: the peer's TCP connection of `qp` ended.
  void closed(ibv_qp* qp) noexcept { push(qp, true); }

 private:
  friend class RecvPath;
  struct Event {
    ibv_qp* qp;
    bool closed;
  };
  bool push(ibv_qp* qp, bool closed) noexcept;
  std::vector<Event> take() noexcept;

  std::mutex mu_;
  std::vector<Event> events_;  // guarded by mu_
  std::atomic<bool> queued_{false};
};

class RecvPath {
 public:
  // Grant sends in flight per iface (entries of the receive CQ reserved for them).
  static constexpr unsigned kGrantSlots = 64;
  // Send queue of a passive QP: grants only.
  static constexpr unsigned kPeerSendQueue = 8;

  RecvPath() = default;
  ~RecvPath();
  RecvPath(const RecvPath&) = delete;
  RecvPath& operator=(const RecvPath&) = delete;

  // Creates the CQ (on `channel` for event notification), the SRQ and the segment pool, and fills
  // the SRQ. `align` (a power of two) and `align_offset` (below it): payload + align_offset of
  // every segment is aligned to `align`. Logs (error level) and returns a status on failure.
  ucs_status_t init(Iface* iface, ucx::BaseIface* base, ibv_context* ctx, DeviceEvents* events,
                    ibv_pd* pd, ibv_comp_channel* channel, const Limits& limits,
                    std::size_t rx_headroom, std::size_t align, std::size_t align_offset,
                    const char* dev_name) noexcept;
  ibv_cq* cq() const noexcept { return cq_; }
  ibv_srq* srq() const noexcept { return srq_; }
  Handoff& handoff() noexcept { return handoff_; }

  // Hand-offs, received messages (dispatched to the AM handlers), SRQ refill, waiting grants,
  // passive QPs being drained. Returns the number of events handled.
  unsigned progress() noexcept;
  // Asks for a completion event of the CQ, then looks once more: true when a completion is already
  // there (kept for the next progress) or other work is waiting (uct_iface_event_arm's BUSY).
  bool arm() noexcept;
  bool hasWork() const noexcept;
  // Destroys every passive QP, the SRQ and the CQ (after the listener thread has stopped and the
  // endpoints' QPs are gone). Idempotent.
  void shutdown() noexcept;

 private:
  struct Peer {
    ibv_qp* qp = nullptr;
    unsigned unacked = 0;          // messages consumed since the last grant
    unsigned grants_inflight = 0;  // grant sends not completed
    bool grant_wanted = false;     // a grant is owed (the sender asked)
    bool waiting = false;          // in grant_waiters_
    bool closing = false;
    std::chrono::steady_clock::time_point closed_at{};
  };
  struct ReleaseDesc {
    uct_recv_desc_t super;  // first: uct_iface_release_desc calls super.cb
    RecvPath* self;
  };
  static constexpr std::uint64_t kGrantWrId = ~std::uint64_t{0};
  static constexpr std::size_t kSlot = sizeof(uct_recv_desc_t*);

  static void releaseCb(uct_recv_desc_t* self, void* desc);
  void takeHandoffs() noexcept;
  void handle(const ibv_wc& wc) noexcept;
  void dispatch(std::uint32_t qpn, std::uint32_t seg, std::uint8_t id, std::uint32_t length,
                bool request) noexcept;
  void sendGrant(std::uint32_t qpn, Peer& p) noexcept;
  void sendWaitingGrants() noexcept;
  void grantDone(std::uint32_t qpn) noexcept;
  void refill() noexcept;
  void startDrain(Peer& p) noexcept;
  void pollDraining() noexcept;
  void destroyPeer(std::uint32_t qpn) noexcept;
  std::uint8_t* payload(std::uint32_t seg) const noexcept {
    return pool_.buffer(seg) + pad_ + kSlot + headroom_;
  }

  Iface* iface_ = nullptr;
  ucx::BaseIface* base_ = nullptr;
  DeviceEvents* events_ = nullptr;
  const char* name_ = "";
  ibv_cq* cq_ = nullptr;
  ibv_srq* srq_ = nullptr;
  BufferPool pool_;
  ReleaseDesc release_{};
  std::size_t headroom_ = 0;
  std::size_t pad_ = 0;  // bytes before the release slot (alignment)
  std::size_t seg_size_ = 0;
  unsigned queue_len_ = 0;
  unsigned batch_ = 1;
  unsigned posted_ = 0;  // receive work requests in the SRQ
  unsigned grant_credits_ = kGrantSlots;
  Handoff handoff_;
  std::unordered_map<std::uint32_t, Peer> peers_;  // passive QPs by QP number
  std::vector<std::uint32_t> grant_waiters_;
  std::vector<std::uint32_t> draining_;
  std::vector<ibv_wc> backlog_;  // completions arm() polled
};

}  // namespace gmd::md::rc
