// gmd_copy through the public UCT API, with the fake CUDA driver (GMD_CUDA_DRIVER_PATH; device
// memory PROT_NONE under GMD_FAKE_CUDA_CPU_ACCESS=0): the MD's attributes and memory queries, the
// iface's, reachability, put/get short and zcopy between host and device memory both ways and
// device to device, completions, flush, the pending queue, and refused input.
#include <gtest/gtest.h>
#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gtest/copy/device_memory.h"
#include "gtest/rxe/uct_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

constexpr std::size_t kMiB = std::size_t{1} << 20;
// Progress calls a copy may take before a test gives up on it (an iteration bound, not a timer).
constexpr long kMaxSpins = 50'000'000;

struct Completion : uct_completion_t {
  int calls = 0;
  explicit Completion(int n = 1) {
    func = [](uct_completion_t* c) { ++static_cast<Completion*>(c)->calls; };
    count = n;
    status = UCS_OK;
  }
};

struct PendingReq : uct_pending_req_t {
  int calls = 0;
  int purged = 0;
  std::function<ucs_status_t()> action;
};

ucs_status_t runPending(uct_pending_req_t* r) {
  auto* req = static_cast<PendingReq*>(r);
  ++req->calls;
  return req->action ? req->action() : UCS_OK;
}

