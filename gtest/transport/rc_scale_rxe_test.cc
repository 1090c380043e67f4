// gmd_rc at scale: 512 endpoints from one iface to another in one process (both ends here, so the
// process holds both the requesting and the accepting side of every connection). The endpoints
// share one connection to the peer iface (md/rc/rc_connect.h), so the descriptors the process holds
// do not grow with them, every endpoint moves data, the peer's passive QPs go when the endpoints go
// (counted with `rdma resource show`), and max_num_eps is what the device can hold. How long 512
// endpoints take to connect, and the memory they use, is printed, never asserted.
#include <dirent.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/transport/rc_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();
constexpr std::size_t kEps = 512;
constexpr std::size_t kSlot = 64;  // bytes each endpoint puts

int openFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory's own
}

// The number of QPs on `dev` (all processes), from rdma resource show; -1 when it cannot tell.
long qpCount(const std::string& dev) {
  FILE* p = popen("rdma resource show 2>/dev/null", "r");
  if (p == nullptr) return -1;
  char line[512];
  long n = -1;
  const std::string key = " " + dev + ": ";
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    const char* at = std::strstr(line, key.c_str());
    const char* qp = at != nullptr ? std::strstr(at, " qp ") : nullptr;
    if (qp != nullptr) n = std::strtol(qp + 4, nullptr, 10);
  }
  pclose(p);
  return n;
}

long residentKiB() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long size = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<long>(sysconf(_SC_PAGESIZE)) / 1024 : -1;
}

class GmdRcScale : public GmdRc {};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcScale, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcScale, MaxNumEpsIsWhatTheDeviceHolds) {
  ibv_device_attr dev{};
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  ASSERT_NE(nullptr, list);
  const std::string target = rdmaDeviceNames()[0];
  for (int i = 0; i < num; ++i) {
    if (target != ibv_get_device_name(list[i])) continue;
    ibv_context* ctx = ibv_open_device(list[i]);
    ASSERT_NE(nullptr, ctx);
    ASSERT_EQ(0, ibv_query_device(ctx, &dev));
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  ASSERT_GT(dev.max_qp, 0) << "device " << target << " not found";
  uct_iface_attr_t a{};
  ASSERT_EQ(UCS_OK, uct_iface_query(target_.iface, &a));
  EXPECT_GE(a.max_num_eps, kEps);
  EXPECT_LE(a.max_num_eps, static_cast<std::size_t>(dev.max_qp)) << "more endpoints than QPs";
}

TEST_P(GmdRcScale, FiveHundredTwelveEndpointsShareOneConnection) {
  const std::string target_dev = rdmaDeviceNames()[0];
  if (qpCount(target_dev) < 0) GTEST_SKIP() << "rdma resource show (iproute2) cannot count QPs";
  Mapping local(kEps * kSlot), remote(kEps * kSlot);
  ASSERT_NE(nullptr, local.addr);
  ASSERT_NE(nullptr, remote.addr);
  uct_mem_h lmemh = reg(init_.md, local.addr, kEps * kSlot);
  uct_mem_h rmemh = reg(target_.md, remote.addr, kEps * kSlot);
  uct_rkey_bundle_t rkey = rkeyOf(target_.md, rmemh);
  fillPattern(local.addr, kEps * kSlot, 42);
  // The fixture's endpoint connected init_ to target_ first: its connection is in the baseline.
  ASSERT_EQ(UCS_OK, transfer(true, local.addr, lmemh, kSlot, remote.addr, rkey.rkey));
  std::memset(remote.addr, 0, kEps * kSlot);
  const long qps_before = qpCount(target_dev);
  const int fds_before = openFds();
  const long rss_before = residentKiB();
  ASSERT_GT(fds_before, 0);

  for (int round = 0; round < 2; ++round) {  // twice: QP numbers come back, releases must not mix
    const auto start = std::chrono::steady_clock::now();
    std::vector<uct_ep_h> eps;
    for (std::size_t i = 0; i < kEps; ++i) {
      eps.push_back(connect(init_, target_));
      ASSERT_NE(nullptr, eps.back()) << "endpoint " << i;
    }
    // Each endpoint puts its own slot; the pending-aware issue() waits for its connection.
    std::vector<Comp> comps(kEps);
    for (std::size_t i = 0; i < kEps; ++i) {
      uct_iov_t iov{local.addr + i * kSlot, kSlot, lmemh, 0, 1};
      const ucs_status_t st =
          issue(true, eps[i], &iov, 1, reinterpret_cast<std::uint64_t>(remote.addr + i * kSlot),
                rkey.rkey, &comps[i].c);
      ASSERT_EQ(UCS_INPROGRESS, st) << "endpoint " << i << ": " << ucs_status_string(st);
    }
    ASSERT_TRUE(progressUntil([&] {
      for (const Comp& c : comps) {
        if (c.calls == 0) return false;
      }
      return true;
    })) << "not every endpoint's put completed";
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (std::size_t i = 0; i < kEps; ++i) {
      EXPECT_EQ(1, comps[i].calls) << "endpoint " << i;
      EXPECT_EQ(UCS_OK, comps[i].last) << "endpoint " << i;
    }
    EXPECT_EQ(kEps * kSlot, checkPattern(remote.addr, kEps * kSlot, 42))
        << "bytes differ at the target";
    const int fds_during = openFds();
    const long qps_during = qpCount(target_dev);
    // Both ends are in this process: without sharing, 2 descriptors per endpoint.
    EXPECT_LE(fds_during - fds_before, 2) << "descriptors grow with endpoints";
    const long rss = residentKiB();
    std::printf(
        "[ scale    ] round %d: %zu endpoints connected and put in %.2f s (%.0f/s); "
        "descriptors %d -> %d; QPs on %s %ld -> %ld; resident +%ld KiB (%.1f KiB each)\n",
        round, kEps, secs, kEps / secs, fds_before, fds_during, target_dev.c_str(), qps_before,
        qps_during, rss - rss_before, static_cast<double>(rss - rss_before) / kEps);
    if (GetParam()) {  // the target device holds only the passive QPs
      EXPECT_EQ(qps_before + static_cast<long>(kEps), qps_during);
    } else {  // both: the endpoints' and the passive ones
      EXPECT_EQ(qps_before + 2 * static_cast<long>(kEps), qps_during);
    }
    for (uct_ep_h ep : eps) {
      flushEp(ep);
      uct_ep_destroy(ep);
    }
    // The release frames reach the target's listener, which hands the passive QPs back to the
    // target iface to drain and destroy.
    long left = -1;
    EXPECT_TRUE(progressUntil(
        [&] {
          for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
          return (left = qpCount(target_dev)) == qps_before;
        },
        60))
        << "passive QPs left behind: " << left << " on " << target_dev << ", " << qps_before
        << " before";
    EXPECT_EQ(fds_before, openFds());
    std::memset(remote.addr, 0, kEps * kSlot);
  }
  // The fixture's endpoint still works on the shared connection.
  EXPECT_EQ(UCS_OK, transfer(true, local.addr, lmemh, kSlot, remote.addr, rkey.rkey));
  uct_rkey_release(comp_, &rkey);
  uct_md_mem_dereg(init_.md, lmemh);
  uct_md_mem_dereg(target_.md, rmemh);
}

}  // namespace
}  // namespace gmd::test
