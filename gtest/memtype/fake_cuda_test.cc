// The fake CUDA driver itself (gtest/memtype/fake_cuda/fake_cuda.cc): that it behaves like a
// driver, so that tests through it mean something. Copies in every direction, validation,
// per-stream order, events, contexts, SYNC_MEMOPS, hole-punched frees, and the no-CPU-access mode.
// Every case holds in both modes: ctest runs this binary once as is and once with
// GMD_FAKE_CUDA_CPU_ACCESS=0; the death test forces the mode in its own child.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/memtype/fake_driver.h"

namespace gmd::memtype {
namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kInvalidContext = 201;
constexpr int kInvalidHandle = 400;
constexpr int kNotReady = 600;
constexpr int kAttrContext = 1;
constexpr int kAttrSyncMemops = 6;
constexpr std::size_t kMiB = 1 << 20;

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + i / 251) & 0xff);
  }
  return v;
}

// For the length of a death test: sanitizers (ASan, TSan) leave SIGSEGV alone in the child, which
// must die of it rather than exit with a report. The child is a re-executed binary
// (death_test_style threadsafe): it reads the options from the environment set here.
class SegvReachesTheChild {
 public:
  SegvReachesTheChild() {
    for (std::size_t i = 0; i < 2; ++i) {
      const char* old = std::getenv(kVars[i]);
      had_[i] = old != nullptr;
      saved_[i] = old != nullptr ? old : "";
      const std::string value = saved_[i].empty() ? "handle_segv=0" : saved_[i] + ":handle_segv=0";
      setenv(kVars[i], value.c_str(), 1);
    }
  }
  ~SegvReachesTheChild() {
    for (std::size_t i = 0; i < 2; ++i) {
      if (had_[i]) {
        setenv(kVars[i], saved_[i].c_str(), 1);
      } else {
        unsetenv(kVars[i]);
      }
    }
  }
  SegvReachesTheChild(const SegvReachesTheChild&) = delete;
  SegvReachesTheChild& operator=(const SegvReachesTheChild&) = delete;

 private:
  static constexpr const char* kVars[2] = {"ASAN_OPTIONS", "TSAN_OPTIONS"};
  bool had_[2] = {};
  std::string saved_[2];
};

class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(drv_.load()) << "the fake libcuda.so.1 must be first on LD_LIBRARY_PATH";
    ASSERT_NE(drv_.memcpy, nullptr);
    ASSERT_EQ(drv_.init(0), kSuccess);
    drv_.set("copy_delay_us", 0);
    drv_.set("copy_error", 0);
    drv_.set("hold_streams", 0);
    drv_.set("reset_thread_context", 1);
  }
  void TearDown() override {
    drv_.set("hold_streams", 0);
    drv_.set("copy_delay_us", 0);
    drv_.set("reset_thread_context", 1);
    for (void* s : streams_) EXPECT_EQ(drv_.streamDestroy(s), kSuccess);
    for (void* e : events_) EXPECT_EQ(drv_.eventDestroy(e), kSuccess);
    for (std::uint64_t p : allocs_) EXPECT_EQ(drv_.memFree(p), kSuccess);
  }
  std::uint64_t alloc(std::size_t n) {
    const std::uint64_t p = drv_.alloc(n);
    EXPECT_NE(p, 0u);
    if (p != 0) allocs_.push_back(p);
    return p;
  }
  void release(std::uint64_t p) {
    for (auto it = allocs_.begin(); it != allocs_.end(); ++it) {
      if (*it == p) {
        allocs_.erase(it);
        break;
      }
    }
    ASSERT_EQ(drv_.memFree(p), kSuccess);
  }
  void* stream(unsigned flags = 0) {
    void* s = nullptr;
    EXPECT_EQ(drv_.streamCreate(&s, flags), kSuccess);
    if (s != nullptr) streams_.push_back(s);
    return s;
  }
  void* event() {
    void* e = nullptr;
    EXPECT_EQ(drv_.eventCreate(&e, 2 /* CU_EVENT_DISABLE_TIMING */), kSuccess);
    if (e != nullptr) events_.push_back(e);
    return e;
  }
  // The device bytes, read back through the driver (the only way in either mode).
  std::vector<unsigned char> read(std::uint64_t p, std::size_t n) {
    std::vector<unsigned char> v(n, 0x5a);
    EXPECT_EQ(drv_.memcpyDtoH(v.data(), p, n), kSuccess);
    return v;
  }
  static std::uint64_t host(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

  test::FakeDriver drv_;
  std::vector<std::uint64_t> allocs_;
  std::vector<void*> streams_;
  std::vector<void*> events_;
};