class CopyUct : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = dev_.load();
    ASSERT_TRUE(why.empty()) << why;
    std::vector<std::string> mds;
    component_ = findComponent("gmd_copy", &mds);
    ASSERT_NE(nullptr, component_) << "component gmd_copy is not registered";
    ASSERT_EQ(std::vector<std::string>{"gmd_cuda"}, mds);
    ucs_status_t st;
    md_ = openMd(component_, "gmd_cuda", &st);
    ASSERT_NE(nullptr, md_) << ucs_status_string(st);
    ASSERT_EQ(UCS_OK, ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async_));
    ASSERT_EQ(UCS_OK, uct_worker_create(async_, UCS_THREAD_MODE_SINGLE, &worker_));
    iface_ = openIface(nullptr, &st);
    ASSERT_NE(nullptr, iface_) << ucs_status_string(st);
    ep_ = connect(iface_, iface_, &st);
    ASSERT_NE(nullptr, ep_) << ucs_status_string(st);
  }

  void TearDown() override {
    if (ep_ != nullptr) uct_ep_destroy(ep_);
    for (uct_iface_h i : ifaces_) uct_iface_close(i);
    if (worker_ != nullptr) uct_worker_destroy(worker_);
    if (async_ != nullptr) ucs_async_context_destroy(async_);
    if (md_ != nullptr) uct_md_close(md_);
    for (std::uint64_t p : allocs_) dev_.free(p);
  }

  // A gmd_copy iface on device "cuda"; max_outstanding sets UCX_GMD_COPY_MAX_OUTSTANDING.
  uct_iface_h openIface(const char* max_outstanding, ucs_status_t* st, const char* dev = "cuda") {
    uct_iface_config_t* config = nullptr;
    *st = uct_md_iface_config_read(md_, "gmd_copy", nullptr, nullptr, &config);
    if (*st != UCS_OK) return nullptr;
    if (max_outstanding != nullptr) {
      // UCX 1.13 takes the field's name, later releases the name with the table's prefix.
      *st = uct_config_modify(config, "MAX_OUTSTANDING", max_outstanding);
      if (*st == UCS_ERR_NO_ELEM) {
        *st = uct_config_modify(config, "GMD_COPY_MAX_OUTSTANDING", max_outstanding);
      }
      if (*st != UCS_OK) {
        uct_config_release(config);
        return nullptr;
      }
    }
    uct_iface_params_t params{};
    params.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE;
    params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name = "gmd_copy";
    params.mode.device.dev_name = dev;
    uct_iface_h iface = nullptr;
    *st = uct_iface_open(md_, worker_, &params, config, &iface);
    uct_config_release(config);
    if (*st != UCS_OK) return nullptr;
    ifaces_.push_back(iface);
    uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    return iface;
  }

  std::vector<std::uint8_t> address(uct_iface_h iface) {
    uct_iface_attr_t attr{};
    EXPECT_EQ(UCS_OK, uct_iface_query(iface, &attr));
    std::vector<std::uint8_t> a(attr.iface_addr_len);
    EXPECT_EQ(UCS_OK, uct_iface_get_address(iface, reinterpret_cast<uct_iface_addr_t*>(a.data())));
    return a;
  }

  uct_ep_h connect(uct_iface_h from, uct_iface_h to, ucs_status_t* st) {
    const std::vector<std::uint8_t> addr = address(to);
    uct_ep_params_t params{};
    params.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_IFACE_ADDR;
    params.iface = from;
    params.iface_addr = reinterpret_cast<const uct_iface_addr_t*>(addr.data());
    uct_ep_h ep = nullptr;
    *st = uct_ep_create(&params, &ep);
    return *st == UCS_OK ? ep : nullptr;
  }

  std::uint64_t deviceAlloc(std::size_t len) {
    const std::uint64_t p = dev_.alloc(len);
    EXPECT_NE(0u, p) << "cuMemAlloc of " << len << " bytes";
    if (p != 0) allocs_.push_back(p);
    return p;
  }

  // Progresses the worker until `done` holds; false if it never does.
  template <typename Pred>
  bool progressUntil(Pred done) {
    for (long i = 0; i < kMaxSpins; ++i) {
      if (done()) return true;
      uct_worker_progress(worker_);
    }
    return done();
  }

  // Runs one zcopy, waits for its completion, checks the status.
  void zcopy(bool put, void* local, std::size_t len, std::uint64_t remote) {
    uct_iov_t iov{local, len, nullptr, len, 1};
    Completion comp;
    const ucs_status_t st = put ? uct_ep_put_zcopy(ep_, &iov, 1, remote, 0, &comp)
                                : uct_ep_get_zcopy(ep_, &iov, 1, remote, 0, &comp);
    if (len == 0) {
      EXPECT_EQ(UCS_OK, st);
      return;
    }
    ASSERT_EQ(UCS_INPROGRESS, st) << (put ? "put" : "get") << "_zcopy of " << len << " bytes";
    EXPECT_EQ(0, comp.calls);  // completions come from progress only
    ASSERT_TRUE(progressUntil([&] { return comp.calls > 0; }));
    EXPECT_EQ(1, comp.calls);
    EXPECT_EQ(UCS_OK, comp.status);
  }

  FakeDevice dev_;
  uct_component_h component_ = nullptr;
  uct_md_h md_ = nullptr;
  ucs_async_context_t* async_ = nullptr;
  uct_worker_h worker_ = nullptr;
  std::vector<uct_iface_h> ifaces_;
  uct_iface_h iface_ = nullptr;
  uct_ep_h ep_ = nullptr;
  std::vector<std::uint64_t> allocs_;
};

// Sizes from empty to 8 MiB, most of them odd.
const std::vector<std::size_t> kSizes = {0,       1, 7, 63, 4097, 65537, kMiB + 3, 8 * kMiB - 5,
                                         8 * kMiB};

