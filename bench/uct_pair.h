// UCT plumbing shared by the endpoint benchmarks (ep_scale.cc, ep_pending.cc): open a transport
// on a device, connect an endpoint of one side to the other (connect-to-iface as gmd_rc does, or
// the pair of connect-to-ep endpoints rc_verbs needs), and give up with a message.
//
// Thread safety: none; the benchmarks are single-threaded.
#pragma once

#include <errno.h>
#include <ucs/async/async_fwd.h>
#include <ucs/type/status.h>
#include <uct/api/uct.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace gmd::bench {

// Prints "PROGRAM: what[: status]" on stderr and exits with status 1.
[[noreturn]] inline void die(const std::string& what, ucs_status_t st = UCS_OK) {
  std::fprintf(stderr, "%s: %s%s%s\n", program_invocation_short_name, what.c_str(),
               st != UCS_OK ? ": " : "", st != UCS_OK ? ucs_status_string(st) : "");
  std::exit(1);
}

// One opened transport on one device, with its addresses.
struct Side {
  uct_component_h component = nullptr;
  uct_md_h md = nullptr;
  uct_iface_h iface = nullptr;
  uct_iface_attr_t attr{};
  std::vector<char> dev_addr, iface_addr;
};

inline Side openSide(uct_worker_h worker, const char* tl, const char* dev) {
  uct_component_h* comps = nullptr;
  unsigned ncomps = 0;
  ucs_status_t st = uct_query_components(&comps, &ncomps);
  if (st != UCS_OK) die("uct_query_components", st);
  Side s;
  for (unsigned c = 0; c < ncomps && s.iface == nullptr; ++c) {
    uct_component_attr_t ca{};
    ca.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(comps[c], &ca) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(ca.md_resource_count);
    ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    ca.md_resources = mds.data();
    if (uct_component_query(comps[c], &ca) != UCS_OK) continue;
    for (const uct_md_resource_desc_t& mdr : mds) {
      uct_md_config_t* mcfg = nullptr;
      if (uct_md_config_read(comps[c], nullptr, nullptr, &mcfg) != UCS_OK) continue;
      uct_md_h md = nullptr;
      st = uct_md_open(comps[c], mdr.md_name, mcfg, &md);
      uct_config_release(mcfg);
      if (st != UCS_OK) continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned ntls = 0;
      bool found = false;
      if (uct_md_query_tl_resources(md, &tls, &ntls) == UCS_OK) {
        for (unsigned t = 0; t < ntls; ++t) {
          found |= std::strcmp(tls[t].tl_name, tl) == 0 && std::strcmp(tls[t].dev_name, dev) == 0;
        }
        uct_release_tl_resource_list(tls);
      }
      if (!found) {
        uct_md_close(md);
        continue;
      }
      uct_iface_config_t* icfg = nullptr;
      st = uct_md_iface_config_read(md, tl, nullptr, nullptr, &icfg);
      if (st != UCS_OK) die(std::string("iface config of ") + tl, st);
      uct_iface_params_t p{};
      p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE;
      p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
      p.mode.device.tl_name = tl;
      p.mode.device.dev_name = dev;
      st = uct_iface_open(md, worker, &p, icfg, &s.iface);
      uct_config_release(icfg);
      if (st != UCS_OK) die(std::string("opening ") + tl + " on " + dev, st);
      s.component = comps[c];
      s.md = md;
      break;
    }
  }
  uct_release_component_list(comps);
  if (s.iface == nullptr) die(std::string("no ") + tl + " on " + dev);
  if ((st = uct_iface_query(s.iface, &s.attr)) != UCS_OK) die("uct_iface_query", st);
  if (!(s.attr.cap.flags & UCT_IFACE_FLAG_AM_SHORT)) die(std::string(tl) + " has no am_short");
  s.dev_addr.resize(s.attr.device_addr_len);
  s.iface_addr.resize(s.attr.iface_addr_len);
  st = uct_iface_get_device_address(s.iface,
                                    reinterpret_cast<uct_device_addr_t*>(s.dev_addr.data()));
  if (st != UCS_OK) die("uct_iface_get_device_address", st);
  if (s.attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE) {
    st = uct_iface_get_address(s.iface, reinterpret_cast<uct_iface_addr_t*>(s.iface_addr.data()));
    if (st != UCS_OK) die("uct_iface_get_address", st);
  }
  uct_iface_progress_enable(s.iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
  return s;
}

// One single-threaded UCT worker on an async context of its own, with `tl`'s iface on a server and on
// a client device (the same device twice is allowed); closeTwoIfaces undoes it.
struct TwoIfaces {
  ucs_async_context_t* async = nullptr;
  uct_worker_h worker = nullptr;
  Side server, client;
};

inline TwoIfaces openTwoIfaces(const char* tl, const char* server_dev, const char* client_dev) {
  TwoIfaces b;
  ucs_status_t st = ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &b.async);
  if (st != UCS_OK) die("ucs_async_context_create", st);
  if ((st = uct_worker_create(b.async, UCS_THREAD_MODE_SINGLE, &b.worker)) != UCS_OK) {
    die("uct_worker_create", st);
  }
  b.server = openSide(b.worker, tl, server_dev);
  b.client = openSide(b.worker, tl, client_dev);
  return b;
}