TEST_F(FakeCudaTest, CopiesInEveryDirectionAtOddSizesAndOffsetsMoveTheBytes) {
  const std::size_t sizes[] = {1, 7, 4097, 65539, kMiB + 13};
  const std::size_t offsets[] = {0, 1, 333};
  const std::uint64_t a = alloc(2 * kMiB);
  const std::uint64_t b = alloc(2 * kMiB);
  const std::uint64_t m = [&] {
    std::uint64_t p = 0;
    EXPECT_EQ(drv_.memAllocManaged(&p, 2 * kMiB, 1), kSuccess);
    if (p != 0) allocs_.push_back(p);
    return p;
  }();
  ASSERT_TRUE(a != 0 && b != 0 && m != 0);
  unsigned seed = 1;
  for (std::size_t n : sizes) {
    for (std::size_t off : offsets) {
      SCOPED_TRACE(testing::Message() << "size " << n << " offset " << off);
      const auto src = pattern(n, ++seed);
      const long htod = drv_.get("copies_htod"), bytes_htod = drv_.get("bytes_htod");
      const long dtod = drv_.get("copies_dtod"), dtoh = drv_.get("copies_dtoh");
      const long bytes_dtoh = drv_.get("bytes_dtoh"), htoh = drv_.get("copies_htoh");
      ASSERT_EQ(drv_.memcpyHtoD(a + off, src.data(), n), kSuccess);
      ASSERT_EQ(drv_.memcpyDtoD(b + off + 3, a + off, n), kSuccess);
      std::vector<unsigned char> out(n + 2, 0xee);
      ASSERT_EQ(drv_.memcpyDtoH(out.data() + 1, b + off + 3, n), kSuccess);
      EXPECT_EQ(std::memcmp(out.data() + 1, src.data(), n), 0);
      EXPECT_EQ(out[0], 0xee) << "wrote before the destination";
      EXPECT_EQ(out[n + 1], 0xee) << "wrote past the destination";
      // Unified cuMemcpy: device to managed, managed to host, host to host.
      ASSERT_EQ(drv_.memcpy(m + off, b + off + 3, n), kSuccess);
      std::vector<unsigned char> out2(n, 0), out3(n, 0);
      ASSERT_EQ(drv_.memcpy(host(out2.data()), m + off, n), kSuccess);
      EXPECT_EQ(out2, src);
      ASSERT_EQ(drv_.memcpy(host(out3.data()), host(out2.data()), n), kSuccess);
      EXPECT_EQ(out3, src);
      EXPECT_EQ(drv_.get("copies_htod"), htod + 1);
      EXPECT_EQ(drv_.get("bytes_htod"), bytes_htod + static_cast<long>(n));
      EXPECT_EQ(drv_.get("copies_dtod"), dtod + 2) << "device to managed counts as device";
      EXPECT_EQ(drv_.get("copies_dtoh"), dtoh + 2);
      EXPECT_EQ(drv_.get("bytes_dtoh"), bytes_dtoh + 2 * static_cast<long>(n));
      EXPECT_EQ(drv_.get("copies_htoh"), htoh + 1);
    }
  }
}

TEST_F(FakeCudaTest, MemsetD8WritesTheRangeOnly) {
  const std::uint64_t a = alloc(8192);
  ASSERT_NE(a, 0u);
  const long memsets = drv_.get("memsets");
  ASSERT_EQ(drv_.memsetD8(a, 0x11, 8192), kSuccess);
  ASSERT_EQ(drv_.memsetD8(a + 5, 0xc3, 4000), kSuccess);
  const auto v = read(a, 8192);
  EXPECT_EQ(v[4], 0x11);
  EXPECT_EQ(v[5], 0xc3);
  EXPECT_EQ(v[4004], 0xc3);
  EXPECT_EQ(v[4005], 0x11);
  EXPECT_EQ(drv_.get("memsets"), memsets + 2);
  EXPECT_EQ(drv_.memsetD8(a + 8000, 0, 193), kInvalidValue) << "past the allocation's end";
}

TEST_F(FakeCudaTest, CopiesValidatePointersAndRangesLikeADriver) {
  const std::uint64_t a = alloc(10000);
  ASSERT_NE(a, 0u);
  std::vector<unsigned char> buf(20000, 1);
  // A range running past the end of the allocation (its requested size, not the granule).
  EXPECT_EQ(drv_.memcpyHtoD(a + 9999, buf.data(), 2), kInvalidValue);
  EXPECT_EQ(drv_.memcpyDtoH(buf.data(), a, 10001), kInvalidValue);
  EXPECT_EQ(drv_.memcpyDtoD(a, a + 5000, 5001), kInvalidValue);
  EXPECT_EQ(drv_.memcpyHtoD(a + 9998, buf.data(), 2), kSuccess);
  // A freed allocation, and arena space never allocated, are neither device nor host memory.
  const std::uint64_t freed = drv_.alloc(4096);
  ASSERT_NE(freed, 0u);
  ASSERT_EQ(drv_.memFree(freed), kSuccess);
  EXPECT_EQ(drv_.memcpyHtoD(freed, buf.data(), 16), kInvalidValue);
  EXPECT_EQ(drv_.memcpy(host(buf.data()), freed, 16), kInvalidValue);
  const std::uint64_t arena = static_cast<std::uint64_t>(drv_.get("arena"));
  EXPECT_EQ(drv_.memcpyDtoH(buf.data(), arena + (256 * kMiB), 16), kInvalidValue);
  // Typed entry points: the device side must be device memory.
  EXPECT_EQ(drv_.memcpyDtoH(buf.data(), host(buf.data() + 100), 16), kInvalidValue);
  EXPECT_EQ(drv_.memcpyHtoD(host(buf.data()), buf.data() + 100, 16), kInvalidValue);
  // Host memory that is not mapped, or not readable.
  void* gone = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(munmap(gone, 4096), 0);
  EXPECT_EQ(drv_.memcpyHtoD(a, gone, 16), kInvalidValue);
  EXPECT_EQ(drv_.memcpyDtoH(gone, a, 16), kInvalidValue);
  EXPECT_EQ(drv_.memcpy(host(gone), host(buf.data()), 16), kInvalidValue);
  EXPECT_EQ(drv_.memcpyHtoD(0, buf.data(), 16), kInvalidValue);
  // Zero bytes is a no-op that succeeds.
  EXPECT_EQ(drv_.memcpyHtoD(a, buf.data(), 0), kSuccess);
  // The copy_error control fails every copy without moving a byte.
  const auto before = read(a, 16);
  std::vector<unsigned char> other(16, 0x77);
  drv_.set("copy_error", 999);
  EXPECT_EQ(drv_.memcpyHtoD(a, other.data(), 16), 999);
  drv_.set("copy_error", 0);
  EXPECT_EQ(read(a, 16), before);
}