TEST_F(CopyUct, MdAttributes) {
  uct_md_attr_t attr{};
  ASSERT_EQ(UCS_OK, uct_md_query(md_, &attr));
  const std::uint64_t cuda = UCS_BIT(UCS_MEMORY_TYPE_CUDA) | UCS_BIT(UCS_MEMORY_TYPE_CUDA_MANAGED);
  EXPECT_EQ(static_cast<std::uint64_t>(UCT_MD_FLAG_REG), attr.cap.flags);
  EXPECT_EQ(UCS_BIT(UCS_MEMORY_TYPE_HOST) | cuda, attr.cap.reg_mem_types);
  // Host too from UCX 1.19 on, whose memory-type endpoint needs it (as its cuda_copy says).
  const std::uint64_t host_access = UCT_VERNO_MINOR >= 19 ? UCS_BIT(UCS_MEMORY_TYPE_HOST) : 0;
  EXPECT_EQ(cuda | host_access, attr.cap.access_mem_types);
  EXPECT_EQ(cuda, attr.cap.detect_mem_types);
  EXPECT_EQ(0u, attr.cap.alloc_mem_types);
  EXPECT_EQ(0u, attr.rkey_packed_size);
  EXPECT_STREQ("gmd_copy", attr.component_name);

  uct_tl_resource_desc_t* res = nullptr;
  unsigned n = 0;
  ASSERT_EQ(UCS_OK, uct_md_query_tl_resources(md_, &res, &n));
  ASSERT_EQ(1u, n);
  EXPECT_STREQ("gmd_copy", res[0].tl_name);
  EXPECT_STREQ("cuda", res[0].dev_name);
  EXPECT_EQ(UCT_DEVICE_TYPE_ACC, res[0].dev_type);
  uct_release_tl_resource_list(res);

  // Registration is a formality: a handle for host and device memory, nothing to pack.
  const std::uint64_t d = deviceAlloc(4096);
  std::vector<std::uint8_t> host(100);
  for (void* p : {static_cast<void*>(host.data()), reinterpret_cast<void*>(d)}) {
    uct_mem_h memh = nullptr;
    ASSERT_EQ(UCS_OK, uct_md_mem_reg(md_, p, 100, UCT_MD_MEM_ACCESS_ALL, &memh));
    EXPECT_NE(nullptr, memh);
    std::uint8_t rkey_buffer[8] = {};
    EXPECT_EQ(UCS_OK, uct_md_mkey_pack(md_, memh, rkey_buffer));
    EXPECT_EQ(UCS_OK, uct_md_mem_dereg(md_, memh));
  }
  uct_rkey_bundle_t bundle{};
  ASSERT_EQ(UCS_OK, uct_rkey_unpack(component_, "", &bundle));
  EXPECT_EQ(UCS_OK, uct_rkey_release(component_, &bundle));
}

TEST_F(CopyUct, MemQueryAndDetect) {
  const std::size_t len = 3 * 65536 + 17;
  const std::uint64_t d = deviceAlloc(len);
  uct_md_mem_attr_t attr{};
  attr.field_mask = UCT_MD_MEM_ATTR_FIELD_MEM_TYPE | UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS |
                    UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH | UCT_MD_MEM_ATTR_FIELD_SYS_DEV;
  ASSERT_EQ(UCS_OK, uct_md_mem_query(md_, reinterpret_cast<void*>(d + 101), 10, &attr));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, attr.mem_type);
  EXPECT_EQ(reinterpret_cast<void*>(d), attr.base_address);
  EXPECT_GE(attr.alloc_length, len);

  std::vector<std::uint8_t> host(64);
  ASSERT_EQ(UCS_OK, uct_md_mem_query(md_, host.data(), host.size(), &attr));
  EXPECT_EQ(UCS_MEMORY_TYPE_HOST, attr.mem_type);
  EXPECT_EQ(host.data(), attr.base_address);
  EXPECT_EQ(host.size(), attr.alloc_length);
  EXPECT_EQ(UCS_SYS_DEVICE_ID_UNKNOWN, attr.sys_dev);

  ucs_memory_type_t type = UCS_MEMORY_TYPE_UNKNOWN;
  ASSERT_EQ(UCS_OK, uct_md_detect_memory_type(md_, reinterpret_cast<void*>(d), len, &type));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, type);
  ASSERT_EQ(UCS_OK, uct_md_detect_memory_type(md_, host.data(), host.size(), &type));
  EXPECT_EQ(UCS_MEMORY_TYPE_HOST, type);
}

