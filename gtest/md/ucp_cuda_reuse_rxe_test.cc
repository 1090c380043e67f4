// UCP over gmd_rc with (fake) CUDA device memory registered through peer memory: a device buffer is
// sent (rendezvous GET: the receiver's NIC reads the sender's device memory), freed, allocated again
// at the same address with new contents, and sent again. The new bytes must arrive.
//
// From UCX 1.16 UCP keeps its own registration cache, which drops a region only on libucm's
// VM_UNMAPPED and MEM_TYPE_FREE events; cuMemFree unmaps nothing. gmd raises MEM_TYPE_FREE
// (md/ucm_events.h). With UCX_GMD_CUDA_EVENTS=n on UCX >= 1.16 the second send reuses the first
// registration, whose pages are the freed ones (the fake driver punches a freed range out of its
// arena, so a reallocation gets fresh pages), and the old bytes arrive: this test expects exactly
// that there.
//
// Inside the test VM only: the guest claims NVIDIA peer memory (a tmpfs over /sys/kernel/mm in the
// command's own mount namespace) so that gmd registers device memory with ibv_reg_mr
// (UCX_GMD_DMABUF=off). One process, two UCP contexts (receiver on the first device, sender on the
// last), UCX_TLS=gmd_rc,self.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include <ucs/datastruct/pgtable.h>
}
#include <ucs/memory/memtype_cache.h>

#include "gtest/rxe/ucp_peer.h"
#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

constexpr std::size_t kSize = 256 * 1024;
constexpr ucp_tag_t kTag = 0x67646d;
constexpr auto kDeadline = std::chrono::seconds(120);

struct Done {
  bool done = false;
  ucs_status_t status = UCS_OK;
};
void sendDone(void*, ucs_status_t status, void* user) {
  *static_cast<Done*>(user) = {true, status};
}
void recvDone(void*, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
  *static_cast<Done*>(user) = {true, status};
}

using Peer = UcpPeer;

// Claims peer memory for this command's mount namespace (the VM gives each command its own).
bool fakePeerMemory(std::string* why) {
  struct stat st{};
  if (stat("/sys/kernel/mm/memory_peers/nv_mem", &st) == 0) return true;
  if (std::getenv("GMD_RXE_VM") == nullptr || std::getenv("GMD_VM_RESULTS") == nullptr) {
    *why = "claims peer memory by mounting over /sys/kernel/mm: only inside the test VM";
    return false;
  }
  if (mount("gmd-peermem", "/sys/kernel/mm", "tmpfs", 0, nullptr) != 0 ||
      mkdir("/sys/kernel/mm/memory_peers", 0755) != 0 ||
      mkdir("/sys/kernel/mm/memory_peers/nv_mem", 0755) != 0) {
    *why = std::string("cannot fake the peer-memory marker: ") + std::strerror(errno);
    return false;
  }
  return true;
}