TEST_F(FakeCudaTest, V1EntryPointsTakeThirtyTwoBitPointers) {
  auto htod = reinterpret_cast<int (*)(unsigned, const void*, unsigned)>(
      dlsym(drv_.handle, "cuMemcpyHtoD"));
  auto dtoh =
      reinterpret_cast<int (*)(void*, unsigned, unsigned)>(dlsym(drv_.handle, "cuMemcpyDtoH"));
  ASSERT_NE(htod, nullptr);
  ASSERT_NE(dtoh, nullptr);
  const std::uint64_t a = alloc(4096);
  ASSERT_NE(a, 0u);
  ASSERT_LT(a, 1ull << 32) << "the arena is below 4 GiB";
  const auto src = pattern(333, 9);
  std::vector<unsigned char> out(333, 0);
  ASSERT_EQ(htod(static_cast<unsigned>(a), src.data(), 333), kSuccess);
  ASSERT_EQ(dtoh(out.data(), static_cast<unsigned>(a), 333), kSuccess);
  EXPECT_EQ(out, src);
}

TEST_F(FakeCudaTest, EveryEntryPointIsReachableByDlsymAndByCuGetProcAddress) {
  // clang-format off
  const char* const exported[] = {
      "cuMemcpy", "cuMemcpyAsync", "cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyDtoH",
      "cuMemcpyDtoH_v2", "cuMemcpyDtoD", "cuMemcpyDtoD_v2", "cuMemcpyHtoDAsync",
      "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync",
      "cuMemcpyDtoDAsync_v2", "cuMemsetD8", "cuMemsetD8_v2", "cuStreamCreate", "cuStreamDestroy",
      "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamQuery", "cuEventCreate",
      "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuEventDestroy", "cuEventDestroy_v2",
      "cuCtxPushCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent", "cuCtxPopCurrent_v2",
      "cuCtxGetDevice", "cuPointerSetAttribute", "cuPointerGetAttribute", "cuPointerGetAttributes",
      "cuMemcpy_ptds", "cuMemcpyAsync_ptsz", "cuStreamQuery_ptsz", "cuEventRecord_ptsz",
      "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz", "cuMemAllocPitch", "cuMemAllocPitch_v2"};
  // clang-format on
  for (const char* name : exported) EXPECT_NE(dlsym(drv_.handle, name), nullptr) << name;

  // Base names resolve to the implementation the real driver gives for the version asked for.
  struct Case {
    const char* base;
    int version;
    std::uint64_t flags;
    const char* expect;
  };
  const Case cases[] = {
      {"cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2"},
      {"cuMemcpyHtoD", 3000, 0, "cuMemcpyHtoD"},
      {"cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"},
      {"cuMemcpyDtoH", 12000, 0, "cuMemcpyDtoH_v2"},
      {"cuMemcpyDtoD", 12000, 0, "cuMemcpyDtoD_v2"},
      {"cuMemcpyHtoDAsync", 12000, 0, "cuMemcpyHtoDAsync_v2"},
      {"cuMemcpyDtoHAsync", 12000, 2, "cuMemcpyDtoHAsync_v2_ptsz"},
      {"cuMemcpyDtoDAsync", 12000, 0, "cuMemcpyDtoDAsync_v2"},
      {"cuMemsetD8", 12000, 0, "cuMemsetD8_v2"},
      {"cuMemcpy", 12000, 0, "cuMemcpy"},
      {"cuMemcpy", 12000, 2, "cuMemcpy_ptds"},
      {"cuMemcpyAsync", 12000, 0, "cuMemcpyAsync"},
      {"cuMemcpyAsync", 12000, 2, "cuMemcpyAsync_ptsz"},
      {"cuStreamCreate", 12000, 0, "cuStreamCreate"},
      {"cuStreamDestroy", 12000, 0, "cuStreamDestroy_v2"},
      {"cuStreamSynchronize", 12000, 0, "cuStreamSynchronize"},
      {"cuStreamQuery", 12000, 0, "cuStreamQuery"},
      {"cuEventCreate", 12000, 0, "cuEventCreate"},
      {"cuEventRecord", 12000, 0, "cuEventRecord"},
      {"cuEventQuery", 12000, 0, "cuEventQuery"},
      {"cuEventSynchronize", 12000, 0, "cuEventSynchronize"},
      {"cuEventDestroy", 12000, 0, "cuEventDestroy_v2"},
      {"cuCtxPushCurrent", 12000, 0, "cuCtxPushCurrent_v2"},
      {"cuCtxPopCurrent", 12000, 0, "cuCtxPopCurrent_v2"},
      {"cuCtxGetDevice", 12000, 0, "cuCtxGetDevice"},
      {"cuPointerSetAttribute", 12000, 0, "cuPointerSetAttribute"},
      {"cuStreamWaitEvent", 12000, 2, "cuStreamWaitEvent_ptsz"},
      {"cuMemAllocPitch", 3000, 0, "cuMemAllocPitch"},
  };
  auto getProcV1 = reinterpret_cast<int (*)(const char*, void**, int, std::uint64_t)>(
      dlsym(drv_.handle, "cuGetProcAddress"));
  ASSERT_NE(getProcV1, nullptr);
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.base << " version " << c.version << " flags " << c.flags);
    void* want = dlsym(drv_.handle, c.expect);
    ASSERT_NE(want, nullptr);
    void* fn = nullptr;
    int status = -1;
    ASSERT_EQ(drv_.getProcAddress(c.base, &fn, c.version, c.flags, &status), kSuccess);
    EXPECT_EQ(status, 0);
    EXPECT_EQ(fn, want);
    fn = nullptr;
    ASSERT_EQ(getProcV1(c.base, &fn, c.version, c.flags), kSuccess);
    EXPECT_EQ(fn, want);
  }
}

