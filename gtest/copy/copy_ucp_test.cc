// UCP moving CUDA memory through gmd_copy, on a UCX without CUDA support (and on a pip release's UCX
// with its own CUDA modules loaded beside gmd, packaging/test-pip.sh): one context, two workers
// of one process connected over tcp (or whatever UCP picks with UCX_TLS unset), the fake CUDA
// driver with device memory PROT_NONE (GMD_FAKE_CUDA_CPU_ACCESS=0: any CPU touch of it by UCP or
// gmd crashes). Run twice: with UCX's memory-type cache on (the default: gmd raises libucm's
// CUDA allocation events, so the cache knows device memory and UCP learns it there, and the small
// message inline path stays off for device buffers) and off (UCX_MEMTYPE_CACHE=n: UCP asks the MDs
// what a buffer is).
//
// The same binary runs over gmd_rc in the soft-RoCE VM (GMD_COPY_UCP_NET, set by the rxe ctest
// entries): "copy" (device memory PROT_NONE, no GPUDirect: every device byte through gmd_copy) and
// "peermem" (the fake's device memory CPU-accessible, NVIDIA peer memory claimed in this command's
// own mount namespace: large messages go zero-copy from device memory through gmd's GPUDirect
// registrations, few device bytes through the driver's copies).
//
// Tagged messages host -> device, device -> host and device -> device from 0 B to 8 MiB at odd
// sizes and offsets (every protocol: eager short/bcopy/zcopy, rendezvous, pipelines), expected and
// unexpected; RMA put/get on device memory; the AM API. v1 and v2 protocols where the release has
// both (UCX_PROTO_ENABLE; UCX 1.13's v2 is experimental, v1 only there). Bytes are checked through
// the driver's own copies, never by reading device memory with the CPU.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>
// memtype_cache.h's inline ucs_memtype_cache_is_empty() needs the page table's definition.
extern "C" {
#include <ucs/datastruct/pgtable.h>
}
#include <ucs/memory/memtype_cache.h>

#include <link.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <ostream>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/copy/device_memory.h"
#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr long kMaxSpins = 200'000'000;  // progress calls per operation before giving up

// GMD_COPY_UCP_NET: unset on the host (tcp, UCP's default); "copy" or "peermem" over gmd_rc.
enum class Net { kHost, kCopy, kPeerMem };
Net net() {
  const char* v = std::getenv("GMD_COPY_UCP_NET");
  if (v == nullptr || v[0] == '\0') return Net::kHost;
  return std::string(v) == "peermem" ? Net::kPeerMem : Net::kCopy;
}

// Claims NVIDIA peer memory for this command's mount namespace (the VM gives each command its own).
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

enum class Mem { kHost, kDevice };
const char* name(Mem m) { return m == Mem::kHost ? "host" : "device"; }

struct Params {
  bool v2;          // UCX_PROTO_ENABLE=y
  const char* tls;  // UCX_TLS, nullptr: UCP's default
};

void PrintTo(const Params& p, std::ostream* os) {
  *os << (p.v2 ? "v2" : "v1") << " protocols, UCX_TLS=" << (p.tls ? p.tls : "(default)");
}

std::string paramName(const ::testing::TestParamInfo<Params>& info) {
  const char* tls = info.param.tls == nullptr                              ? "_default_tls"
                    : std::string(info.param.tls).find("gmd_rc") != std::string::npos ? "_gmd_rc"
                                                                                         : "_tcp";
  return std::string(info.param.v2 ? "v2" : "v1") + tls;
}

// UCX_MEMTYPE_CACHE as UCX reads it: anything but n/no/off/0 leaves the cache on (default "try").
bool memtypeCacheOn() {
  const char* v = std::getenv("UCX_MEMTYPE_CACHE");
  if (v == nullptr) return true;
  const std::string s(v);
  return !(s == "n" || s == "no" || s == "off" || s == "0" || s == "N");
}

