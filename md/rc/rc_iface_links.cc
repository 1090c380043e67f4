// gmd_rc iface, second half: the connections of its endpoints — progress of the links to peer
// ifaces (handshake replies, releases), endpoints becoming ready, and what happens when a link or
// its peer fails. The class and its thread-safety contract are in md/rc/rc_iface.h.
#include <poll.h>
#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "md/rc/rc_iface.h"

namespace gmd::md::rc {

unsigned Iface::progressConnections() noexcept {
  // The links with something to send or a reply due, 32 at a time.
  pollfd fds[32];
  PeerLink* links[32];
  std::size_t n = 0;
  link_output_ = false;
  for (const auto& entry : links_) {
    PeerLink* l = entry.second.get();
    if (!l->link.busy(!l->waiting.empty())) continue;
    link_output_ |= l->link.hasOutput();
    if (n == 32) continue;
    fds[n] = {l->link.fd(), l->link.events(), 0};
    links[n++] = l;
  }
  unsigned done = 0;
  if (n > 0 && poll(fds, n, 0) > 0) {
    for (std::size_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      ++done;
      PeerLink* l = links[i];
      Handshake replies[Link::kMaxRepliesPerStep];
      std::size_t got = 0;
      const char* why = nullptr;
      const bool ok = l->link.step(replies, &got, &why);
      // Replies first: they came before whatever broke the link.
      for (std::size_t r = 0; r < got && !l->waiting.empty(); ++r) {
        Ep* ep = l->waiting.front();
        l->waiting.pop_front();
        if (ep == nullptr) continue;  // it left; its release frame follows the request
        if (replies[r].status != 0) {
          const bool last = l->eps.size() == 1;
          leaveLink(ep, false);  // the last endpoint: the link is closed and gone
          connectionFailed(ep, UCS_ERR_UNREACHABLE, "the peer refused the connection");
          if (last) {
            l = nullptr;
            break;
          }
          continue;
        }
        connectionReady(ep, replies[r]);
      }
      if (l == nullptr) continue;
      if (!ok) {
        linkFailed(l, why);
      } else if (l->link.connected() && !l->watched) {
        l->watched = peer_watch_.add(l->link.fd(), l);
      }
    }
  }
  // Deadlines (UCX_GMD_RC_CONNECT_TIMEOUT); copy: a failure removes the endpoint from connecting_.
  const auto now = std::chrono::steady_clock::now();
  std::vector<Ep*> late;
  for (Ep* ep : connecting_) {
    if (now > ep->connect_deadline_) late.push_back(ep);
  }
  for (Ep* ep : late) {
    leaveLink(ep, true);
    connectionFailed(ep, UCS_ERR_UNREACHABLE, "timed out (UCX_GMD_RC_CONNECT_TIMEOUT)");
  }
  return done;
}

void Iface::connectionReady(Ep* ep, const Handshake& reply) noexcept {
  std::string why;
  if (connectQp(ep->qp_, port_, limits_.qp, false, reply, ep->psn_, &why) != UCS_OK) {
    connectionFailed(ep, UCS_ERR_UNREACHABLE, why.c_str());
    return;
  }
  eraseValue(connecting_, ep);
  ep->state_ = Ep::State::kReady;
  ucs_debug("gmd_rc %s: endpoint %p connected, QP 0x%x to 0x%x", name(), static_cast<void*>(ep),
            ep->qp_->qp_num, reply.qpn);
  if (!ep->pending_.empty()) schedulePending(ep);
}

// --- Links
// ------------------------------------------------------------------------------------------

PeerLink* Iface::linkTo(const IfaceAddress& peer) noexcept {
  const std::uint64_t key = (static_cast<std::uint64_t>(peer.ipv4_be) << 16) | peer.port_be;
  if (auto it = links_.find(key); it != links_.end()) return it->second.get();
  std::unique_ptr<PeerLink> l(new (std::nothrow) PeerLink);
  if (l == nullptr) return nullptr;
  l->key = key;
  if (l->link.start(peer) != UCS_OK) return nullptr;  // logged
  try {
    return links_.emplace(key, std::move(l)).first->second.get();
  } catch (...) {
    return nullptr;
  }
}

void Iface::leaveLink(Ep* ep, bool release) noexcept {
  PeerLink* l = ep->link_;
  if (l == nullptr) return;
  ep->link_ = nullptr;
  eraseValue(l->eps, ep);
  for (Ep*& w : l->waiting) {
    if (w == ep) w = nullptr;
  }
  if (l->eps.empty()) {  // closing it releases every passive QP of it at the peer
    dropLink(l);
    return;
  }
  if (!release || ep->qp_ == nullptr) return;
  Handshake frame = localHandshake(port_, ep->qp_, 0);
  frame.kind = FrameKind::kRelease;
  if (!l->link.queue(frame)) {
    ucs_diag(
        "gmd_rc %s: endpoint %p: cannot send its release: its passive QP stays until the "
        "link closes",
        name(), static_cast<void*>(ep));
  }
  link_output_ |= l->link.hasOutput();  // the rest goes from progress
}

void Iface::dropLink(PeerLink* l) noexcept {
  if (l->watched) peer_watch_.remove(l->link.fd());
  for (Ep* ep : l->eps) ep->link_ = nullptr;
  links_.erase(l->key);  // closes the socket
}

// The peer closed the link (its process or iface is gone) or it broke: endpoints still connecting
// fail to connect, connected ones learn that the peer is gone (peerClosed).
void Iface::linkFailed(PeerLink* l, const char* why) noexcept {
  std::vector<Ep*> eps;
  try {
    eps = l->eps;
  } catch (...) {
    // Without the list, none of them is told: each fails through its QP's retries.
  }
  dropLink(l);
  for (Ep* ep : eps) {
    if (ep->state_ == Ep::State::kConnecting) {
      connectionFailed(ep, UCS_ERR_UNREACHABLE, why);
    } else {
      peerClosed(ep);
    }
  }
}

void Iface::connectionFailed(Ep* ep, ucs_status_t status, const char* why) noexcept {
  eraseValue(connecting_, ep);
  ep->state_ = Ep::State::kFailed;
  ep->error_ = status;
  ucs_error("gmd_rc %s: endpoint %p cannot connect: %s", name(), static_cast<void*>(ep), why);
  failed(ep);
}

void Iface::failed(Ep* ep) noexcept {
  if (ep->error_reported_) return;
  ep->error_reported_ = true;
  try {
    failed_.push_back(ep);
  } catch (...) {
    ucs_error("gmd_rc %s: out of memory reporting a failed endpoint", name());
  }
}

void Iface::schedulePending(Ep* ep) noexcept {
  if (ep->in_pending_list_) return;
  try {
    pending_eps_.push_back(ep);
    ep->in_pending_list_ = true;
  } catch (...) {
    ucs_error("gmd_rc: out of memory scheduling pending requests");
  }
}

unsigned Iface::dispatchPending() noexcept {
  unsigned n = 0;
  std::size_t rounds = pending_eps_.size();
  while (rounds-- > 0 && !pending_eps_.empty() && tx_free_ > 0) {
    Ep* ep = pending_eps_.front();
    pending_eps_.pop_front();
    ep->in_pending_list_ = false;
    bool keep = false;
    // A request that sent part of itself (UCS_INPROGRESS: a fragment of a long message) is called
    // again while there is room, at most a send queue's worth of times before the next endpoint.
    std::size_t partial = ep->ring_.size();
    while (!ep->pending_.empty()) {
      // Out of credits: a completion or a credit grant reschedules it (short of iface-wide send
      // credits or bounce buffers: marked starved, so the next completions wake it, whichever
      // endpoint's they are); connecting: connectionReady() does; failed: the user purges.
      if (!ep->canPost()) {
        if (ep->state_ == Ep::State::kReady) {
          starved(ep->need_bounce_ && bounce_.available() == 0);
        }
        break;
      }
      uct_pending_req_t* req = ep->pending_.front();
      ep->dispatching_ = true;  // its operations may post though the queue is not empty
      const ucs_status_t st = req->func(req);
      ep->dispatching_ = false;  // destruction is deferred to the end of progress
      if (ep->destroyed_) break;
      keep = st == UCS_INPROGRESS;
      if (st == UCS_OK) {
        ep->pending_.pop_front();
        ++n;
      } else if (st == UCS_INPROGRESS) {
        ++n;
        if (--partial == 0) break;
      } else {
        // Refused though the endpoint could post (the request needed something canPost() does not
        // see): it stays scheduled, or nothing would ever call it again.
        keep = st == UCS_ERR_NO_RESOURCE && ep->canPost();
        break;
      }
    }
    if (keep && !ep->destroyed_) schedulePending(ep);
  }
  return n;
}

void Iface::reportFailures() noexcept {
  std::vector<Ep*> failed;
  failed.swap(failed_);
  for (Ep* ep : failed) {
    if (ep->destroyed_) continue;
    if (handle_.base.err_handler == nullptr) continue;  // logged where it failed
    uct_iface_handle_ep_err(handle(), ep->handle(), ep->error_);
  }
}

// --- Peer failure
// ---------------------------------------------------------------------------------

// The peer closed the link: the endpoint fails now, busy or idle (a UCP endpoint may be waiting
// for an answer only the peer would send, a rendezvous or an emulated get, with nothing queued here).
void Iface::peerClosed(Ep* ep) noexcept {
  if (ep->destroyed_ || ep->error_ != UCS_OK) return;
  failPeerGone(ep);
}

// The peer's process died or its iface closed: fail the endpoint with UCS_ERR_CONNECTION_RESET
// (what UCX's transports report for a peer that went away). Moving the QP to the error state
// completes every posted work request with a flush error, so outstanding operations and flushes
// complete with the endpoint's error at once instead of after the QP's retries; the error handler
// is called once (failed()); pending requests are never dispatched and go back through
// pending_purge.
void Iface::failPeerGone(Ep* ep) noexcept {
  if (ep->destroyed_ || !ep->fail(UCS_ERR_CONNECTION_RESET)) return;
  ucs_log(handle_.base.config.failure_level,
          "gmd_rc %s: endpoint %p: the peer closed the connection (its process or iface is gone)",
          name(), static_cast<void*>(ep));
  if (ep->inflight_ > 0 && ep->qp_ != nullptr) {
    // Unsignaled work requests that completed before the peer died left no completion, and the
    // error state flushes only those still queued: a signaled one behind them retires them all
    // (else flushes, and UCP's discard of the endpoint, would wait for ever).
    if (ep->unsignaledTail()) ep->postNop(true);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(ep->qp_, &a, IBV_QP_STATE) != 0) {
      ucs_warn("gmd_rc %s: ibv_modify_qp(ERR): %s", name(), std::strerror(errno));
    }
  }
  failed(ep);
}

}  // namespace gmd::md::rc