TEST_F(FakeCudaTest, AsyncCopiesRunInOrderPerStreamAndEventsMarkAPosition) {
  void* s = stream();
  void* e = event();
  ASSERT_TRUE(s != nullptr && e != nullptr);
  EXPECT_EQ(drv_.eventQuery(e), kSuccess) << "an event never recorded is complete";
  const std::uint64_t a = alloc(kMiB);
  const std::uint64_t b = alloc(kMiB);
  ASSERT_TRUE(a != 0 && b != 0);
  const auto first = pattern(kMiB, 1), second = pattern(kMiB, 2);
  std::vector<unsigned char> out(kMiB, 0);

  drv_.set("hold_streams", 1);  // nothing runs until released: the order below is all the stream's
  const long async = drv_.get("async_copies");
  ASSERT_EQ(drv_.memcpyHtoDAsync(a, first.data(), kMiB, s), kSuccess);
  ASSERT_EQ(drv_.memcpyHtoDAsync(a, second.data(), kMiB, s), kSuccess);  // overwrites the first
  ASSERT_EQ(drv_.memcpyDtoDAsync(b, a, kMiB, s), kSuccess);
  ASSERT_EQ(drv_.memcpyDtoHAsync(out.data(), b, kMiB, s), kSuccess);
  ASSERT_EQ(drv_.eventRecord(e, s), kSuccess);
  EXPECT_EQ(drv_.get("async_copies"), async + 4);
  EXPECT_EQ(drv_.eventQuery(e), kNotReady);
  EXPECT_EQ(drv_.streamQuery(s), kNotReady);
  EXPECT_EQ(out[12345], 0) << "a queued copy ran while the streams were held";

  drv_.set("hold_streams", 0);
  ASSERT_EQ(drv_.eventSynchronize(e), kSuccess);
  EXPECT_EQ(drv_.eventQuery(e), kSuccess);
  EXPECT_EQ(drv_.streamQuery(s), kSuccess);
  EXPECT_EQ(out, second);
}

TEST_F(FakeCudaTest, CopyDelayKeepsAsyncWorkNotReadyUntilItRan) {
  void* s = stream();
  void* e = event();
  ASSERT_TRUE(s != nullptr && e != nullptr);
  const std::uint64_t a = alloc(4096);
  ASSERT_NE(a, 0u);
  const auto src = pattern(4096, 3);
  std::vector<unsigned char> out(4096, 0);
  drv_.set("copy_delay_us", 300000);
  EXPECT_EQ(drv_.get("copy_delay_us"), 300000);
  const long bytes = drv_.get("bytes_htod");
  ASSERT_EQ(drv_.memcpyAsync(a, host(src.data()), 4096, s), kSuccess);
  ASSERT_EQ(drv_.memcpyAsync(host(out.data()), a, 4096, s), kSuccess);
  ASSERT_EQ(drv_.eventRecord(e, s), kSuccess);
  EXPECT_EQ(drv_.eventQuery(e), kNotReady);
  EXPECT_EQ(drv_.streamQuery(s), kNotReady);
  ASSERT_EQ(drv_.streamSynchronize(s), kSuccess);
  EXPECT_EQ(drv_.eventQuery(e), kSuccess);
  EXPECT_EQ(out, src);
  EXPECT_EQ(drv_.get("bytes_htod"), bytes + 4096);
}