TEST_F(CopyUct, IfaceAttributes) {
  uct_iface_attr_t attr{};
  ASSERT_EQ(UCS_OK, uct_iface_query(iface_, &attr));
  const std::uint64_t want = UCT_IFACE_FLAG_CONNECT_TO_IFACE | UCT_IFACE_FLAG_GET_SHORT |
                             UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_GET_ZCOPY |
                             UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_PENDING;
  EXPECT_EQ(want, attr.cap.flags);
  EXPECT_EQ(0u, attr.cap.event_flags);
  EXPECT_EQ(UINT32_MAX, attr.cap.put.max_short);
  EXPECT_EQ(UINT32_MAX, attr.cap.get.max_short);
  EXPECT_EQ(SIZE_MAX, attr.cap.put.max_zcopy);
  EXPECT_EQ(SIZE_MAX, attr.cap.get.max_zcopy);
  EXPECT_EQ(1u, attr.cap.put.max_iov);
  EXPECT_EQ(1u, attr.cap.get.max_iov);
  EXPECT_EQ(0u, attr.device_addr_len);
  EXPECT_EQ(8u, attr.iface_addr_len);
  EXPECT_DOUBLE_EQ(8e-6, attr.latency.c);
  EXPECT_GT(attr.bandwidth.shared, 0.0);
}

TEST_F(CopyUct, ReachesOnlyItself) {
  ucs_status_t st;
  uct_iface_h other = openIface(nullptr, &st);
  ASSERT_NE(nullptr, other) << ucs_status_string(st);
  const std::vector<std::uint8_t> own = address(iface_), theirs = address(other);
  EXPECT_NE(own, theirs);
  auto* own_addr = reinterpret_cast<const uct_iface_addr_t*>(own.data());
  auto* their_addr = reinterpret_cast<const uct_iface_addr_t*>(theirs.data());
  EXPECT_EQ(1, uct_iface_is_reachable(iface_, nullptr, own_addr));
  EXPECT_EQ(0, uct_iface_is_reachable(iface_, nullptr, their_addr));
  EXPECT_EQ(nullptr, connect(iface_, other, &st));
  EXPECT_EQ(UCS_ERR_UNREACHABLE, st);

  uct_ep_params_t params{};
  params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
  params.iface = iface_;
  uct_ep_h ep = nullptr;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_create(&params, &ep));
  EXPECT_EQ(nullptr, ep);
}

TEST_F(CopyUct, ShortBothWays) {
  for (std::size_t len : kSizes) {
    if (len > 2 * kMiB) continue;  // short copies are synchronous: keep them moderate
    SCOPED_TRACE(len);
    const std::size_t off = 3;
    const std::uint64_t d = deviceAlloc(len + 8);
    const std::vector<std::uint8_t> src = pattern(len, static_cast<unsigned>(len));
    ASSERT_EQ(UCS_OK, uct_ep_put_short(ep_, src.data(), static_cast<unsigned>(len), d + off, 0));
    EXPECT_EQ(src, dev_.read(d + off, len)) << "host -> device";

    std::vector<std::uint8_t> back(len + 2, 0xee);
    ASSERT_EQ(UCS_OK,
              uct_ep_get_short(ep_, back.data() + 1, static_cast<unsigned>(len), d + off, 0));
    EXPECT_TRUE(std::equal(src.begin(), src.end(), back.begin() + 1)) << "device -> host";
    EXPECT_EQ(0xee, back.front());
    EXPECT_EQ(0xee, back.back());
  }
}

TEST_F(CopyUct, ZcopyBothWaysAndDeviceToDevice) {
  for (std::size_t len : kSizes) {
    SCOPED_TRACE(len);
    const std::size_t off = 5;
    const std::uint64_t d1 = deviceAlloc(len + 16), d2 = deviceAlloc(len + 16);
    std::vector<std::uint8_t> src = pattern(len, static_cast<unsigned>(len) + 1);
    zcopy(true, src.data(), len, d1 + off);  // host -> device
    EXPECT_EQ(src, dev_.read(d1 + off, len));

    std::vector<std::uint8_t> back(len, 0);
    zcopy(false, back.data(), len, d1 + off);  // device -> host
    EXPECT_EQ(src, back);

    // device -> device, both ways round
    zcopy(true, reinterpret_cast<void*>(d1 + off), len, d2 + off + 2);
    EXPECT_EQ(src, dev_.read(d2 + off + 2, len));
    const std::vector<std::uint8_t> other = pattern(len, 99);
    if (len > 0) {
      ASSERT_EQ(0, dev_.toDevice(d2, other.data(), len));
    }
    zcopy(false, reinterpret_cast<void*>(d1), len, d2);
    EXPECT_EQ(other, dev_.read(d1, len));
  }
}