inline void closeTwoIfaces(TwoIfaces* b) {
  for (Side* s : {&b->client, &b->server}) {
    uct_iface_close(s->iface);
    uct_md_close(s->md);
  }
  uct_worker_destroy(b->worker);
  ucs_async_context_destroy(b->async);
}

// The endpoints of one connection: the client's, and for connect-to-ep transports the server's.
struct Pair {
  uct_ep_h client = nullptr, server = nullptr;
};

inline Pair connectPair(const Side& server, const Side& client) {
  Pair p;
  uct_ep_params_t ep{};
  ucs_status_t st;
  if (client.attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE) {
    ep.field_mask =
        UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep.iface = client.iface;
    ep.dev_addr = reinterpret_cast<const uct_device_addr_t*>(server.dev_addr.data());
    ep.iface_addr = reinterpret_cast<const uct_iface_addr_t*>(server.iface_addr.data());
    if ((st = uct_ep_create(&ep, &p.client)) != UCS_OK) die("uct_ep_create", st);
    return p;
  }
  ep.field_mask = UCT_EP_PARAM_FIELD_IFACE;
  ep.iface = client.iface;
  if ((st = uct_ep_create(&ep, &p.client)) != UCS_OK) die("uct_ep_create (client)", st);
  ep.iface = server.iface;
  if ((st = uct_ep_create(&ep, &p.server)) != UCS_OK) die("uct_ep_create (server)", st);
  std::vector<char> ca(client.attr.ep_addr_len), sa(server.attr.ep_addr_len);
  auto* cap = reinterpret_cast<uct_ep_addr_t*>(ca.data());
  auto* sap = reinterpret_cast<uct_ep_addr_t*>(sa.data());
  if ((st = uct_ep_get_address(p.client, cap)) != UCS_OK) die("uct_ep_get_address", st);
  if ((st = uct_ep_get_address(p.server, sap)) != UCS_OK) die("uct_ep_get_address", st);
  st = uct_ep_connect_to_ep(
      p.client, reinterpret_cast<const uct_device_addr_t*>(server.dev_addr.data()), sap);
  if (st != UCS_OK) die("uct_ep_connect_to_ep (client)", st);
  st = uct_ep_connect_to_ep(
      p.server, reinterpret_cast<const uct_device_addr_t*>(client.dev_addr.data()), cap);
  if (st != UCS_OK) die("uct_ep_connect_to_ep (server)", st);
  return p;
}

}  // namespace gmd::bench