TEST_F(FakeCudaTest, StreamsAreIndependentAndTheLegacyStreamWaitsForBlockingOnes) {
  void* blocking = stream(0);
  void* nonblocking = stream(1 /* CU_STREAM_NON_BLOCKING */);
  ASSERT_TRUE(blocking != nullptr && nonblocking != nullptr);
  const std::uint64_t a = alloc(4096);
  ASSERT_NE(a, 0u);
  const auto src = pattern(4096, 4);
  std::vector<unsigned char> out(4096, 0);
  drv_.set("hold_streams", 1);
  ASSERT_EQ(drv_.memcpyHtoDAsync(a, src.data(), 4096, blocking), kSuccess);
  void* e = event();
  ASSERT_EQ(drv_.eventRecord(e, nonblocking), kSuccess);
  EXPECT_EQ(drv_.eventQuery(e), kSuccess) << "nothing was queued on the other stream";
  EXPECT_EQ(drv_.streamQuery(nonblocking), kSuccess);
  EXPECT_EQ(drv_.streamQuery(nullptr), kNotReady) << "the legacy stream waits for blocking streams";
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    drv_.set("hold_streams", 0);
  });
  // On the legacy stream: runs after the queued HtoD, so it sees its bytes.
  EXPECT_EQ(drv_.memcpyDtoHAsync(out.data(), a, 4096, nullptr), kSuccess);
  release.join();
  EXPECT_EQ(out, src);
  EXPECT_EQ(drv_.streamQuery(nullptr), kSuccess);
}

// A correct fake passes this whatever the timing; the delays only make a missing wait show.
TEST_F(FakeCudaTest, StreamWaitEventOrdersAnotherStreamAfterTheEvent) {
  auto waitEvent =
      reinterpret_cast<int (*)(void*, void*, unsigned)>(dlsym(drv_.handle, "cuStreamWaitEvent"));
  ASSERT_NE(waitEvent, nullptr);
  void* producer = stream();
  void* consumer = stream();
  void* produced = event();
  void* consumed = event();
  ASSERT_TRUE(producer != nullptr && consumer != nullptr && produced != nullptr &&
              consumed != nullptr);
  const std::uint64_t a = alloc(4096);
  ASSERT_NE(a, 0u);
  const auto first = pattern(4096, 10), second = pattern(4096, 11);
  std::vector<unsigned char> out(4096, 0);
  drv_.set("copy_delay_us", 100000);
  ASSERT_EQ(drv_.memcpyHtoDAsync(a, first.data(), 4096, producer), kSuccess);
  ASSERT_EQ(drv_.memcpyHtoDAsync(a, second.data(), 4096, producer), kSuccess);
  ASSERT_EQ(drv_.eventRecord(produced, producer), kSuccess);
  ASSERT_EQ(waitEvent(consumer, produced, 0), kSuccess);
  ASSERT_EQ(drv_.memcpyDtoHAsync(out.data(), a, 4096, consumer), kSuccess);
  ASSERT_EQ(drv_.eventRecord(consumed, consumer), kSuccess);
  EXPECT_EQ(drv_.eventQuery(consumed), kNotReady);
  ASSERT_EQ(drv_.eventSynchronize(consumed), kSuccess);
  EXPECT_EQ(drv_.eventQuery(produced), kSuccess) << "the consumer ran after the producer's event";
  EXPECT_EQ(out, second);
  EXPECT_EQ(waitEvent(consumer, consumed, 0), kSuccess) << "its own, complete position";
  int bogus = 0;
  EXPECT_EQ(waitEvent(consumer, &bogus, 0), kInvalidHandle);
}

TEST_F(FakeCudaTest, PitchedAllocationsRoundRowsUp) {
  auto allocPitch =
      reinterpret_cast<int (*)(std::uint64_t*, std::size_t*, std::size_t, std::size_t, unsigned)>(
          dlsym(drv_.handle, "cuMemAllocPitch_v2"));
  ASSERT_NE(allocPitch, nullptr);
  void* fn = nullptr;
  int status = -1;
  ASSERT_EQ(drv_.getProcAddress("cuMemAllocPitch", &fn, 12000, 0, &status), kSuccess);
  EXPECT_EQ(fn, reinterpret_cast<void*>(allocPitch));
  std::uint64_t p = 0;
  std::size_t pitch = 0;
  EXPECT_EQ(allocPitch(&p, &pitch, 1000, 3, 3), kInvalidValue) << "element size 4, 8 or 16";
  ASSERT_EQ(allocPitch(&p, &pitch, 1000, 3, 4), kSuccess);
  allocs_.push_back(p);
  EXPECT_EQ(pitch, 1024u);
  std::size_t size = 0;
  ASSERT_EQ(drv_.pointerGetAttribute(&size, 12 /* RANGE_SIZE */, p + 2000), kSuccess);
  EXPECT_EQ(size, 3 * 1024u);
  std::vector<unsigned char> row(1000, 9);
  EXPECT_EQ(drv_.memcpyHtoD(p + 2 * pitch, row.data(), 1000), kSuccess);
}

TEST_F(FakeCudaTest, StreamAndEventHandlesAreValidated) {
  int bogus = 0;
  std::vector<unsigned char> buf(16, 0);
  const std::uint64_t a = alloc(4096);
  ASSERT_NE(a, 0u);
  EXPECT_EQ(drv_.memcpyHtoDAsync(a, buf.data(), 16, &bogus), kInvalidHandle);
  EXPECT_EQ(drv_.streamSynchronize(&bogus), kInvalidHandle);
  EXPECT_EQ(drv_.streamQuery(&bogus), kInvalidHandle);
  EXPECT_EQ(drv_.eventQuery(&bogus), kInvalidHandle);
  EXPECT_EQ(drv_.streamCreate(nullptr, 0), kInvalidValue);
  void* s = nullptr;
  EXPECT_EQ(drv_.streamCreate(&s, 8), kInvalidValue);
  const long live = drv_.get("streams");
  ASSERT_EQ(drv_.streamCreate(&s, 0), kSuccess);
  EXPECT_EQ(drv_.get("streams"), live + 1);
  ASSERT_EQ(drv_.streamDestroy(s), kSuccess);
  EXPECT_EQ(drv_.get("streams"), live);
  EXPECT_EQ(drv_.streamDestroy(s), kInvalidHandle) << "destroyed twice";
}