// Who raises the CUDA allocation events the cache is fed from. gmd (a UCX without CUDA support)
// gives each allocation the driver's type. UCX's own libucm_cuda (a UCX built with CUDA, loaded
// here) gives it the type unknown (UCS_MEMORY_TYPE_LAST, src/ucm/cuda/cudamem.c in every release
// from 1.14 on), and UCP then asks the MDs what the buffer is.
int findUcmCuda(dl_phdr_info* info, std::size_t, void* found) {
  const char* name = info->dlpi_name == nullptr ? "" : info->dlpi_name;
  const char* base = std::strrchr(name, '/');
  base = base == nullptr ? name : base + 1;
  if (std::strncmp(base, "libucm_cuda.so", 14) != 0) return 0;
  *static_cast<bool*>(found) = true;
  return 1;
}
ucs_memory_type_t cachedDeviceType() {
  bool ucx_raises = false;
  dl_iterate_phdr(findUcmCuda, &ucx_raises);
  return ucx_raises ? UCS_MEMORY_TYPE_UNKNOWN : UCS_MEMORY_TYPE_CUDA;
}

unsigned ucxMinor() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return minor;
}

// A buffer of either kind: host bytes, or a device allocation of the fake driver.
struct Buffer {
  Mem mem;
  std::size_t len;
  std::vector<std::uint8_t> host;
  std::uint64_t dev = 0;
  void* ptr() {
    return mem == Mem::kHost ? static_cast<void*>(host.data()) : reinterpret_cast<void*>(dev);
  }
};