class UcpCudaReuse : public ::testing::Test {
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(1);
    std::string why;
    if (!fakePeerMemory(&why)) GTEST_SKIP() << why;
    ASSERT_EQ(0, setenv("UCX_GMD_DMABUF", "off", 1));
    const char* driver = std::getenv("GMD_CUDA_DRIVER_PATH");
    ASSERT_NE(nullptr, driver) << "GMD_CUDA_DRIVER_PATH names the fake driver";
    driver_ = dlopen(driver, RTLD_NOW);
    ASSERT_NE(nullptr, driver_) << dlerror();
    ASSERT_NE(nullptr, dlsym(driver_, "gmd_fake_cuda_driver")) << "not the fake driver";
    const auto devs = rdmaDeviceNames();
    open(devs.front() + ":1", &recv_);
    open(devs.back() + ":1", &send_);
    if (HasFatalFailure()) return;
    ep_ = connectUcpPeer(send_, recv_);
    ASSERT_NE(nullptr, ep_);
  }

  void TearDown() override {
    if (ep_ != nullptr) closeUcpEndpoint(ep_, UCP_EP_CLOSE_FLAG_FORCE, [this] { progress(); });
    for (Peer* p : {&send_, &recv_}) closeUcpPeer(p);
  }

  void open(const std::string& device, Peer* peer) {
    openUcpPeer(device,
                {{{"TLS", "gmd_rc,self"}, {"RNDV_THRESH", "8192"}, {"RNDV_SCHEME", "get_zcopy"}},
                 UCP_FEATURE_TAG},
                peer);
  }

  void progress() {
    ucp_worker_progress(send_.worker);
    ucp_worker_progress(recv_.worker);
  }

  // Looked up after gmd hooked the driver, as a program's later calls would be.
  std::uint64_t cuAlloc(std::size_t size) {
    auto fn = reinterpret_cast<int (*)(std::uint64_t*, std::size_t)>(dlsym(driver_, "cuMemAlloc_v2"));
    std::uint64_t p = 0;
    return fn != nullptr && fn(&p, size) == 0 ? p : 0;
  }
  int cuFree(std::uint64_t p) {
    auto fn = reinterpret_cast<int (*)(std::uint64_t)>(dlsym(driver_, "cuMemFree_v2"));
    return fn != nullptr ? fn(p) : -1;
  }

  // Sends kSize bytes from device address src into a host buffer; returns what arrived.
  std::vector<std::uint8_t> transfer(std::uint64_t src) {
    std::vector<std::uint8_t> dst(kSize, 0xee);
    Done sent, got;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv = recvDone;
    rp.user_data = &got;
    void* rreq = ucp_tag_recv_nbx(recv_.worker, dst.data(), kSize, kTag, ~ucp_tag_t{0}, &rp);
    EXPECT_FALSE(UCS_PTR_IS_ERR(rreq));
    if (rreq == nullptr) got.done = true;
    ucp_request_param_t sp{};
    sp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    sp.cb.send = sendDone;
    sp.user_data = &sent;
    void* sreq = ucp_tag_send_nbx(ep_, reinterpret_cast<void*>(src), kSize, kTag, &sp);
    EXPECT_FALSE(UCS_PTR_IS_ERR(sreq)) << ucs_status_string(UCS_PTR_STATUS(sreq));
    if (sreq == nullptr) sent.done = true;
    const auto end = std::chrono::steady_clock::now() + kDeadline;
    while (!(sent.done && got.done) && std::chrono::steady_clock::now() < end) progress();
    EXPECT_TRUE(sent.done && got.done) << "transfer did not complete";
    EXPECT_EQ(UCS_OK, sent.status);
    EXPECT_EQ(UCS_OK, got.status);
    if (!(sent.done && got.done) || sent.status != UCS_OK || got.status != UCS_OK) {
      transfer_failed_ = true;
    }
    if (UCS_PTR_IS_PTR(sreq)) ucp_request_free(sreq);
    if (UCS_PTR_IS_PTR(rreq)) ucp_request_free(rreq);
    return dst;
  }

  void* driver_ = nullptr;
  bool transfer_failed_ = false;
  Peer recv_, send_;
  ucp_ep_h ep_ = nullptr;
};

TEST_F(UcpCudaReuse, NewContentsArriveAfterFreeAndReallocation) {
  ASSERT_NE(nullptr, ep_);
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  const char* events = std::getenv("UCX_GMD_CUDA_EVENTS");
  const bool events_off = events != nullptr && (events[0] == 'n' || events[0] == 'N');
  const bool ucp_caches = major > 1 || minor >= 16;
  const bool expect_stale = events_off && ucp_caches;

  const std::uint64_t p = cuAlloc(kSize);
  ASSERT_NE(0u, p);
  std::memset(reinterpret_cast<void*>(p), 0xa1, kSize);  // the fake's memory is CPU-accessible
  // What UCP will take the buffer for: CUDA where gmd raises the events, host (not in the cache)
  // where it does not.
  ucs_memory_info_t info{};
  const ucs_status_t cached = ucs_memtype_cache_lookup(reinterpret_cast<void*>(p), kSize, &info);
  if (events_off) {
    EXPECT_EQ(UCS_ERR_NO_ELEM, cached);
  } else {
    EXPECT_EQ(UCS_OK, cached) << "the allocation was not raised";
    if (cached == UCS_OK) {
      EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, info.type);
    }
  }
  const std::vector<std::uint8_t> first = transfer(p);
  ASSERT_FALSE(transfer_failed_);
  EXPECT_EQ(std::vector<std::uint8_t>(kSize, 0xa1), first) << "first transfer";

  ASSERT_EQ(0, cuFree(p));
  const std::uint64_t q = cuAlloc(kSize);
  ASSERT_EQ(p, q) << "the fake driver reuses the lowest free address";
  std::memset(reinterpret_cast<void*>(q), 0x5c, kSize);
  const std::vector<std::uint8_t> second = transfer(q);
  ASSERT_FALSE(transfer_failed_);
  const std::size_t new_bytes = static_cast<std::size_t>(std::count(second.begin(), second.end(), 0x5c));
  std::printf("UCX %u.%u.%u, CUDA events %s: %zu of %zu bytes of the second transfer are new\n",
              major, minor, release, events_off ? "off" : "on", new_bytes, kSize);
  if (expect_stale) {
    EXPECT_EQ(0u, new_bytes) << "UCX >= 1.16 without gmd's MEM_TYPE_FREE: UCP's registration cache "
                                "was expected to reuse the freed buffer's registration";
  } else {
    EXPECT_EQ(kSize, new_bytes) << "stale registration: the freed buffer's pages were sent";
  }
  ASSERT_EQ(0, cuFree(q));
}

}  // namespace
}  // namespace gmd::test