TEST_F(FakeCudaTest, AHostFaultInAnAsyncCopyBreaksTheStream) {
  void* s = stream();
  ASSERT_NE(s, nullptr);
  const std::uint64_t a = alloc(3 * 4096);
  ASSERT_NE(a, 0u);
  // Readable at both ends when queued, a hole in the middle when the copy runs.
  char* host_buf = static_cast<char*>(
      mmap(nullptr, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(host_buf, MAP_FAILED);
  ASSERT_EQ(munmap(host_buf + 4096, 4096), 0);
  ASSERT_EQ(drv_.memcpyHtoDAsync(a, host_buf, 3 * 4096, s), kSuccess);
  EXPECT_NE(drv_.streamSynchronize(s), kSuccess);
  EXPECT_EQ(drv_.streamQuery(s), 700) << "CUDA_ERROR_ILLEGAL_ADDRESS is sticky";
  munmap(host_buf, 4096);
  munmap(host_buf + 2 * 4096, 4096);
}

TEST_F(FakeCudaTest, FreeThenReallocateAtTheSameAddressReadsZerosNotTheOldBytes) {
  const long base = drv_.get("arena_bytes");
  ASSERT_GE(base, 0);
  const std::uint64_t a = drv_.alloc(kMiB);
  ASSERT_NE(a, 0u);
  ASSERT_EQ(drv_.memsetD8(a, 0xab, kMiB), kSuccess);
  EXPECT_GE(drv_.get("arena_bytes"), base + static_cast<long>(kMiB)) << "the pages are the memfd's";
  ASSERT_EQ(drv_.memFree(a), kSuccess);
  EXPECT_LE(drv_.get("arena_bytes"), base) << "a free punches the pages out of the memfd";
  const std::uint64_t again = alloc(kMiB);
  ASSERT_EQ(again, a) << "lowest address first";
  const auto v = read(again, kMiB);
  EXPECT_EQ(v, std::vector<unsigned char>(kMiB, 0));
}

TEST_F(FakeCudaTest, AHolderOfTheOldPagesKeepsThemAfterTheFree) {
  if (drv_.get("cpu_access") == 0) {
    GTEST_SKIP()
        << "pinning the pages needs CPU access to device memory (GMD_FAKE_CUDA_CPU_ACCESS=0)";
  }
  // vmsplice takes references to the pages as an RDMA registration pins them.
  const std::uint64_t a = drv_.alloc(65536);
  ASSERT_NE(a, 0u);
  ASSERT_EQ(drv_.memsetD8(a, 0x5c, 65536), kSuccess);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  iovec iov{reinterpret_cast<void*>(a), 4096};
  ASSERT_EQ(vmsplice(fds[1], &iov, 1, 0), 4096);
  ASSERT_EQ(drv_.memFree(a), kSuccess);
  const std::uint64_t again = alloc(65536);
  ASSERT_EQ(again, a);
  ASSERT_EQ(drv_.memsetD8(again, 0x11, 65536), kSuccess);
  std::vector<unsigned char> pinned(4096, 0);
  ASSERT_EQ(::read(fds[0], pinned.data(), 4096), 4096);
  EXPECT_EQ(pinned, std::vector<unsigned char>(4096, 0x5c)) << "the holder sees the old pages";
  EXPECT_EQ(read(again, 4096), std::vector<unsigned char>(4096, 0x11)) << "the device the new ones";
  close(fds[0]);
  close(fds[1]);
}

TEST_F(FakeCudaTest, VmmMemoryCopiesAndAFreshHandleReadsZeros) {
  std::uint64_t va = 0, h = 0;
  const std::size_t size = 2 * 65536;
  ASSERT_EQ(drv_.addressReserve(&va, size, 0, 0, 0), kSuccess);
  ASSERT_EQ(drv_.memCreate(&h, size, nullptr, 0), kSuccess);
  ASSERT_EQ(drv_.memMap(va, size, 0, h, 0), kSuccess);
  const auto src = pattern(size - 10, 5);
  ASSERT_EQ(drv_.memcpyHtoD(va + 5, src.data(), src.size()), kSuccess);
  std::vector<unsigned char> out(src.size(), 0);
  ASSERT_EQ(drv_.memcpyDtoH(out.data(), va + 5, out.size()), kSuccess);
  EXPECT_EQ(out, src);
  EXPECT_EQ(drv_.memcpyHtoD(va + size - 1, src.data(), 2), kInvalidValue) << "past the mapping";
  ASSERT_EQ(drv_.memUnmap(va, size), kSuccess);
  EXPECT_EQ(drv_.memcpyDtoH(out.data(), va, 16), kInvalidValue) << "reserved, not mapped";
  // The same handle mapped again still holds its bytes; a new handle holds zeros.
  ASSERT_EQ(drv_.memMap(va, size, 0, h, 0), kSuccess);
  EXPECT_EQ(read(va + 5, 16), std::vector<unsigned char>(src.begin(), src.begin() + 16));
  ASSERT_EQ(drv_.memUnmap(va, size), kSuccess);
  const long handles = drv_.get("handles");
  ASSERT_EQ(drv_.memRelease(h), kSuccess);
  EXPECT_EQ(drv_.get("handles"), handles - 1);
  ASSERT_EQ(drv_.memCreate(&h, size, nullptr, 0), kSuccess);
  ASSERT_EQ(drv_.memMap(va, size, 0, h, 0), kSuccess);
  EXPECT_EQ(read(va, size), std::vector<unsigned char>(size, 0));
  ASSERT_EQ(drv_.memUnmap(va, size), kSuccess);
  ASSERT_EQ(drv_.memRelease(h), kSuccess);
  ASSERT_EQ(drv_.addressFree(va, size), kSuccess);
}

// What the mode promises at the device address: readable and shared (GPUDirect through peer memory
// pins it) by default; a fault with GMD_FAKE_CUDA_CPU_ACCESS=0, managed memory excepted.
TEST_F(FakeCudaTest, CpuAccessToDeviceMemoryIsWhatTheModeSays) {
  const std::uint64_t a = alloc(65536);
  std::uint64_t m = 0;
  ASSERT_EQ(drv_.memAllocManaged(&m, 4096, 1), kSuccess);
  allocs_.push_back(m);
  ASSERT_NE(a, 0u);
  ASSERT_EQ(drv_.memsetD8(a, 0x42, 65536), kSuccess);
  ASSERT_EQ(drv_.memsetD8(m, 0x24, 4096), kSuccess);
  EXPECT_EQ(*reinterpret_cast<volatile unsigned char*>(m + 100), 0x24) << "managed stays readable";
  if (drv_.get("cpu_access") == 1) {
    EXPECT_EQ(*reinterpret_cast<volatile unsigned char*>(a + 100), 0x42);
    *reinterpret_cast<volatile unsigned char*>(a + 100) = 0x43;
    EXPECT_EQ(read(a + 100, 1)[0], 0x43);
    // A shared mapping of a memfd, which ibv_reg_mr can pin.
    std::ifstream maps("/proc/self/maps");
    std::string line;
    bool shared = false;
    while (std::getline(maps, line)) {
      std::uint64_t lo = 0, hi = 0;
      char perms[5] = {};
      if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && lo <= a && a < hi) {
        shared = perms[3] == 's' && line.find("memfd:") != std::string::npos;
      }
    }
    EXPECT_TRUE(shared) << "device memory must be a MAP_SHARED memfd mapping";
  } else {
    ASSERT_EQ(drv_.get("cpu_access"), 0);
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    SegvReachesTheChild segv;
    EXPECT_EXIT((void)*reinterpret_cast<volatile unsigned char*>(a + 100),
                testing::KilledBySignal(SIGSEGV), "");
  }
}

TEST_F(FakeCudaTest, ContextsAreRequiredAndPushPopRestoresThem) {
  const std::uint64_t a = alloc(4096);
  ASSERT_NE(a, 0u);
  std::vector<unsigned char> buf = pattern(64, 6);
  void* s = stream();
  void* e = event();
  void* primary = nullptr;
  ASSERT_EQ(drv_.primaryCtxRetain(&primary, 0), kSuccess);
  void* current = nullptr;
  ASSERT_EQ(drv_.ctxGetCurrent(&current), kSuccess);
  EXPECT_EQ(current, primary) << "an untouched thread has the current device's primary context";
  void* ptr_ctx = nullptr;
  ASSERT_EQ(drv_.pointerGetAttribute(&ptr_ctx, kAttrContext, a), kSuccess);
  EXPECT_EQ(ptr_ctx, primary);

  ASSERT_EQ(drv_.ctxSetCurrent(nullptr), kSuccess);
  ASSERT_EQ(drv_.ctxGetCurrent(&current), kSuccess);
  EXPECT_EQ(current, nullptr);
  int device = -1;
  EXPECT_EQ(drv_.ctxGetDevice(&device), kInvalidContext);
  EXPECT_EQ(drv_.memcpyHtoD(a, buf.data(), 64), kInvalidContext);
  EXPECT_EQ(drv_.memcpyDtoH(buf.data(), a, 64), kInvalidContext);
  EXPECT_EQ(drv_.memcpy(a, host(buf.data()), 64), kInvalidContext);
  EXPECT_EQ(drv_.memcpyAsync(a, host(buf.data()), 64, s), kInvalidContext);
  EXPECT_EQ(drv_.memsetD8(a, 0, 64), kInvalidContext);
  void* s2 = nullptr;
  void* e2 = nullptr;
  EXPECT_EQ(drv_.streamCreate(&s2, 0), kInvalidContext);
  EXPECT_EQ(drv_.eventCreate(&e2, 0), kInvalidContext);
  EXPECT_EQ(drv_.eventRecord(e, s), kInvalidContext);
  EXPECT_EQ(drv_.streamSynchronize(s), kInvalidContext);
  EXPECT_EQ(drv_.streamQuery(s), kInvalidContext);
  EXPECT_EQ(drv_.eventQuery(e), kSuccess) << "cuEventQuery needs no context";
  EXPECT_EQ(drv_.alloc(4096), 0u) << "allocations need one too";
  void* popped = nullptr;
  EXPECT_EQ(drv_.ctxPopCurrent(&popped), kInvalidContext) << "the stack is empty";

  ASSERT_EQ(drv_.ctxPushCurrent(primary), kSuccess);
  ASSERT_EQ(drv_.ctxGetDevice(&device), kSuccess);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(drv_.memcpyHtoD(a, buf.data(), 64), kSuccess);
  EXPECT_EQ(read(a, 64), buf);
  ASSERT_EQ(drv_.ctxPopCurrent(&popped), kSuccess);
  EXPECT_EQ(popped, primary);
  EXPECT_EQ(drv_.memcpyHtoD(a, buf.data(), 64), kInvalidContext) << "popped back to none";
  EXPECT_EQ(drv_.ctxPushCurrent(reinterpret_cast<void*>(0x999)), kInvalidContext);

  // Another thread is not affected by this one's stack.
  int other = -1;
  std::thread([&] { other = drv_.memcpyHtoD(a, buf.data(), 64); }).join();
  EXPECT_EQ(other, kSuccess);

  ASSERT_EQ(drv_.ctxSetCurrent(primary), kSuccess);
  EXPECT_EQ(drv_.memcpyHtoD(a, buf.data(), 64), kSuccess);
}

TEST_F(FakeCudaTest, SyncMemopsIsSetOnTheAllocationAndReadBack) {
  const std::uint64_t a = alloc(65536);
  ASSERT_NE(a, 0u);
  bool flag = true;
  ASSERT_EQ(drv_.pointerGetAttribute(&flag, kAttrSyncMemops, a), kSuccess);
  EXPECT_FALSE(flag) << "off on a new allocation";
  const long sets = drv_.get("sync_memops_set");
  const unsigned one = 1;
  ASSERT_EQ(drv_.pointerSetAttribute(&one, kAttrSyncMemops, a + 1000), kSuccess);
  EXPECT_EQ(drv_.get("sync_memops_set"), sets + 1);
  ASSERT_EQ(drv_.pointerGetAttribute(&flag, kAttrSyncMemops, a + 5), kSuccess);
  EXPECT_TRUE(flag);
  int attrs[] = {kAttrSyncMemops, kAttrContext};
  bool flag2 = false;
  void* ctx = nullptr;
  void* data[] = {&flag2, &ctx};
  ASSERT_EQ(drv_.pointerGetAttributes(2, attrs, data, a), kSuccess);
  EXPECT_TRUE(flag2);
  EXPECT_NE(ctx, nullptr);
  // Host memory, and attributes that cannot be set, are refused.
  int on_host = 0;
  EXPECT_EQ(drv_.pointerSetAttribute(&one, kAttrSyncMemops, host(&on_host)), kInvalidValue);
  EXPECT_EQ(drv_.pointerSetAttribute(&one, kAttrContext, a), kInvalidValue);
  EXPECT_EQ(drv_.get("sync_memops_set"), sets + 1);
  // A new allocation at the same address starts without it.
  release(a);
  const std::uint64_t again = alloc(65536);
  ASSERT_EQ(again, a);
  ASSERT_EQ(drv_.pointerGetAttribute(&flag, kAttrSyncMemops, again), kSuccess);
  EXPECT_FALSE(flag);
}

// The mode forced in a child of its own (a re-executed test binary, so the fake starts afresh
// there): a CPU read of device memory dies with SIGSEGV, after copies through the driver and a
// managed read went through.
void touchDeviceMemoryWithoutCpuAccess() {
  test::FakeDriver drv;
  if (!drv.load() || drv.init(0) != 0) std::_Exit(2);
  if (drv.get("cpu_access") != 0) std::_Exit(3);
  const std::uint64_t a = drv.alloc(4096);
  std::uint64_t m = 0;
  if (a == 0 || drv.memAllocManaged(&m, 4096, 1) != 0) std::_Exit(4);
  const auto src = pattern(4096, 8);
  std::vector<unsigned char> out(4096, 0);
  if (drv.memcpyHtoD(a, src.data(), 4096) != 0 || drv.memcpy(m, a, 4096) != 0 ||
      drv.memcpyDtoH(out.data(), a, 4096) != 0 || out != src) {
    std::_Exit(5);
  }
  if (*reinterpret_cast<volatile unsigned char*>(m + 7) != src[7]) std::_Exit(6);
  std::fprintf(stderr, "copies and managed memory fine; touching device memory\n");
  (void)*reinterpret_cast<volatile unsigned char*>(a + 7);
  std::_Exit(0);  // no fault: the mode did not take
}

TEST(FakeCudaDeathTest, CpuReadOfDeviceMemoryFaultsWithoutCpuAccess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const char* old = std::getenv("GMD_FAKE_CUDA_CPU_ACCESS");
  const std::string saved = old != nullptr ? old : "";
  ASSERT_EQ(setenv("GMD_FAKE_CUDA_CPU_ACCESS", "0", 1), 0);
  SegvReachesTheChild segv;
  EXPECT_EXIT(touchDeviceMemoryWithoutCpuAccess(), testing::KilledBySignal(SIGSEGV),
              "copies and managed memory fine");
  if (old != nullptr) {
    setenv("GMD_FAKE_CUDA_CPU_ACCESS", saved.c_str(), 1);
  } else {
    unsetenv("GMD_FAKE_CUDA_CPU_ACCESS");
  }
}

}  // namespace
}  // namespace gmd::memtype
