// gmd_rc through the public UCT API, on real RDMA devices (soft-RoCE in the VM), the way UCX uses it:
// the module is loaded before UCX is used (as LD_PRELOAD would), two ifaces on one worker (rxe1 → rxe0,
// and rxe0 → rxe0), endpoints created from the peer's addresses, zero-copy put/get with gmd's memory
// handles and remote keys, completions, flush, fence, the pending queue while an endpoint connects,
// failures (unreachable peer, revoked remote key).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <uct/api/uct.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "md/abi/config_parser.h"
#include "gtest/rxe/verbs_fixture.h"
#include "gtest/transport/rc_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

INSTANTIATE_TEST_SUITE_P(Devices, GmdRc, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRc, ListedWithHonestAttributes) {
  uct_tl_resource_desc_t* res = nullptr;
  unsigned n = 0;
  ASSERT_EQ(UCS_OK, uct_md_query_tl_resources(target_.md, &res, &n));
  bool found = false;
  for (unsigned i = 0; i < n; ++i) {
    if (std::strcmp(res[i].tl_name, "gmd_rc") == 0) {
      found = true;
      EXPECT_EQ(UCT_DEVICE_TYPE_NET, res[i].dev_type);
      EXPECT_NE(nullptr, std::strchr(res[i].dev_name, ':')) << res[i].dev_name;
    }
  }
  uct_release_tl_resource_list(res);
  EXPECT_TRUE(found) << "gmd_rc is not a transport of the gmd MD";

  const std::uint64_t need = UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_GET_ZCOPY |
                             UCT_IFACE_FLAG_AM_SHORT | UCT_IFACE_FLAG_AM_BCOPY |
                             UCT_IFACE_FLAG_AM_ZCOPY | UCT_IFACE_FLAG_CB_SYNC |
                             UCT_IFACE_FLAG_PENDING | UCT_IFACE_FLAG_CONNECT_TO_IFACE;
  EXPECT_EQ(need, attr_.cap.flags & need);
  const std::uint64_t not_offered = UCT_IFACE_FLAG_CONNECT_TO_EP | UCT_IFACE_FLAG_GET_SHORT |
                                    UCT_IFACE_FLAG_ATOMIC_CPU;
  EXPECT_EQ(0u, attr_.cap.flags & not_offered);
  EXPECT_GE(attr_.cap.put.max_zcopy, 8u << 20);
  EXPECT_GE(attr_.cap.put.max_iov, 1u);
  EXPECT_GT(attr_.bandwidth.shared + attr_.bandwidth.dedicated, 0);
  EXPECT_GT(attr_.latency.c, 0);

  EXPECT_TRUE(uct_iface_is_reachable(
      init_.iface, reinterpret_cast<const uct_device_addr_t*>(target_.dev_addr.data()),
      reinterpret_cast<const uct_iface_addr_t*>(target_.iface_addr.data())));
  std::vector<std::uint8_t> bad = target_.dev_addr;
  bad[0] = 0x7f;  // unknown address version
  EXPECT_FALSE(uct_iface_is_reachable(
      init_.iface, reinterpret_cast<const uct_device_addr_t*>(bad.data()),
      reinterpret_cast<const uct_iface_addr_t*>(target_.iface_addr.data())));

  // Operations gmd_rc does not offer say so.
  char one = 0;
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, uct_ep_get_short(ep_, &one, 1, 0, 0));
}

TEST_P(GmdRc, PutAndGetMoveEveryByteAtManySizes) {
  for (const std::size_t len : {std::size_t{1}, kPage + 3, std::size_t{1} << 20,
                                std::size_t{8} << 20}) {
    SCOPED_TRACE(len);
    Mapping local(len), remote(len);
    ASSERT_NE(nullptr, local.addr);
    ASSERT_NE(nullptr, remote.addr);
    uct_mem_h lm = reg(init_.md, local.addr, len);
    uct_mem_h rm = reg(target_.md, remote.addr, len);
    uct_rkey_bundle_t rk = rkeyOf(target_.md, rm);

    fillPattern(local.addr, len, len);
    std::memset(remote.addr, 0, len);
    EXPECT_EQ(UCS_OK, transfer(true, local.addr, lm, len, remote.addr, rk.rkey));
    EXPECT_EQ(len, checkPattern(remote.addr, len, len)) << "put";

    fillPattern(remote.addr, len, len + 1);
    std::memset(local.addr, 0, len);
    EXPECT_EQ(UCS_OK, transfer(false, local.addr, lm, len, remote.addr, rk.rkey));
    EXPECT_EQ(len, checkPattern(local.addr, len, len + 1)) << "get";

    uct_rkey_release(comp_, &rk);
    uct_md_mem_dereg(target_.md, rm);
    uct_md_mem_dereg(init_.md, lm);
  }
}