TEST_F(CopyUct, ManyCopiesOneCompletion) {
  const std::size_t len = 65537, n = 16;
  const std::uint64_t d = deviceAlloc(len * n);
  std::vector<std::uint8_t> src = pattern(len * n, 7);
  Completion comp(static_cast<int>(n));
  for (std::size_t i = 0; i < n; ++i) {
    uct_iov_t iov{src.data() + i * len, len, nullptr, len, 1};
    ASSERT_EQ(UCS_INPROGRESS, uct_ep_put_zcopy(ep_, &iov, 1, d + i * len, 0, &comp));
  }
  ASSERT_TRUE(progressUntil([&] { return comp.calls > 0; }));
  EXPECT_EQ(1, comp.calls);
  EXPECT_EQ(0, comp.count);
  EXPECT_EQ(src, dev_.read(d, len * n));
}

TEST_F(CopyUct, FlushWaitsForCopies) {
  EXPECT_EQ(UCS_OK, uct_ep_flush(ep_, 0, nullptr));
  EXPECT_EQ(UCS_OK, uct_iface_flush(iface_, 0, nullptr));
  const std::size_t len = kMiB + 1;
  const std::uint64_t d = deviceAlloc(len);
  std::vector<std::uint8_t> src = pattern(len, 3);
  uct_iov_t iov{src.data(), len, nullptr, len, 1};
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_put_zcopy(ep_, &iov, 1, d, 0, nullptr));  // no completion asked
  Completion ep_flush, iface_flush;
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_flush(ep_, 0, &ep_flush));
  ASSERT_EQ(UCS_INPROGRESS, uct_iface_flush(iface_, 0, &iface_flush));
  EXPECT_EQ(UCS_INPROGRESS, uct_ep_flush(ep_, 0, nullptr));
  ASSERT_TRUE(progressUntil([&] { return ep_flush.calls > 0 && iface_flush.calls > 0; }));
  EXPECT_EQ(1, ep_flush.calls);
  EXPECT_EQ(1, iface_flush.calls);
  EXPECT_EQ(UCS_OK, uct_ep_flush(ep_, 0, nullptr));
  EXPECT_EQ(UCS_OK, uct_iface_fence(iface_, 0));
  EXPECT_EQ(UCS_OK, uct_ep_fence(ep_, 0));
  EXPECT_EQ(src, dev_.read(d, len));
}

