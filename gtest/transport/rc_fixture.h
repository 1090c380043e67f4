// The gmd_rc test fixture shared by the rxe-labelled transport tests (rc_rxe_test.cc: RMA,
// rc_am_rxe_test.cc: active messages): two ifaces on one worker, the initiator on another device than
// the target (CrossDevice: rxe1 → rxe0) or the same one (SameDevice: rxe0 → rxe0), an endpoint
// between them, and helpers to register memory, progress and flush.
//
// Thread safety: none; one fixture per test, on the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "md/abi/config_parser.h"

namespace gmd::test {

inline const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

inline uct_component_h findGmd() { return findComponent("gmd"); }

// A completion that counts its calls and keeps the last status.
struct Comp {
  Comp() {
    c.func = [](uct_completion_t* self) {
      auto* me = reinterpret_cast<Comp*>(self);
      ++me->calls;
      me->last = self->status;
    };
    c.count = 1;
    c.status = UCS_OK;
  }
  void reset(int count = 1) {
    c.count = count;
    c.status = UCS_OK;
  }
  uct_completion_t c;  // first: the callback casts back
  int calls = 0;
  ucs_status_t last = UCS_OK;
};

// One side: an MD and a gmd_rc iface on a device port. A side whose md is set before openSide shares
// that MD (another side owns it).
struct Side {
  uct_md_h md = nullptr;
  bool owns_md = false;
  uct_iface_h iface = nullptr;
  std::vector<std::uint8_t> dev_addr, iface_addr;
};

class GmdRc : public ::testing::TestWithParam<bool> {  // param: initiator on another device
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    const auto devs = rdmaDeviceNames();
    if (GetParam() && devs.size() < 2) GTEST_SKIP() << "needs two RDMA devices";
    comp_ = findGmd();
    ASSERT_NE(nullptr, comp_) << "component gmd is not listed";
    ASSERT_EQ(UCS_OK, ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async_));
    ASSERT_EQ(UCS_OK, uct_worker_create(async_, UCS_THREAD_MODE_SINGLE, &worker_));
    // Initiator: rxe1 (cross) or rxe0; target: rxe0.
    openSide(devs[0], &target_);
    openSide(GetParam() ? devs[1] : devs[0], &init_);
    if (HasFatalFailure()) return;
    ep_ = connect(init_, target_);
  }

  void TearDown() override {
    if (ep_ != nullptr) {
      flushEp(ep_);
      uct_ep_destroy(ep_);
    }
    for (uct_ep_h ep : extra_eps_) {
      flushEp(ep);
      uct_ep_destroy(ep);
    }
    std::vector<Side*> sides{&init_, &target_};
    for (Side& s : extra_sides_) sides.push_back(&s);
    for (Side* s : sides) {
      if (s->iface != nullptr) uct_iface_close(s->iface);
    }
    for (Side* s : sides) {
      if (s->md != nullptr && s->owns_md) uct_md_close(s->md);
    }
    if (worker_ != nullptr) uct_worker_destroy(worker_);
    if (async_ != nullptr) ucs_async_context_destroy(async_);
  }

  void openSide(const std::string& dev, Side* s) {
    if (s->md == nullptr) {
      uct_md_config_t* mdc = nullptr;
      ASSERT_EQ(UCS_OK, uct_md_config_read(comp_, nullptr, nullptr, &mdc));
      const ucs_status_t st = uct_md_open(comp_, dev.c_str(), mdc, &s->md);
      uct_config_release(mdc);
      ASSERT_EQ(UCS_OK, st) << ucs_status_string(st);
      s->owns_md = true;
    }
    uct_iface_config_t* ic = nullptr;
    ASSERT_EQ(UCS_OK, uct_md_iface_config_read(s->md, "gmd_rc", nullptr, nullptr, &ic));
    for (const auto& [name, value] : iface_config_) {
      // UCX up to 1.14 matches bare field names, later releases the prefixed ones.
      ASSERT_EQ(UCS_OK, ucx::configModify(ic, "GMD_RC_", name, value)) << name << "=" << value;
    }
    const std::string port = dev + ":1";
    uct_iface_params_t p{};
    p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
                   UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG | UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
    p.rx_headroom = rx_headroom_;
    p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    p.mode.device.tl_name = "gmd_rc";
    p.mode.device.dev_name = port.c_str();
    p.err_handler = [](void* arg, uct_ep_h ep, ucs_status_t status) -> ucs_status_t {
      auto* self = static_cast<GmdRc*>(arg);
      self->failed_eps_.push_back(ep);
      self->failed_status_ = status;
      return UCS_OK;
    };
    p.err_handler_arg = this;
    const ucs_status_t st = uct_iface_open(s->md, worker_, &p, ic, &s->iface);
    uct_config_release(ic);
    ASSERT_EQ(UCS_OK, st) << ucs_status_string(st);
    uct_iface_progress_enable(s->iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    ASSERT_EQ(UCS_OK, uct_iface_query(s->iface, &attr_));
    s->dev_addr.resize(attr_.device_addr_len);
    s->iface_addr.resize(attr_.iface_addr_len);
    ASSERT_EQ(UCS_OK, uct_iface_get_device_address(
                          s->iface, reinterpret_cast<uct_device_addr_t*>(s->dev_addr.data())));
    ASSERT_EQ(UCS_OK, uct_iface_get_address(
                          s->iface, reinterpret_cast<uct_iface_addr_t*>(s->iface_addr.data())));
  }

  uct_ep_h connect(const Side& from, const Side& to) {
    uct_ep_params_t p{};
    p.field_mask =
        UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
    p.iface = from.iface;
    p.dev_addr = reinterpret_cast<const uct_device_addr_t*>(to.dev_addr.data());
    p.iface_addr = reinterpret_cast<const uct_iface_addr_t*>(to.iface_addr.data());
    uct_ep_h ep = nullptr;
    const ucs_status_t st = uct_ep_create(&p, &ep);
    EXPECT_EQ(UCS_OK, st) << ucs_status_string(st);
    return ep;
  }

  // Progresses until `done`; the limit only keeps a broken build from hanging the suite.
  bool progressUntil(const std::function<bool()>& done, double seconds = 120) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!done()) {
      uct_worker_progress(worker_);
      if (std::chrono::steady_clock::now() > end) return false;
    }
    return true;
  }

  // Issues a put/get, progressing while the transport has no resources. Returns the final status of
  // the call (UCS_INPROGRESS: `comp` will be called).
  ucs_status_t issue(bool put, uct_ep_h ep, const uct_iov_t* iov, std::size_t n,
                     std::uint64_t raddr, uct_rkey_t rkey, uct_completion_t* comp) {
    ucs_status_t st;
    progressUntil([&] {
      st = put ? uct_ep_put_zcopy(ep, iov, n, raddr, rkey, comp)
               : uct_ep_get_zcopy(ep, iov, n, raddr, rkey, comp);
      return st != UCS_ERR_NO_RESOURCE;
    });
    return st;
  }

  // One zero-copy transfer of a whole buffer, waited for. Returns the completion status.
  ucs_status_t transfer(bool put, void* local, uct_mem_h memh, std::size_t len, void* remote,
                        uct_rkey_t rkey) {
    uct_iov_t iov{local, len, memh, 0, 1};
    Comp c;
    const ucs_status_t st =
        issue(put, ep_, &iov, 1, reinterpret_cast<std::uint64_t>(remote), rkey, &c.c);
    if (st != UCS_INPROGRESS) return st;
    EXPECT_TRUE(progressUntil([&] { return c.calls > 0; })) << "completion never called";
    EXPECT_EQ(1, c.calls);
    return c.last;
  }

  void flushEp(uct_ep_h ep) {
    Comp c;
    ucs_status_t st;
    progressUntil([&] {
      st = uct_ep_flush(ep, 0, &c.c);
      return st != UCS_ERR_NO_RESOURCE;
    });
    if (st == UCS_INPROGRESS) progressUntil([&] { return c.calls > 0; });
  }

  uct_mem_h reg(uct_md_h md, void* addr, std::size_t len) {
    uct_mem_h memh = nullptr;
    EXPECT_EQ(UCS_OK, uct_md_mem_reg(md, addr, len, UCT_MD_MEM_ACCESS_RMA, &memh));
    return memh;
  }

  uct_rkey_bundle_t rkeyOf(uct_md_h md, uct_mem_h memh) {
    uct_md_attr_t a{};
    EXPECT_EQ(UCS_OK, uct_md_query(md, &a));
    std::vector<std::uint8_t> buf(a.rkey_packed_size);
    EXPECT_EQ(UCS_OK, uct_md_mkey_pack(md, memh, buf.data()));
    uct_rkey_bundle_t b{};
    EXPECT_EQ(UCS_OK, uct_rkey_unpack(comp_, buf.data(), &b));
    return b;
  }

  std::vector<std::pair<const char*, const char*>> iface_config_;  // UCX_GMD_RC_* for every iface
  std::size_t rx_headroom_ = 0;
  std::deque<Side> extra_sides_;   // more ifaces a test opens (closed in TearDown)
  std::vector<uct_ep_h> extra_eps_;  // their endpoints (destroyed in TearDown, before the ifaces)
  uct_component_h comp_ = nullptr;
  ucs_async_context_t* async_ = nullptr;
  uct_worker_h worker_ = nullptr;
  Side init_, target_;
  uct_iface_attr_t attr_{};
  uct_ep_h ep_ = nullptr;
  std::vector<uct_ep_h> failed_eps_;
  ucs_status_t failed_status_ = UCS_OK;
};

}  // namespace gmd::test