TEST_P(GmdRc, IovEntriesGatherAndScatter) {
  const std::size_t part = 3 * kPage + 5;
  Mapping a(part), b(part), c(part), remote(3 * part);
  uct_mem_h ma = reg(init_.md, a.addr, part), mb = reg(init_.md, b.addr, part),
            mc = reg(init_.md, c.addr, part), rm = reg(target_.md, remote.addr, 3 * part);
  uct_rkey_bundle_t rk = rkeyOf(target_.md, rm);
  fillPattern(remote.addr, 3 * part, 7);
  uct_iov_t iov[3] = {{a.addr, part, ma, 0, 1}, {b.addr, part, mb, 0, 1}, {c.addr, part, mc, 0, 1}};
  ASSERT_GE(attr_.cap.get.max_iov, 3u);
  Comp done;
  ucs_status_t st = issue(false, ep_, iov, 3, reinterpret_cast<std::uint64_t>(remote.addr),
                          rk.rkey, &done.c);
  ASSERT_EQ(UCS_INPROGRESS, st);
  ASSERT_TRUE(progressUntil([&] { return done.calls > 0; }));
  EXPECT_EQ(UCS_OK, done.last);
  std::vector<std::uint8_t> joined(3 * part);
  std::memcpy(joined.data(), a.addr, part);
  std::memcpy(joined.data() + part, b.addr, part);
  std::memcpy(joined.data() + 2 * part, c.addr, part);
  EXPECT_EQ(3 * part, checkPattern(joined.data(), 3 * part, 7)) << "get scattered wrongly";

  std::memset(remote.addr, 0, 3 * part);
  done.reset();
  st = issue(true, ep_, iov, 3, reinterpret_cast<std::uint64_t>(remote.addr), rk.rkey, &done.c);
  ASSERT_EQ(UCS_INPROGRESS, st);
  ASSERT_TRUE(progressUntil([&] { return done.calls > 0; }));
  EXPECT_EQ(0, std::memcmp(joined.data(), remote.addr, 3 * part)) << "put gathered wrongly";

  uct_rkey_release(comp_, &rk);
  for (auto [md, m] : {std::pair{init_.md, ma}, {init_.md, mb}, {init_.md, mc}, {target_.md, rm}}) {
    uct_md_mem_dereg(md, m);
  }
}