TEST_F(CopyUct, PendingWhenQueueIsFull) {
  ucs_status_t st;
  uct_iface_h small = openIface("2", &st);
  ASSERT_NE(nullptr, small) << ucs_status_string(st);
  uct_ep_h ep = connect(small, small, &st);
  ASSERT_NE(nullptr, ep) << ucs_status_string(st);

  const std::size_t len = 4099;
  const std::uint64_t d = deviceAlloc(len * 4);
  std::vector<std::uint8_t> src = pattern(len * 4, 11);
  auto post = [&](int i, uct_completion_t* c) {
    uct_iov_t iov{src.data() + i * len, len, nullptr, len, 1};
    return uct_ep_put_zcopy(ep, &iov, 1, d + i * len, 0, c);
  };
  PendingReq early;
  early.func = runPending;
  EXPECT_EQ(UCS_ERR_BUSY, uct_ep_pending_add(ep, &early, 0));  // room: go now

  Completion comp(4);
  ASSERT_EQ(UCS_INPROGRESS, post(0, &comp));
  ASSERT_EQ(UCS_INPROGRESS, post(1, &comp));
  ASSERT_EQ(UCS_ERR_NO_RESOURCE, post(2, &comp));
  PendingReq r2, r3;
  r2.func = r3.func = runPending;
  r2.action = [&] { return post(2, &comp) == UCS_INPROGRESS ? UCS_OK : UCS_ERR_NO_RESOURCE; };
  r3.action = [&] { return post(3, &comp) == UCS_INPROGRESS ? UCS_OK : UCS_ERR_NO_RESOURCE; };
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep, &r2, 0));
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep, &r3, 0));
  EXPECT_EQ(UCS_ERR_NO_RESOURCE, uct_ep_flush(ep, 0, nullptr));  // behind the pending requests
  ASSERT_TRUE(progressUntil([&] { return comp.calls > 0; }));
  EXPECT_EQ(1, r2.calls);
  EXPECT_EQ(1, r3.calls);
  EXPECT_EQ(UCS_OK, comp.status);
  EXPECT_EQ(src, dev_.read(d, len * 4));
  EXPECT_EQ(UCS_OK, uct_ep_flush(ep, 0, nullptr));

  // Purged requests are handed back and never called.
  Completion more(2);
  ASSERT_EQ(UCS_INPROGRESS, post(0, &more));
  ASSERT_EQ(UCS_INPROGRESS, post(1, &more));
  PendingReq p1, p2;
  p1.func = p2.func = runPending;
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep, &p1, 0));
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep, &p2, 0));
  int purged = 0;
  uct_ep_pending_purge(
      ep, [](uct_pending_req_t*, void* arg) { ++*static_cast<int*>(arg); }, &purged);
  EXPECT_EQ(2, purged);
  ASSERT_TRUE(progressUntil([&] { return more.calls > 0; }));
  EXPECT_EQ(0, p1.calls);
  EXPECT_EQ(0, p2.calls);
  uct_ep_destroy(ep);
}

TEST_F(CopyUct, RefusesBadInput) {
  const std::uint64_t d = deviceAlloc(4096);
  std::vector<std::uint8_t> host(4096);
  uct_iov_t two[2] = {{host.data(), 8, nullptr, 8, 1}, {host.data() + 8, 8, nullptr, 8, 1}};
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_put_zcopy(ep_, two, 2, d, 0, nullptr));
  uct_iov_t strided{host.data(), 8, nullptr, 16, 4};
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_get_zcopy(ep_, &strided, 1, d, 0, nullptr));
  uct_iov_t no_buffer{nullptr, 8, nullptr, 8, 1};
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_put_zcopy(ep_, &no_buffer, 1, d, 0, nullptr));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_put_short(ep_, nullptr, 5, d, 0));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_get_short(ep_, host.data(), 5, 0, 0));
  EXPECT_EQ(UCS_OK, uct_ep_put_zcopy(ep_, two, 0, d, 0, nullptr));  // nothing to copy
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, uct_ep_am_short(ep_, 0, 0, host.data(), 8));
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, uct_ep_atomic64_post(ep_, UCT_ATOMIC_OP_ADD, 1, d, 0));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_pending_add(ep_, nullptr, 0));

  ucs_status_t st;
  EXPECT_EQ(nullptr, openIface(nullptr, &st, "nope"));
  EXPECT_EQ(UCS_ERR_NO_DEVICE, st);
  EXPECT_EQ(nullptr, openIface("0", &st));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, st);
  uct_md_h md = nullptr;
  uct_md_config_t* config = nullptr;
  ASSERT_EQ(UCS_OK, uct_md_config_read(component_, nullptr, nullptr, &config));
  EXPECT_EQ(UCS_ERR_NO_DEVICE, uct_md_open(component_, "gmd_gpu9", config, &md));
  uct_config_release(config);
  EXPECT_EQ(nullptr, md);
}