class CopyUcp : public ::testing::TestWithParam<Params> {
 protected:
  void SetUp() override {
    const std::string why = dev_.load();
    ASSERT_TRUE(why.empty()) << why;
    if (GetParam().v2 && ucxMinor() < 18) {
      GTEST_SKIP() << "UCX 1." << ucxMinor() << " has v1 protocols only (its v2 is experimental)";
    }

    if (net() != Net::kHost) {
      GMD_REQUIRE_RDMA_DEVICES(1);
      ASSERT_EQ(0, setenv("UCX_GMD_DMABUF", "off", 1));
      ASSERT_EQ(net() == Net::kPeerMem ? 1 : 0, dev_.counter("cpu_access"))
          << "GMD_FAKE_CUDA_CPU_ACCESS does not match GMD_COPY_UCP_NET";
    }
    if (net() == Net::kPeerMem) {
      std::string no_peer;
      ASSERT_TRUE(fakePeerMemory(&no_peer)) << no_peer;
    }
    ucp_config_t* config = nullptr;
    ASSERT_EQ(UCS_OK, ucp_config_read(nullptr, nullptr, &config));
    if (GetParam().tls != nullptr) {
      ASSERT_EQ(UCS_OK, ucp_config_modify(config, "TLS", GetParam().tls));
    }
    if (ucxMinor() >= 18) {
      ASSERT_EQ(UCS_OK, ucp_config_modify(config, "PROTO_ENABLE", GetParam().v2 ? "y" : "n"));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM;
    const ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    ASSERT_EQ(UCS_OK, st);
    for (ucp_worker_h* w : {&a_, &b_}) {
      ucp_worker_params_t wp{};
      wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      wp.thread_mode = UCS_THREAD_MODE_SINGLE;
      ASSERT_EQ(UCS_OK, ucp_worker_create(context_, &wp, w));
    }
    ab_ = connect(a_, b_);
    ba_ = connect(b_, a_);
    ASSERT_NE(nullptr, ab_);
    ASSERT_NE(nullptr, ba_);
  }

  void TearDown() override {
    for (ucp_ep_h* ep : {&ab_, &ba_}) {
      if (*ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      wait(ucp_ep_close_nbx(*ep, &p));
    }
    for (ucp_worker_h w : {a_, b_}) {
      if (w != nullptr) ucp_worker_destroy(w);
    }
    if (context_ != nullptr) ucp_cleanup(context_);
    for (std::uint64_t p : allocs_) dev_.free(p);
  }

  ucp_ep_h connect(ucp_worker_h from, ucp_worker_h to) {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    if (ucp_worker_get_address(to, &addr, &len) != UCS_OK) return nullptr;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    p.address = addr;
    ucp_ep_h ep = nullptr;
    const ucs_status_t st = ucp_ep_create(from, &p, &ep);
    ucp_worker_release_address(to, addr);
    return st == UCS_OK ? ep : nullptr;
  }

  void progress() {
    ucp_worker_progress(a_);
    ucp_worker_progress(b_);
  }

  // Waits for a request (nullptr: completed at once); its status.
  ucs_status_t wait(ucs_status_ptr_t req) {
    if (req == nullptr) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    ucs_status_t st = UCS_INPROGRESS;
    for (long i = 0; i < kMaxSpins && (st = ucp_request_check_status(req)) == UCS_INPROGRESS; ++i) {
      progress();
    }
    if (st != UCS_INPROGRESS) ucp_request_free(req);
    return st;
  }

  // len bytes of `mem` plus slack, holding `content` at offset `off` (device: written by the
  // driver).
  Buffer make(Mem mem, std::size_t len, std::size_t off, const std::vector<std::uint8_t>* content) {
    Buffer b{mem, len + off + 8, {}, 0};
    if (mem == Mem::kHost) {
      b.host.assign(b.len, 0x5a);
      if (content != nullptr) std::copy(content->begin(), content->end(), b.host.begin() + off);
    } else {
      b.dev = dev_.alloc(b.len);
      EXPECT_NE(0u, b.dev);
      if (b.dev != 0) allocs_.push_back(b.dev);
      if (b.dev != 0) expectCacheKnows(b.dev, b.len);
      if (content != nullptr && !content->empty()) {
        EXPECT_EQ(0, dev_.toDevice(b.dev + off, content->data(), content->size()));
      }
    }
    return b;
  }

  // With the cache on, UCP looks a buffer up there first and asks no MD when the answer is "not
  // found": the cache must know every device buffer (as cachedDeviceType() says), and it must not
  // be empty (an empty cache lets UCP take the inline path without looking).
  void expectCacheKnows(std::uint64_t dev, std::size_t len) {
    if (!memtypeCacheOn()) {
      EXPECT_EQ(nullptr, ucs_memtype_cache_global_instance) << "UCX_MEMTYPE_CACHE=n, a cache exists";
      return;
    }
    ASSERT_NE(nullptr, ucs_memtype_cache_global_instance) << "the cache is on, but there is none";
    EXPECT_FALSE(ucs_memtype_cache_is_empty()) << "a device buffer is allocated, the cache is empty";
    for (std::size_t at : {std::size_t{0}, len / 2, len - 1}) {
      ucs_memory_info_t info{};
      const ucs_status_t st = ucs_memtype_cache_lookup(reinterpret_cast<void*>(dev + at), 1, &info);
      EXPECT_EQ(UCS_OK, st) << "device byte " << at << " of " << len << ": not in the cache";
      if (st == UCS_OK) {
        EXPECT_EQ(cachedDeviceType(), info.type) << "device byte " << at << " of " << len;
      }
    }
  }

  // Bytes the fake driver copied so far, per direction.
  struct Copied {
    std::size_t htod = 0, dtoh = 0, dtod = 0;
    Copied operator-(const Copied& o) const {
      return {htod - o.htod, dtoh - o.dtoh, dtod - o.dtod};
    }
  };
  Copied copied() {
    return {static_cast<std::size_t>(dev_.counter("bytes_htod")),
            static_cast<std::size_t>(dev_.counter("bytes_dtoh")),
            static_cast<std::size_t>(dev_.counter("bytes_dtod"))};
  }

  std::vector<std::uint8_t> contents(Buffer& b, std::size_t off, std::size_t len) {
    if (b.mem == Mem::kHost) {
      return {b.host.begin() + off, b.host.begin() + off + len};
    }
    return dev_.read(b.dev + off, len);
  }

  // One tagged message from `from` memory to `to` memory; the receive is posted first when
  // `expected`, after the send otherwise.
  void tagOne(Mem from, Mem to, std::size_t len, bool expected) {
    SCOPED_TRACE(std::string(name(from)) + " -> " + name(to) + ", " + std::to_string(len) +
                 " bytes, " + (expected ? "expected" : "unexpected"));
    const std::size_t soff = 1 + len % 7, roff = 3 + len % 5;
    const std::vector<std::uint8_t> data = pattern(len, static_cast<unsigned>(len * 3 + expected));
    Buffer src = make(from, len, soff, &data), dst = make(to, len, roff, nullptr);
    const Copied before = copied();
    const ucp_tag_t tag = 0x1000 + len;
    ucp_request_param_t p{};
    ucs_status_ptr_t rreq = nullptr, sreq = nullptr;
    auto* sbuf = static_cast<std::uint8_t*>(src.ptr()) + soff;
    auto* rbuf = static_cast<std::uint8_t*>(dst.ptr()) + roff;
    if (expected) rreq = ucp_tag_recv_nbx(b_, rbuf, len, tag, ~ucp_tag_t{0}, &p);
    sreq = ucp_tag_send_nbx(ab_, sbuf, len, tag, &p);
    if (!expected) {
      for (int i = 0; i < 100; ++i) progress();  // let it arrive unexpected
      rreq = ucp_tag_recv_nbx(b_, rbuf, len, tag, ~ucp_tag_t{0}, &p);
    }
    ASSERT_EQ(UCS_OK, wait(sreq));
    ASSERT_EQ(UCS_OK, wait(rreq));
    // Device bytes moved only through the driver's copies (gmd_copy's; the CPU cannot reach them).
    const Copied moved = copied() - before;
    if (net() != Net::kPeerMem) {
      if (len > 0 && from == Mem::kDevice) {
        EXPECT_GE(moved.dtoh + moved.dtod, len);
      }
      if (len > 0 && to == Mem::kDevice) {
        EXPECT_GE(moved.htod + moved.dtod, len);
      }
    } else if (len >= kMiB && (from == Mem::kDevice || to == Mem::kDevice)) {
      // Rendezvous zero-copy: the NIC reads/writes device memory through gmd's GPUDirect
      // registration (which sets SYNC_MEMOPS on the allocation); few bytes through the copies.
      EXPECT_LT(moved.htod + moved.dtoh + moved.dtod, len / 4) << "device bytes went through copies";
      EXPECT_GT(dev_.counter("sync_memops_set"), 0) << "gmd registered no device memory";
    }
    EXPECT_EQ(data, contents(dst, roff, len));
    EXPECT_EQ(data, contents(src, soff, len)) << "the source changed";
  }

  FakeDevice dev_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h a_ = nullptr, b_ = nullptr;
  ucp_ep_h ab_ = nullptr, ba_ = nullptr;
  std::vector<std::uint64_t> allocs_;
};

// 0 B to 8 MiB, odd sizes around each protocol's usual thresholds.
const std::vector<std::size_t> kSizes = {0,    1,     7,      63,       255,          1025,    4095,
                                         8193, 65537, 262147, kMiB + 7, 4 * kMiB + 1, 8 * kMiB};

// The cache as UCP sees it: a device buffer is there (whole, and any byte of it) as CUDA, or as
// unknown where UCX's own CUDA module raised it (cachedDeviceType); a freed one is gone from it, and
// host memory stays "not found" (UCP's host fast path).
TEST_P(CopyUcp, MemtypeCacheKnowsDeviceMemory) {
  if (!memtypeCacheOn()) {
    EXPECT_EQ(nullptr, ucs_memtype_cache_global_instance);
    return;
  }
  const std::size_t len = 3 * kMiB + 11;
  const std::uint64_t dev = dev_.alloc(len);
  ASSERT_NE(0u, dev);
  expectCacheKnows(dev, len);
  ucs_memory_info_t info{};
  ASSERT_EQ(UCS_OK, ucs_memtype_cache_lookup(reinterpret_cast<void*>(dev), len, &info));
  EXPECT_EQ(cachedDeviceType(), info.type);
  std::vector<std::uint8_t> host(4096);
  EXPECT_EQ(UCS_ERR_NO_ELEM, ucs_memtype_cache_lookup(host.data(), host.size(), &info));
  dev_.free(dev);
  const ucs_status_t after = ucs_memtype_cache_lookup(reinterpret_cast<void*>(dev), len, &info);
  EXPECT_TRUE(after == UCS_ERR_NO_ELEM || info.type != UCS_MEMORY_TYPE_CUDA)
      << "freed device memory is still CUDA in the cache";
}

TEST_P(CopyUcp, TagHostToDevice) {
  for (std::size_t len : kSizes) {
    tagOne(Mem::kHost, Mem::kDevice, len, true);
    tagOne(Mem::kHost, Mem::kDevice, len, false);
  }
}

TEST_P(CopyUcp, TagDeviceToHost) {
  for (std::size_t len : kSizes) {
    tagOne(Mem::kDevice, Mem::kHost, len, true);
    tagOne(Mem::kDevice, Mem::kHost, len, false);
  }
}

TEST_P(CopyUcp, TagDeviceToDevice) {
  for (std::size_t len : kSizes) {
    tagOne(Mem::kDevice, Mem::kDevice, len, true);
    tagOne(Mem::kDevice, Mem::kDevice, len, false);
  }
}

// put and get between host memory on worker a and device memory mapped on worker b, and from a
// device buffer on a.
TEST_P(CopyUcp, RmaOnDeviceMemory) {
  if (!GetParam().v2) {
    // rma_sw.c: the v1 put over AM (the only RMA over tcp, or to memory no RMA lane registers)
    // declares its target host memory and the receiver copies into it with the CPU; v2's put/get
    // over AM carry the remote key's memory type and copy through the memory-type lane.
    GTEST_SKIP() << "UCX's v1 software RMA copies device memory with the CPU (v2 protocols only)";
  }
  for (std::size_t len : {std::size_t{1}, std::size_t{63}, std::size_t{8193}, kMiB + 5}) {
    SCOPED_TRACE(len);
    const std::vector<std::uint8_t> data = pattern(len, 17), other = pattern(len, 18);
    Buffer target = make(Mem::kDevice, len, 0, &other);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = target.ptr();
    mp.length = target.len;
    ucp_mem_h memh = nullptr;
    ASSERT_EQ(UCS_OK, ucp_mem_map(context_, &mp, &memh));
    void* packed = nullptr;
    size_t packed_len = 0;
    ASSERT_EQ(UCS_OK, ucp_rkey_pack(context_, memh, &packed, &packed_len));
    ucp_rkey_h rkey = nullptr;
    ASSERT_EQ(UCS_OK, ucp_ep_rkey_unpack(ab_, packed, &rkey));
    ucp_rkey_buffer_release(packed);
    const auto remote = reinterpret_cast<std::uint64_t>(target.ptr());

    ucp_request_param_t p{};
    // host -> remote device
    Buffer src = make(Mem::kHost, len, 0, &data);
    EXPECT_EQ(UCS_OK, wait(ucp_put_nbx(ab_, src.ptr(), len, remote, rkey, &p)));
    EXPECT_EQ(UCS_OK, wait(ucp_ep_flush_nbx(ab_, &p)));
    EXPECT_EQ(data, contents(target, 0, len));
    // remote device -> host
    Buffer back = make(Mem::kHost, len, 0, nullptr);
    EXPECT_EQ(UCS_OK, wait(ucp_get_nbx(ab_, back.ptr(), len, remote, rkey, &p)));
    EXPECT_EQ(UCS_OK, wait(ucp_ep_flush_nbx(ab_, &p)));
    EXPECT_EQ(data, contents(back, 0, len));
    // local device -> remote device, and back into local device memory
    Buffer dsrc = make(Mem::kDevice, len, 0, &other);
    EXPECT_EQ(UCS_OK, wait(ucp_put_nbx(ab_, dsrc.ptr(), len, remote, rkey, &p)));
    EXPECT_EQ(UCS_OK, wait(ucp_ep_flush_nbx(ab_, &p)));
    EXPECT_EQ(other, contents(target, 0, len));
    Buffer dback = make(Mem::kDevice, len, 0, nullptr);
    EXPECT_EQ(UCS_OK, wait(ucp_get_nbx(ab_, dback.ptr(), len, remote, rkey, &p)));
    EXPECT_EQ(UCS_OK, wait(ucp_ep_flush_nbx(ab_, &p)));
    EXPECT_EQ(other, contents(dback, 0, len));

    ucp_rkey_destroy(rkey);
    EXPECT_EQ(UCS_OK, ucp_mem_unmap(context_, memh));
  }
}

// The AM API: device payloads, received eagerly (host data handed to the handler) or by rendezvous
// straight into device memory.
struct AmState {
  ucp_worker_h worker = nullptr;
  std::vector<std::uint8_t> eager;  // eager payload as the handler saw it
  void* rndv_desc = nullptr;
  std::size_t length = 0;
  int calls = 0;
};

ucs_status_t amHandler(void* arg, const void*, size_t, void* data, size_t length,
                       const ucp_am_recv_param_t* param) {
  auto* s = static_cast<AmState*>(arg);
  ++s->calls;
  s->length = length;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    s->rndv_desc = data;  // received below with ucp_am_recv_data_nbx
    return UCS_INPROGRESS;
  }
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  s->eager.assign(bytes, bytes + length);
  return UCS_OK;
}

TEST_P(CopyUcp, ActiveMessagesFromAndToDevice) {
  AmState state;
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = 7;
  hp.cb = amHandler;
  hp.arg = &state;
  ASSERT_EQ(UCS_OK, ucp_worker_set_am_recv_handler(b_, &hp));
  for (std::size_t len :
       {std::size_t{0}, std::size_t{9}, std::size_t{4097}, std::size_t{65539}, 2 * kMiB + 3}) {
    for (bool rndv : {false, true}) {
      SCOPED_TRACE(std::to_string(len) + (rndv ? " bytes, rendezvous" : " bytes"));
      state = AmState{};
      const std::vector<std::uint8_t> data = pattern(len, 23);
      Buffer src = make(Mem::kDevice, len, 1, &data);
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = rndv ? UCP_AM_SEND_FLAG_RNDV : 0;
      const std::uint64_t header = 0x1234;
      ucs_status_ptr_t sreq = ucp_am_send_nbx(ab_, 7, &header, sizeof(header),
                                              static_cast<std::uint8_t*>(src.ptr()) + 1, len, &p);
      for (long i = 0; i < kMaxSpins && state.calls == 0; ++i) progress();
      ASSERT_EQ(1, state.calls);
      EXPECT_EQ(len, state.length);
      if (state.rndv_desc != nullptr) {
        Buffer dst = make(Mem::kDevice, len, 5, nullptr);
        ucp_request_param_t rp{};
        EXPECT_EQ(UCS_OK,
                  wait(ucp_am_recv_data_nbx(b_, state.rndv_desc,
                                            static_cast<std::uint8_t*>(dst.ptr()) + 5, len, &rp)));
        EXPECT_EQ(data, contents(dst, 5, len));
      } else {
        EXPECT_FALSE(rndv && len > 0) << "a rendezvous AM arrived eagerly";
        EXPECT_EQ(data, state.eager);
      }
      ASSERT_EQ(UCS_OK, wait(sreq));
    }
  }
}

// On the host: gmd_copy with tcp, and UCP's default. Over gmd_rc (the VM): gmd_rc with gmd_copy,
// and UCP's default (the rxe entries set UCX_SHM_DEVICES= so that, as between hosts, shm is out).
std::vector<Params> allParams() {
  const char* tls = net() == Net::kHost ? "gmd_copy,self,tcp" : "gmd_rc,gmd_copy,self";
  return {Params{false, tls}, Params{true, tls}, Params{false, nullptr}, Params{true, nullptr}};
}

INSTANTIATE_TEST_SUITE_P(Protocols, CopyUcp, ::testing::ValuesIn(allParams()), paramName);

}  // namespace
}  // namespace gmd::test