// A fresh endpoint is still connecting: put says NO_RESOURCE, the pending queue takes the request
// and calls it back once the QP is up. Purge hands back what was never dispatched.
TEST_P(GmdRc, PendingQueueCarriesWorkUntilConnected) {
  Mapping local(kPage), remote(kPage);
  uct_mem_h lm = reg(init_.md, local.addr, kPage), rm = reg(target_.md, remote.addr, kPage);
  uct_rkey_bundle_t rk = rkeyOf(target_.md, rm);
  fillPattern(local.addr, kPage, 11);

  uct_ep_h ep = connect(init_, target_);
  ASSERT_NE(nullptr, ep);
  uct_iov_t iov{local.addr, kPage, lm, 0, 1};
  Comp done;
  ASSERT_EQ(UCS_ERR_NO_RESOURCE,
            uct_ep_put_zcopy(ep, &iov, 1, reinterpret_cast<std::uint64_t>(remote.addr), rk.rkey,
                             &done.c));
  struct Req {
    uct_pending_req_t req;  // first
    GmdRc* self;
    uct_ep_h ep;
    uct_iov_t* iov;
    std::uint64_t raddr;
    uct_rkey_t rkey;
    Comp* done;
    int calls = 0;
  } r{{}, this, ep, &iov, reinterpret_cast<std::uint64_t>(remote.addr), rk.rkey, &done};
  r.req.func = [](uct_pending_req_t* self) -> ucs_status_t {
    auto* me = reinterpret_cast<Req*>(self);
    ++me->calls;
    const ucs_status_t st = uct_ep_put_zcopy(me->ep, me->iov, 1, me->raddr, me->rkey, &me->done->c);
    return st == UCS_INPROGRESS || st == UCS_OK ? UCS_OK : st;
  };
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep, &r.req, 0));
  ASSERT_TRUE(progressUntil([&] { return done.calls > 0; }));
  EXPECT_EQ(UCS_OK, done.last);
  EXPECT_EQ(1, r.calls);
  EXPECT_EQ(kPage, checkPattern(remote.addr, kPage, 11));
  // Connected with resources: pending_add refuses (the caller retries the operation).
  EXPECT_EQ(UCS_ERR_BUSY, uct_ep_pending_add(ep, &r.req, 0));
  flushEp(ep);
  uct_ep_destroy(ep);

  // Purge: two requests queued on a connecting endpoint come back through the purge callback.
  uct_ep_h ep2 = connect(init_, target_);
  Req r1 = r, r2 = r;
  r1.calls = r2.calls = 0;
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep2, &r1.req, 0));
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep2, &r2.req, 0));
  std::vector<uct_pending_req_t*> purged;
  uct_ep_pending_purge(
      ep2,
      [](uct_pending_req_t* req, void* arg) {
        static_cast<std::vector<uct_pending_req_t*>*>(arg)->push_back(req);
      },
      &purged);
  EXPECT_EQ((std::vector<uct_pending_req_t*>{&r1.req, &r2.req}), purged);
  for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
  EXPECT_EQ(0, r1.calls + r2.calls) << "a purged request was dispatched";
  uct_ep_destroy(ep2);

  uct_rkey_release(comp_, &rk);
  uct_md_mem_dereg(target_.md, rm);
  uct_md_mem_dereg(init_.md, lm);
}

// Many operations without completions, then flush: when the flush completes every byte has landed;
// the iface flush agrees. A fence between a put and a get is accepted and the get sees the put.
TEST_P(GmdRc, FlushCoversEveryOperationAndFenceOrders) {
  constexpr int kOps = 600;  // more than the send queue: exercises NO_RESOURCE and credits
  const std::size_t len = 4 * kPage;
  Mapping local(len), remote(kOps * len);
  uct_mem_h lm = reg(init_.md, local.addr, len), rm = reg(target_.md, remote.addr, kOps * len);
  uct_rkey_bundle_t rk = rkeyOf(target_.md, rm);
  fillPattern(local.addr, len, 21);
  std::memset(remote.addr, 0, kOps * len);
  uct_iov_t iov{local.addr, len, lm, 0, 1};
  for (int i = 0; i < kOps; ++i) {
    const ucs_status_t st =
        issue(true, ep_, &iov, 1, reinterpret_cast<std::uint64_t>(remote.addr + i * len), rk.rkey,
              nullptr);
    ASSERT_TRUE(st == UCS_INPROGRESS || st == UCS_OK) << ucs_status_string(st);
  }
  Comp f;
  const ucs_status_t st = uct_ep_flush(ep_, 0, &f.c);
  ASSERT_TRUE(st == UCS_INPROGRESS || st == UCS_OK) << ucs_status_string(st);
  if (st == UCS_INPROGRESS) {
    ASSERT_TRUE(progressUntil([&] { return f.calls > 0; }));
    EXPECT_EQ(UCS_OK, f.last);
  }
  for (int i = 0; i < kOps; ++i) {
    ASSERT_EQ(len, checkPattern(remote.addr + i * len, len, 21)) << "operation " << i;
  }
  EXPECT_TRUE(progressUntil([&] { return uct_iface_flush(init_.iface, 0, nullptr) == UCS_OK; }));

  // put; fence; get of the same bytes into another buffer.
  Mapping back(len);
  uct_mem_h bm = reg(init_.md, back.addr, len);
  fillPattern(local.addr, len, 22);
  ASSERT_EQ(UCS_INPROGRESS, issue(true, ep_, &iov, 1, reinterpret_cast<std::uint64_t>(remote.addr),
                                  rk.rkey, nullptr));
  EXPECT_EQ(UCS_OK, uct_ep_fence(ep_, 0));
  EXPECT_EQ(UCS_OK, uct_iface_fence(init_.iface, 0));
  uct_iov_t biov{back.addr, len, bm, 0, 1};
  Comp g;
  ASSERT_EQ(UCS_INPROGRESS, issue(false, ep_, &biov, 1,
                                  reinterpret_cast<std::uint64_t>(remote.addr), rk.rkey, &g.c));
  ASSERT_TRUE(progressUntil([&] { return g.calls > 0; }));
  EXPECT_EQ(len, checkPattern(back.addr, len, 22)) << "the get overtook the put";

  uct_rkey_release(comp_, &rk);
  uct_md_mem_dereg(init_.md, bm);
  uct_md_mem_dereg(target_.md, rm);
  uct_md_mem_dereg(init_.md, lm);
}