// A driver failure is UCS_ERR_IO_ERROR (and an error line); the iface works again afterwards.
TEST_F(CopyUct, DriverErrorsAreIoErrors) {
  const std::size_t len = 4097;
  const std::uint64_t d = deviceAlloc(len);
  std::vector<std::uint8_t> src = pattern(len, 9);
  uct_iov_t iov{src.data(), len, nullptr, len, 1};
  Completion comp;
  dev_.set("copy_error", 700);  // CUDA_ERROR_ILLEGAL_ADDRESS
  EXPECT_EQ(UCS_ERR_IO_ERROR, uct_ep_put_short(ep_, src.data(), 64, d, 0));
  EXPECT_EQ(UCS_ERR_IO_ERROR, uct_ep_get_short(ep_, src.data(), 64, d, 0));
  EXPECT_EQ(UCS_ERR_IO_ERROR, uct_ep_put_zcopy(ep_, &iov, 1, d, 0, &comp));
  dev_.set("copy_error", 0);
  for (int i = 0; i < 1000; ++i) uct_worker_progress(worker_);
  EXPECT_EQ(0, comp.calls);  // refused at once: never completed
  EXPECT_EQ(UCS_OK, uct_iface_flush(iface_, 0, nullptr));
  zcopy(true, src.data(), len, d);
  EXPECT_EQ(src, dev_.read(d, len));
}

// Copies that take a while: the completion, the flush and the pending queue wait for the driver.
TEST_F(CopyUct, SlowCopies) {
  ucs_status_t st;
  uct_iface_h small = openIface("1", &st);
  ASSERT_NE(nullptr, small) << ucs_status_string(st);
  uct_ep_h ep = connect(small, small, &st);
  ASSERT_NE(nullptr, ep) << ucs_status_string(st);
  const std::size_t len = 65539;
  const std::uint64_t d = deviceAlloc(2 * len);
  std::vector<std::uint8_t> src = pattern(2 * len, 13);
  dev_.set("copy_delay_us", 20000);
  Completion comp(2), flushed;
  uct_iov_t first{src.data(), len, nullptr, len, 1}, second{src.data() + len, len, nullptr, len, 1};
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_put_zcopy(ep, &first, 1, d, 0, &comp));
  ASSERT_EQ(UCS_ERR_NO_RESOURCE, uct_ep_put_zcopy(ep, &second, 1, d + len, 0, &comp));
  PendingReq req;
  req.func = runPending;
  req.action = [&] {
    return uct_ep_put_zcopy(ep, &second, 1, d + len, 0, &comp) == UCS_INPROGRESS
               ? UCS_OK
               : UCS_ERR_NO_RESOURCE;
  };
  ASSERT_EQ(UCS_OK, uct_ep_pending_add(ep, &req, 0));
  ASSERT_EQ(UCS_INPROGRESS, uct_iface_flush(small, 0, &flushed));
  ASSERT_TRUE(progressUntil([&] { return flushed.calls > 0; }));
  dev_.set("copy_delay_us", 0);
  EXPECT_EQ(1, req.calls);
  EXPECT_EQ(1, comp.calls);  // both copies were done before the flush completed
  EXPECT_EQ(src, dev_.read(d, 2 * len));
  uct_ep_destroy(ep);
}

TEST_F(CopyUct, CloseWithCopiesQueued) {
  ucs_status_t st;
  uct_iface_h iface = openIface(nullptr, &st);
  ASSERT_NE(nullptr, iface);
  uct_ep_h ep = connect(iface, iface, &st);
  ASSERT_NE(nullptr, ep);
  const std::size_t len = 2 * kMiB + 1;
  const std::uint64_t d = deviceAlloc(len);
  std::vector<std::uint8_t> src = pattern(len, 5);
  Completion comp;
  uct_iov_t iov{src.data(), len, nullptr, len, 1};
  ASSERT_EQ(UCS_INPROGRESS, uct_ep_put_zcopy(ep, &iov, 1, d, 0, &comp));
  uct_ep_destroy(ep);
  uct_iface_close(iface);  // waits for the copy; its owner is gone: no completion
  std::erase(ifaces_, iface);
  EXPECT_EQ(0, comp.calls);
  EXPECT_EQ(src, dev_.read(d, len));
}

}  // namespace
}  // namespace gmd::test
