#include "gtest/rxe/ucp_peer.h"

#include <gtest/gtest.h>

namespace gmd::test {

void openUcpPeer(const std::string& device, const UcpPeerOptions& options, UcpPeer* peer) {
  ucp_config_t* config = nullptr;
  ASSERT_EQ(UCS_OK, ucp_config_read(nullptr, nullptr, &config));
  std::vector<std::pair<std::string, std::string>> values = options.config;
  values.emplace_back("NET_DEVICES", device);
  for (const auto& [name, value] : values) {
    const ucs_status_t st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) ucp_config_release(config);
    ASSERT_EQ(UCS_OK, st) << name << "=" << value;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = options.features;
  const ucs_status_t st = ucp_init(&params, config, &peer->context);
  ucp_config_release(config);
  ASSERT_EQ(UCS_OK, st) << "ucp_init on " << device;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (options.am_alignment != 0) {
    wp.field_mask |= UCP_WORKER_PARAM_FIELD_AM_ALIGNMENT;
    wp.am_alignment = options.am_alignment;
  }
  ASSERT_EQ(UCS_OK, ucp_worker_create(peer->context, &wp, &peer->worker)) << "on " << device;
  ucp_address_t* addr = nullptr;
  std::size_t len = 0;
  ASSERT_EQ(UCS_OK, ucp_worker_get_address(peer->worker, &addr, &len));
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(addr);
  peer->address.assign(bytes, bytes + len);
  ucp_worker_release_address(peer->worker, addr);
}

ucp_ep_h connectUcpPeer(const UcpPeer& from, const UcpPeer& to, const ucp_err_handler_t* on_error) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(to.address.data());
  if (on_error != nullptr) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler = *on_error;
  }
  ucp_ep_h h = nullptr;
  const ucs_status_t st = ucp_ep_create(from.worker, &ep, &h);
  EXPECT_EQ(UCS_OK, st) << "ucp_ep_create: " << ucs_status_string(st);
  return st == UCS_OK ? h : nullptr;
}

ucs_status_t closeUcpEndpoint(ucp_ep_h ep, std::uint32_t flags, const std::function<void()>& progress,
                              std::chrono::seconds limit) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = flags;
  void* req = ucp_ep_close_nbx(ep, &p);
  if (!UCS_PTR_IS_PTR(req)) return UCS_PTR_STATUS(req);
  const auto end = std::chrono::steady_clock::now() + limit;
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < end) {
    progress();
  }
  ucp_request_free(req);
  return st;
}

void closeUcpPeer(UcpPeer* peer) {
  if (peer->worker != nullptr) ucp_worker_destroy(peer->worker);
  if (peer->context != nullptr) ucp_cleanup(peer->context);
  *peer = UcpPeer{};
}

}  // namespace gmd::test