// The seed's hazard through the transport: the target unmaps a registered buffer and maps new pages
// at the same address. A put through the old remote key fails at the initiator (completion status
// and the iface's error handler) and never lands in the new pages; the new key works.
TEST_P(GmdRc, PutThroughRevokedKeyFailsAtInitiator) {
  constexpr std::size_t kLen = 64 * 1024;
  Mapping src(kLen);
  uct_mem_h sm = reg(init_.md, src.addr, kLen);
  auto* target = static_cast<std::uint8_t*>(
      mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(MAP_FAILED, target);
  uct_mem_h old_m = reg(target_.md, target, kLen);
  uct_rkey_bundle_t old_rk = rkeyOf(target_.md, old_m);
  fillPattern(src.addr, kLen, 31);
  ASSERT_EQ(UCS_OK, transfer(true, src.addr, sm, kLen, target, old_rk.rkey));
  EXPECT_EQ(kLen, checkPattern(target, kLen, 31));
  uct_md_mem_dereg(target_.md, old_m);  // released; still cached

  ASSERT_EQ(0, munmap(target, kLen));
  ASSERT_EQ(target, mmap(target, kLen, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
  fillPattern(target, kLen, 32);
  uct_mem_h new_m = reg(target_.md, target, kLen);
  uct_rkey_bundle_t new_rk = rkeyOf(target_.md, new_m);
  EXPECT_NE(old_rk.rkey, new_rk.rkey);

  // A separate endpoint: the failed one is unusable afterwards.
  uct_ep_h victim = connect(init_, target_);
  std::swap(victim, ep_);
  fillPattern(src.addr, kLen, 33);
  const ucs_status_t st = transfer(true, src.addr, sm, kLen, target, old_rk.rkey);
  EXPECT_NE(UCS_OK, st) << "a put through a revoked key completed successfully";
  EXPECT_EQ(kLen, checkPattern(target, kLen, 32)) << "bytes landed through a revoked key";
  EXPECT_TRUE(progressUntil([&] { return !failed_eps_.empty(); }))
      << "the error handler was not called";
  if (!failed_eps_.empty()) {
    EXPECT_EQ(ep_, failed_eps_[0]);
    EXPECT_NE(UCS_OK, failed_status_);
  }
  uct_iov_t iov{src.addr, kLen, sm, 0, 1};
  EXPECT_NE(UCS_INPROGRESS, uct_ep_put_zcopy(ep_, &iov, 1, reinterpret_cast<std::uint64_t>(target),
                                             new_rk.rkey, nullptr))
      << "a failed endpoint accepted work";
  uct_ep_destroy(ep_);
  ep_ = victim;

  // The healthy endpoint and the new key reach the new pages.
  ASSERT_EQ(UCS_OK, transfer(true, src.addr, sm, kLen, target, new_rk.rkey));
  EXPECT_EQ(kLen, checkPattern(target, kLen, 33));

  uct_rkey_release(comp_, &old_rk);
  uct_rkey_release(comp_, &new_rk);
  uct_md_mem_dereg(target_.md, new_m);
  uct_md_mem_dereg(init_.md, sm);
  munmap(target, kLen);
}

// An iface address nobody listens on: the endpoint fails to connect, operations then return
// UCS_ERR_UNREACHABLE and the error handler hears of it.
TEST_P(GmdRc, UnreachablePeerFailsTheEndpoint) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  socklen_t sl = sizeof(sa);
  ASSERT_EQ(0, bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)));
  ASSERT_EQ(0, getsockname(s, reinterpret_cast<sockaddr*>(&sa), &sl));
  close(s);  // the port is closed now: connections are refused
  Side dead = target_;
  std::memcpy(dead.iface_addr.data() + 2, &sa.sin_port, 2);
  const std::uint32_t lo = htonl(INADDR_LOOPBACK);
  std::memcpy(dead.iface_addr.data() + 4, &lo, 4);

  uct_ep_h ep = connect(init_, dead);
  ASSERT_NE(nullptr, ep);
  Mapping local(kPage);
  uct_mem_h lm = reg(init_.md, local.addr, kPage);
  uct_iov_t iov{local.addr, kPage, lm, 0, 1};
  const ucs_status_t st = issue(true, ep, &iov, 1, 0x1000, 0, nullptr);
  EXPECT_EQ(UCS_ERR_UNREACHABLE, st) << ucs_status_string(st);
  EXPECT_TRUE(progressUntil([&] { return !failed_eps_.empty(); }));
  EXPECT_EQ(UCS_OK, uct_ep_flush(ep, 0, nullptr)) << "nothing is in flight on a failed endpoint";
  uct_ep_destroy(ep);
  uct_md_mem_dereg(init_.md, lm);
}

