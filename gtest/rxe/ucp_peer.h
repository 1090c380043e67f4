// One UCP context with one worker on one RDMA device, for the UCP-level rxe tests (two of them in one
// process stand for two hosts: a sender and a receiver on rxe1 and rxe0 in the soft-RoCE VM).
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace gmd::test {

struct UcpPeer {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<std::uint8_t> address;  // the worker's, for ucp_ep_create on the other side
};

struct UcpPeerOptions {
  // UCX configuration values beside NET_DEVICES (the device given to openUcpPeer), e.g. {"TLS",
  // "gmd_rc,self"}.
  std::vector<std::pair<std::string, std::string>> config;
  std::uint64_t features = UCP_FEATURE_TAG;
  std::size_t am_alignment = 0;  // 0: the worker's default
};

// Opens `peer` (context, single-threaded worker, address) on `device` ("rxe0:1"). Fails the calling
// test with the step that failed; call it through ASSERT_NO_FATAL_FAILURE.
void openUcpPeer(const std::string& device, const UcpPeerOptions& options, UcpPeer* peer);

// An endpoint from `from`'s worker to `to`'s; with `on_error`, in peer error-handling mode
// (UCP_ERR_HANDLING_MODE_PEER) calling it. nullptr after a failed test expectation.
ucp_ep_h connectUcpPeer(const UcpPeer& from, const UcpPeer& to,
                        const ucp_err_handler_t* on_error = nullptr);

// ucp_ep_close_nbx(ep) with `flags` (e.g. UCP_EP_CLOSE_FLAG_FORCE), calling `progress` until the
// close completes or `limit` passes. Returns the close's status: UCS_INPROGRESS when it did not
// complete in time.
ucs_status_t closeUcpEndpoint(ucp_ep_h ep, std::uint32_t flags, const std::function<void()>& progress,
                              std::chrono::seconds limit = std::chrono::seconds(30));

// Destroys the worker and the context (either may be absent) and empties `peer`.
void closeUcpPeer(UcpPeer* peer);

}  // namespace gmd::test