// Several endpoints at once, and destroying one with work in flight does not disturb the others.
TEST_P(GmdRc, ManyEndpointsAndDestroyWithWorkInFlight) {
  constexpr int kEps = 8;
  const std::size_t len = 256 * 1024;
  Mapping local(len), remote(kEps * len);
  uct_mem_h lm = reg(init_.md, local.addr, len), rm = reg(target_.md, remote.addr, kEps * len);
  uct_rkey_bundle_t rk = rkeyOf(target_.md, rm);
  fillPattern(local.addr, len, 41);
  std::memset(remote.addr, 0, kEps * len);
  std::vector<uct_ep_h> eps;
  for (int i = 0; i < kEps; ++i) eps.push_back(connect(init_, target_));
  uct_iov_t iov{local.addr, len, lm, 0, 1};
  std::vector<Comp> comps(kEps);
  for (int i = 0; i < kEps; ++i) {
    ASSERT_EQ(UCS_INPROGRESS,
              issue(true, eps[i], &iov, 1, reinterpret_cast<std::uint64_t>(remote.addr + i * len),
                    rk.rkey, &comps[i].c));
  }
  // Destroy the first endpoint at once, work in flight: its completion has been called when destroy
  // returns (UCS_ERR_CANCELED unless it had completed already), and never after that.
  uct_ep_destroy(eps[0]);
  const int calls0 = comps[0].calls;
  EXPECT_EQ(1, calls0);
  ASSERT_TRUE(progressUntil([&] {
    for (int i = 1; i < kEps; ++i) {
      if (comps[i].calls == 0) return false;
    }
    return true;
  }));
  for (int i = 1; i < kEps; ++i) {
    EXPECT_EQ(UCS_OK, comps[i].last);
    EXPECT_EQ(len, checkPattern(remote.addr + i * len, len, 41)) << "endpoint " << i;
  }
  for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
  EXPECT_EQ(calls0, comps[0].calls) << "a destroyed endpoint's completion was called";
  for (int i = 1; i < kEps; ++i) uct_ep_destroy(eps[i]);

  uct_rkey_release(comp_, &rk);
  uct_md_mem_dereg(target_.md, rm);
  uct_md_mem_dereg(init_.md, lm);
}

}  // namespace
}  // namespace gmd::test

namespace gmd::test {
namespace {

// A get larger than UCX_GMD_RC_MAX_READ is posted as several RDMA READs (soft-RoCE loses long READ
// response bursts, see md/rc/rc_iface.cc) and completes once, as one operation. A small READ size
// and send queue make the pieces cross iov boundaries and a get need more slots than are free.
class GmdRcSplitReads : public GmdRc {
 protected:
  void SetUp() override {
    iface_config_ = {{"MAX_READ", "12288"}, {"TX_QUEUE_LEN", "16"}};
    GmdRc::SetUp();
  }
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcSplitReads, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcSplitReads, LargeGetsAreSeveralReadsCompletedOnce) {
  // Three iov entries of 3 pages + 5 bytes: 12 KiB READs end inside the entries.
  const std::size_t part = 3 * kPage + 5;
  Mapping a(part), b(part), c(part), remote(3 * part);
  uct_mem_h ma = reg(init_.md, a.addr, part), mb = reg(init_.md, b.addr, part),
            mc = reg(init_.md, c.addr, part), rm = reg(target_.md, remote.addr, 3 * part);
  uct_rkey_bundle_t rk = rkeyOf(target_.md, rm);
  fillPattern(remote.addr, 3 * part, 21);
  uct_iov_t iov[3] = {{a.addr, part, ma, 0, 1}, {b.addr, part, mb, 0, 1}, {c.addr, part, mc, 0, 1}};
  Comp done;
  ASSERT_EQ(UCS_INPROGRESS, issue(false, ep_, iov, 3, reinterpret_cast<std::uint64_t>(remote.addr),
                                  rk.rkey, &done.c));
  ASSERT_TRUE(progressUntil([&] { return done.calls > 0; }));
  EXPECT_EQ(UCS_OK, done.last);
  std::vector<std::uint8_t> joined(3 * part);
  std::memcpy(joined.data(), a.addr, part);
  std::memcpy(joined.data() + part, b.addr, part);
  std::memcpy(joined.data() + 2 * part, c.addr, part);
  EXPECT_EQ(3 * part, checkPattern(joined.data(), 3 * part, 21)) << "split get scattered wrongly";

  // 1 MiB in 12 KiB READs would need 86 work requests, more than the send queue of 16: it goes out
  // as 16 larger READs and still completes once.
  const std::size_t big = std::size_t{1} << 20;
  Mapping local(big), source(big);
  uct_mem_h lm = reg(init_.md, local.addr, big), sm = reg(target_.md, source.addr, big);
  uct_rkey_bundle_t sk = rkeyOf(target_.md, sm);
  fillPattern(source.addr, big, 22);
  EXPECT_EQ(UCS_OK, transfer(false, local.addr, lm, big, source.addr, sk.rkey));
  EXPECT_EQ(big, checkPattern(local.addr, big, 22));

  // A small get holds one of the 16 slots, so the big get (16 READs) does not fit: NO_RESOURCE,
  // and pending_add must take it (UCS_ERR_BUSY would make the caller retry forever) and dispatch
  // it once the small get has completed.
  std::memset(local.addr, 0, big);
  std::memset(a.addr, 0, part);
  Comp small_done, big_done;
  uct_iov_t small_iov{a.addr, 64, ma, 0, 1};
  ASSERT_EQ(UCS_INPROGRESS,
            uct_ep_get_zcopy(ep_, &small_iov, 1, reinterpret_cast<std::uint64_t>(remote.addr),
                             rk.rkey, &small_done.c));
  uct_iov_t big_iov{local.addr, big, lm, 0, 1};
  const auto raddr = reinterpret_cast<std::uint64_t>(source.addr);
  ASSERT_EQ(UCS_ERR_NO_RESOURCE,
            uct_ep_get_zcopy(ep_, &big_iov, 1, raddr, sk.rkey, &big_done.c));
  struct Req {
    uct_pending_req_t req;  // first
    uct_ep_h ep;
    uct_iov_t* iov;
    std::uint64_t raddr;
    uct_rkey_t rkey;
    Comp* done;
    int calls = 0;
  } r{{}, ep_, &big_iov, raddr, sk.rkey, &big_done};
  r.req.func = [](uct_pending_req_t* self) -> ucs_status_t {
    auto* me = reinterpret_cast<Req*>(self);
    ++me->calls;
    const ucs_status_t st = uct_ep_get_zcopy(me->ep, me->iov, 1, me->raddr, me->rkey, &me->done->c);
    return st == UCS_INPROGRESS || st == UCS_OK ? UCS_OK : st;
  };
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep_, &r.req, 0));
  ASSERT_TRUE(progressUntil([&] { return small_done.calls > 0 && big_done.calls > 0; }));
  EXPECT_EQ(1, small_done.calls);
  EXPECT_EQ(1, big_done.calls);
  EXPECT_EQ(UCS_OK, big_done.last);
  EXPECT_EQ(1, r.calls) << "dispatched before the get fit into the send queue";
  EXPECT_EQ(big, checkPattern(local.addr, big, 22));
  EXPECT_EQ(64u, checkPattern(a.addr, 64, 21));

  uct_rkey_release(comp_, &sk);
  uct_rkey_release(comp_, &rk);
  for (auto [md, m] : {std::pair{init_.md, ma}, {init_.md, mb}, {init_.md, mc}, {target_.md, rm},
                       {init_.md, lm}, {target_.md, sm}}) {
    uct_md_mem_dereg(md, m);
  }
}

}  // namespace
}  // namespace gmd::test

namespace gmd::test {
namespace {

std::vector<std::string> g_logged;  // error lines while a handler below is pushed
ucs_log_func_rc_t keepErrors(const char*, unsigned, const char*, ucs_log_level_t level,
                             const ucs_log_component_config_t*, const char* fmt, va_list ap) {
  if (level <= UCS_LOG_LEVEL_ERROR) {
    char buf[512];
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    g_logged.emplace_back(buf);
  }
  return UCS_LOG_FUNC_RC_STOP;
}

// Values above what the real device and port offer are refused when the iface opens, with one
// error line naming the variable (the unit test covers the values no device is needed for).
TEST(GmdRcConfig, ValuesAboveTheHardwareLimitsAreRefusedAtIfaceOpen) {
  GMD_REQUIRE_RDMA_DEVICES(1);
  const std::string dev = rdmaDeviceNames()[0];
  std::string err;
  auto port = VerbsPort::open(dev, &err);
  ASSERT_NE(nullptr, port) << err;
  ibv_device_attr da{};
  ibv_port_attr pa{};
  ASSERT_EQ(0, ibv_query_device(port->context(), &da));
  ASSERT_EQ(0, ibv_query_port(port->context(), port->port(), &pa));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"TX_QUEUE_LEN", std::to_string(static_cast<unsigned>(da.max_qp_wr) + 1)},
      {"TX_CQ_LEN", std::to_string(static_cast<unsigned>(da.max_cqe) + 1)},
      {"MAX_READ", std::to_string(static_cast<unsigned long long>(pa.max_msg_sz) + 1)},
      {"MAX_NUM_EPS", std::to_string(static_cast<unsigned long>(da.max_qp) + 1)},
      {"GID_INDEX", std::to_string(pa.gid_tbl_len)},
  };
  uct_component_h comp = findComponent("gmd");
  ASSERT_NE(nullptr, comp);
  ucs_status_t st;
  uct_md_h md = openMd(comp, dev, &st);
  ASSERT_NE(nullptr, md) << ucs_status_string(st);
  ucs_async_context_t* async = nullptr;
  uct_worker_h worker = nullptr;
  ASSERT_EQ(UCS_OK, ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async));
  ASSERT_EQ(UCS_OK, uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));
  const std::string dev_port = dev + ":1";
  // Opens gmd_rc with `name`=`value` (nullptr: the defaults); closes it again if it opened.
  auto tryOpen = [&](const char* name, const char* value) {
    uct_iface_config_t* ic = nullptr;
    EXPECT_EQ(UCS_OK, uct_md_iface_config_read(md, "gmd_rc", nullptr, nullptr, &ic));
    if (ic == nullptr) return UCS_ERR_NO_MEMORY;
    if (name != nullptr) {
      EXPECT_EQ(UCS_OK, ucx::configModify(ic, "GMD_RC_", name, value)) << name;
    }
    uct_iface_params_t p{};
    p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE;
    p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    p.mode.device.tl_name = "gmd_rc";
    p.mode.device.dev_name = dev_port.c_str();
    uct_iface_h iface = nullptr;
    const ucs_status_t status = uct_iface_open(md, worker, &p, ic, &iface);
    uct_config_release(ic);
    if (status == UCS_OK) uct_iface_close(iface);
    return status;
  };
  for (const auto& [name, value] : cases) {
    g_logged.clear();
    ucs_log_push_handler(keepErrors);
    st = tryOpen(name.c_str(), value.c_str());
    ucs_log_pop_handler();
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, st) << name << "=" << value << ": " << ucs_status_string(st);
    ASSERT_EQ(1u, g_logged.size()) << name << "=" << value << ": one error line";
    EXPECT_NE(std::string::npos, g_logged[0].find("UCX_GMD_RC_" + name + "=" + value))
        << g_logged[0];
  }
  EXPECT_EQ(UCS_OK, tryOpen(nullptr, nullptr)) << "the defaults open";
  uct_worker_destroy(worker);
  ucs_async_context_destroy(async);
  uct_md_close(md);
}

}  // namespace
}  // namespace gmd::test
