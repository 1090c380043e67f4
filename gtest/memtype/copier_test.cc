// The Copier (memtype/copier.h) against the fake CUDA driver (label unit): every direction (host,
// device, managed), odd sizes and offsets, 0 bytes; bytes checked by copying them back to the host
// (the fake may forbid CPU access to its device memory, as a discrete GPU does); asynchronous
// copies completed in submission order by progress() and by drain(); context handling with no
// current context, on a fresh thread, and with another context current; driver errors.
//
// Skips with a reason when the fake driver lacks the copy, stream, event or context entry points.
#include "memtype/copier.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/memtype/fake_driver.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace gmd::memtype {
namespace {

constexpr std::size_t kMiB = 1 << 20;

// A host pattern that differs for every byte position and seed.
std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + 1) & 0xff);
  return v;
}

// Records completions in order. Thread safety: callbacks run inside progress()/drain() on the
// test's thread.
struct Completions {
  std::vector<std::pair<int, int>> done;  // (tag, result)
  static void cb(void* arg, int result) {
    auto* t = static_cast<std::pair<Completions*, int>*>(arg);
    t->first->done.emplace_back(t->second, result);
  }
};

class CopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Classifier::instance().cudaAvailable());
    ASSERT_TRUE(drv_.load()) << "the fake libcuda.so.1 must be first on LD_LIBRARY_PATH";
    const detail::DriverApi* api = detail::driver();
    ASSERT_NE(api, nullptr);
    if (!api->hasCopyApi()) {
      GTEST_SKIP() << "the fake driver has no copy, stream, event or context entry points";
    }
    api_ = api;
    copier_ = Copier::create();
    ASSERT_NE(copier_, nullptr);
  }
  void TearDown() override {
    copier_.reset();
    for (std::uint64_t p : allocs_) EXPECT_EQ(drv_.memFree(p), 0);
    drv_.set("current_device", 0);
    drv_.set("devices", -1);
    if (api_ != nullptr) {
      EXPECT_EQ(test::LogCapture::loud(), 0) << "memtype logged above debug level";
    }
  }
  void* device(std::size_t n) {
    const std::uint64_t p = drv_.alloc(n);
    EXPECT_NE(p, 0u);
    allocs_.push_back(p);
    return reinterpret_cast<void*>(p);
  }
  void* managed(std::size_t n) {
    std::uint64_t p = 0;
    EXPECT_EQ(drv_.memAllocManaged(&p, n, 1), 0);
    allocs_.push_back(p);
    return reinterpret_cast<void*>(p);
  }
  void* currentContext() {
    void* ctx = nullptr;
    EXPECT_EQ(api_->ctxGetCurrent(&ctx), 0);
    return ctx;
  }
  // host -> mem at offset -> host, through copy(); the bytes must come back.
  void roundTrip(void* mem, std::size_t offset, std::size_t n, unsigned seed) {
    const std::vector<unsigned char> in = pattern(n, seed);
    std::vector<unsigned char> out(n, 0);
    char* at = static_cast<char*>(mem) + offset;
    ASSERT_EQ(copier_->copy(at, in.data(), n), 0) << n << " bytes at +" << offset;
    ASSERT_EQ(copier_->copy(out.data(), at, n), 0) << n << " bytes at +" << offset;
    EXPECT_EQ(std::memcmp(in.data(), out.data(), n), 0) << n << " bytes at +" << offset;
  }

  test::LogCapture log_;
  test::FakeDriver drv_;
  const detail::DriverApi* api_ = nullptr;
  std::unique_ptr<Copier> copier_;
  std::vector<std::uint64_t> allocs_;
};

// --- synchronous copies
// -----------------------------------------------------------------------------

TEST_F(CopierTest, HostToDeviceToHostEverySizeClassAndOddOffsets) {
  void* d = device(5 * kMiB);
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{4095},
                        std::size_t{65537}, std::size_t{kMiB + 3}, 4 * kMiB}) {
    for (std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{13}}) {
      roundTrip(d, off, n, static_cast<unsigned>(n + off));
    }
  }
}

TEST_F(CopierTest, DeviceToDevice) {
  const std::size_t n = 3 * kMiB + 11;
  void* a = device(n + 64);
  void* b = device(n + 64);
  const std::vector<unsigned char> in = pattern(n, 5);
  ASSERT_EQ(copier_->copy(static_cast<char*>(a) + 3, in.data(), n), 0);
  ASSERT_EQ(copier_->copy(static_cast<char*>(b) + 17, static_cast<char*>(a) + 3, n), 0);
  std::vector<unsigned char> out(n, 0);
  ASSERT_EQ(copier_->copy(out.data(), static_cast<char*>(b) + 17, n), 0);
  EXPECT_EQ(in, out);
}

TEST_F(CopierTest, ManagedMemoryBothWaysAndToDevice) {
  void* m = managed(2 * kMiB);
  roundTrip(m, 5, kMiB + 1, 9);
  void* d = device(kMiB);
  const std::vector<unsigned char> in = pattern(kMiB, 11);
  ASSERT_EQ(copier_->copy(m, in.data(), kMiB), 0);
  ASSERT_EQ(copier_->copy(d, m, kMiB), 0);
  std::vector<unsigned char> out(kMiB, 0);
  ASSERT_EQ(copier_->copy(out.data(), d, kMiB), 0);
  EXPECT_EQ(in, out);
}

TEST_F(CopierTest, HostToHostIsAPlainCopy) {
  const std::vector<unsigned char> in = pattern(1000, 3);
  std::vector<unsigned char> out(1000, 0);
  ASSERT_EQ(copier_->copy(out.data(), in.data(), in.size()), 0);
  EXPECT_EQ(in, out);
}

TEST_F(CopierTest, ZeroBytesIsANoOpEvenForNullPointers) {
  EXPECT_EQ(copier_->copy(nullptr, nullptr, 0), 0);
  void* d = device(4096);
  std::vector<unsigned char> h(16, 0);
  EXPECT_EQ(copier_->copy(d, h.data(), 0), 0);
  EXPECT_EQ(copier_->copy(h.data(), d, 0), 0);
}

// --- asynchronous copies
// ----------------------------------------------------------------------------

TEST_F(CopierTest, AsyncCopiesCompleteInSubmissionOrderThroughProgress) {
  constexpr int kCopies = 24;
  const std::size_t n = 256 * 1024 + 5;
  void* d = device(kCopies * n);
  std::vector<std::vector<unsigned char>> in;
  for (int i = 0; i < kCopies; ++i) in.push_back(pattern(n, static_cast<unsigned>(i)));
  Completions c;
  std::vector<std::pair<Completions*, int>> tags;
  tags.reserve(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    tags.emplace_back(&c, i);
    ASSERT_EQ(copier_->copyAsync(static_cast<char*>(d) + i * n, in[i].data(), n, &Completions::cb,
                                 &tags.back()),
              0);
  }
  EXPECT_LE(copier_->outstanding(), static_cast<std::size_t>(kCopies));
  EXPECT_EQ(copier_->outstanding() + c.done.size(), static_cast<std::size_t>(kCopies))
      << "nothing completes before progress()";
  EXPECT_TRUE(c.done.empty()) << "callbacks run only inside progress() or drain()";
  unsigned total = 0;
  for (long spins = 0; copier_->outstanding() != 0 && spins < 100000000; ++spins) {
    const unsigned got = copier_->progress();
    total += got;
    EXPECT_EQ(copier_->outstanding() + total, static_cast<std::size_t>(kCopies));
  }
  ASSERT_EQ(copier_->outstanding(), 0u);
  EXPECT_EQ(total, static_cast<unsigned>(kCopies));
  ASSERT_EQ(c.done.size(), static_cast<std::size_t>(kCopies));
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(c.done[i].first, i) << "completion order is submission order";
    EXPECT_EQ(c.done[i].second, 0);
  }
  EXPECT_EQ(copier_->progress(), 0u);
  for (int i = 0; i < kCopies; ++i) {
    std::vector<unsigned char> out(n, 0);
    ASSERT_EQ(copier_->copy(out.data(), static_cast<char*>(d) + i * n, n), 0);
    EXPECT_EQ(out, in[i]) << "copy " << i;
  }
}

TEST_F(CopierTest, DrainCompletesEverythingEveryDirection) {
  const std::size_t n = kMiB + 3;
  void* d = device(n);
  void* e = device(n);
  void* m = managed(n);
  const std::vector<unsigned char> in = pattern(n, 21);
  std::vector<unsigned char> out(n, 0);
  std::vector<unsigned char> host_copy(n, 0);
  Completions c;
  std::pair<Completions*, int> t[5] = {{&c, 0}, {&c, 1}, {&c, 2}, {&c, 3}, {&c, 4}};
  // Same stream (device 0): each copy sees the previous one's bytes.
  ASSERT_EQ(copier_->copyAsync(d, in.data(), n, &Completions::cb, &t[0]), 0);
  ASSERT_EQ(copier_->copyAsync(e, d, n, &Completions::cb, &t[1]), 0);
  ASSERT_EQ(copier_->copyAsync(m, e, n, &Completions::cb, &t[2]), 0);
  ASSERT_EQ(copier_->copyAsync(out.data(), m, n, &Completions::cb, &t[3]), 0);
  ASSERT_EQ(copier_->copyAsync(host_copy.data(), in.data(), n, &Completions::cb, &t[4]), 0);
  copier_->drain();
  EXPECT_EQ(copier_->outstanding(), 0u);
  ASSERT_EQ(c.done.size(), 5u);
  for (const auto& [tag, result] : c.done) EXPECT_EQ(result, 0) << tag;
  EXPECT_EQ(out, in);
  EXPECT_EQ(host_copy, in);
}

// A done callback may queue the next copy (a transport's completion starting the next fragment).
struct Chain {
  Copier* copier;
  void* dev;
  unsigned char* host;
  std::size_t n;
  int left;
  const detail::DriverApi* api;
  void* caller_ctx;
  int done = 0;
  int errors = 0;
  static void cb(void* arg, int result) {
    auto* c = static_cast<Chain*>(arg);
    ++c->done;
    if (result != 0) ++c->errors;
    void* ctx = reinterpret_cast<void*>(1);
    if (c->api->ctxGetCurrent(&ctx) != 0 || ctx != c->caller_ctx) ++c->errors;  // caller's context
    if (c->left-- > 0 && c->copier->copyAsync(c->host, c->dev, c->n, &Chain::cb, c) != 0) {
      ++c->errors;
    }
  }
};

TEST_F(CopierTest, DoneCallbackMayQueueTheNextCopy) {
  const std::size_t n = 64 * 1024 + 1;
  void* d = device(n);
  const std::vector<unsigned char> in = pattern(n, 30);
  std::vector<unsigned char> out(n, 0);
  ASSERT_EQ(copier_->copy(d, in.data(), n), 0);
  // The caller has device 1's context current; the copies run in device 0's.
  drv_.set("devices", 2);
  std::unique_ptr<Copier> two = Copier::create();
  ASSERT_NE(two, nullptr);
  void* ctx1 = nullptr;
  ASSERT_EQ(api_->devicePrimaryCtxRetain(&ctx1, 1), 0);
  void* saved = currentContext();
  ASSERT_EQ(api_->ctxSetCurrent(ctx1), 0);
  Chain chain{two.get(), d, out.data(), n, 5, api_, ctx1};
  ASSERT_EQ(two->copyAsync(out.data(), d, n, &Chain::cb, &chain), 0);
  while (two->outstanding() != 0) two->progress();
  EXPECT_EQ(chain.done, 6);
  EXPECT_EQ(chain.errors, 0) << "a copy failed or a callback saw another context";
  EXPECT_EQ(in, out);
  // The same through drain().
  chain.left = 3;
  chain.done = 0;
  ASSERT_EQ(two->copyAsync(out.data(), d, n, &Chain::cb, &chain), 0);
  two->drain();
  EXPECT_EQ(chain.done, 4);
  EXPECT_EQ(chain.errors, 0);
  EXPECT_EQ(two->outstanding(), 0u);
  two.reset();
  ASSERT_EQ(api_->ctxSetCurrent(saved), 0);
  api_->devicePrimaryCtxRelease(1);
}

TEST_F(CopierTest, ZeroByteAsyncCopyStillCompletesOnce) {
  Completions c;
  std::pair<Completions*, int> t{&c, 7};
  ASSERT_EQ(copier_->copyAsync(nullptr, nullptr, 0, &Completions::cb, &t), 0);
  EXPECT_EQ(copier_->outstanding(), 1u);
  EXPECT_EQ(copier_->progress(), 1u);
  ASSERT_EQ(c.done.size(), 1u);
  EXPECT_EQ(c.done[0], std::make_pair(7, 0));
  EXPECT_EQ(copier_->outstanding(), 0u);
}

TEST_F(CopierTest, DestroyingWithCopiesInFlightCompletesThem) {
  void* d = device(kMiB);
  const std::vector<unsigned char> in = pattern(kMiB, 1);
  Completions c;
  std::pair<Completions*, int> t{&c, 1};
  ASSERT_EQ(copier_->copyAsync(d, in.data(), kMiB, &Completions::cb, &t), 0);
  copier_.reset();
  ASSERT_EQ(c.done.size(), 1u);
  EXPECT_EQ(c.done[0].second, 0);
}

// --- contexts
// ---------------------------------------------------------------------------------------

// Copies, an asynchronous copy completed by progress(), and the Copier's teardown on a thread
// without a current context; returns the context the thread has afterwards (1 on a setup failure).
void* copyWithoutContext(const detail::DriverApi& api, void* d,
                         const std::vector<unsigned char>& in, std::vector<unsigned char>& out,
                         int* results) {
  void* ctx = reinterpret_cast<void*>(1);
  // The fake gives a thread that never touched contexts the current device's (a real driver gives
  // it none): leave it without one.
  if (api.ctxSetCurrent(nullptr) != 0 || api.ctxGetCurrent(&ctx) != 0 || ctx != nullptr) {
    return reinterpret_cast<void*>(1);
  }
  std::unique_ptr<Copier> own = Copier::create();
  if (own == nullptr) return reinterpret_cast<void*>(1);
  results[0] = own->copy(d, in.data(), in.size());
  results[1] = own->copyAsync(out.data(), d, out.size(), nullptr, nullptr);
  while (own->outstanding() != 0) own->progress();
  results[2] = setSyncMemops(d);
  own.reset();
  ctx = reinterpret_cast<void*>(1);
  api.ctxGetCurrent(&ctx);
  return ctx;
}

TEST_F(CopierTest, NoContextOnTheCallingThreadAndStaysWithoutOne) {
  void* d = device(kMiB);
  const std::vector<unsigned char> in = pattern(kMiB, 4);
  std::vector<unsigned char> out(kMiB, 0);
  int r[3] = {-1, -1, -1};
  void* saved = currentContext();
  EXPECT_EQ(copyWithoutContext(*api_, d, in, out, r), nullptr) << "a context left current";
  EXPECT_EQ(r[0], 0);
  EXPECT_EQ(r[1], 0);
  EXPECT_EQ(r[2], 0) << "setSyncMemops without a current context";
  EXPECT_EQ(in, out);
  ASSERT_EQ(api_->ctxSetCurrent(saved), 0);
}

TEST_F(CopierTest, FreshThreadWithoutContextCopiesAndStaysWithoutOne) {
  void* d = device(kMiB);
  const std::vector<unsigned char> in = pattern(kMiB, 5);
  std::vector<unsigned char> out(kMiB, 0);
  int r[3] = {-1, -1, -1};
  void* after = reinterpret_cast<void*>(1);
  std::thread th([&] { after = copyWithoutContext(*api_, d, in, out, r); });
  th.join();
  EXPECT_EQ(after, nullptr) << "a context left current";
  EXPECT_EQ(r[0], 0);
  EXPECT_EQ(r[1], 0);
  EXPECT_EQ(r[2], 0);
  EXPECT_EQ(in, out);
}

// A fresh thread as the fake makes it (the current device's context, untouched): used as is.
TEST_F(CopierTest, FreshThreadWithItsDefaultContext) {
  void* d = device(kMiB);
  const std::vector<unsigned char> in = pattern(kMiB, 6);
  std::vector<unsigned char> out(kMiB, 0);
  void* before = nullptr;
  void* after = reinterpret_cast<void*>(1);
  int r[2] = {-1, -1};
  std::thread th([&] {
    api_->ctxGetCurrent(&before);
    std::unique_ptr<Copier> own = Copier::create();
    if (own == nullptr) return;
    r[0] = own->copy(d, in.data(), in.size());
    r[1] = own->copy(out.data(), d, out.size());
    own.reset();
    api_->ctxGetCurrent(&after);
  });
  th.join();
  EXPECT_EQ(r[0], 0);
  EXPECT_EQ(r[1], 0);
  EXPECT_EQ(after, before);
  EXPECT_EQ(in, out);
}

// A device failure (not a caller mistake) is returned and logged at error level.
TEST_F(CopierTest, DeviceFailureIsReturnedAndLogged) {
  void* d = device(4096);
  std::vector<unsigned char> h(4096, 1);
  if (drv_.get("copy_delay_us") < 0) GTEST_SKIP() << "the fake has no copy_error control";
  drv_.set("copy_error", 999);  // CUDA_ERROR_UNKNOWN
  Completions c;
  std::pair<Completions*, int> t{&c, 1};
  EXPECT_EQ(copier_->copy(d, h.data(), h.size()), 999);
  EXPECT_EQ(copier_->copyAsync(d, h.data(), h.size(), &Completions::cb, &t), 999);
  drv_.set("copy_error", 0);
  copier_->drain();
  EXPECT_TRUE(c.done.empty());
  EXPECT_EQ(test::LogCapture::loud(), 2) << "one error line per failed call";
  test::LogCapture::reset();
  EXPECT_EQ(copier_->copy(d, h.data(), h.size()), 0) << "usable afterwards";
}

TEST_F(CopierTest, CallersContextIsUnchanged) {
  ASSERT_NE(api_->ctxSetCurrent, nullptr);
  drv_.set("devices", 2);
  void* d = device(kMiB);  // on device 0
  // The caller has device 1's primary context current; the copy runs in device 0's.
  void* ctx1 = nullptr;
  ASSERT_EQ(api_->devicePrimaryCtxRetain(&ctx1, 1), 0);
  ASSERT_EQ(api_->ctxSetCurrent(ctx1), 0);
  std::unique_ptr<Copier> two = Copier::create();  // sized for two devices
  ASSERT_NE(two, nullptr);
  const std::vector<unsigned char> in = pattern(kMiB, 8);
  std::vector<unsigned char> out(kMiB, 0);
  EXPECT_EQ(two->copy(d, in.data(), kMiB), 0);
  EXPECT_EQ(currentContext(), ctx1);
  EXPECT_EQ(two->copyAsync(out.data(), d, kMiB, nullptr, nullptr), 0);
  EXPECT_EQ(currentContext(), ctx1);
  while (two->outstanding() != 0) two->progress();
  EXPECT_EQ(currentContext(), ctx1);
  two->drain();
  two.reset();
  EXPECT_EQ(currentContext(), ctx1);
  EXPECT_EQ(in, out);
  // Back to the state the other tests expect.
  void* ctx0 = nullptr;
  ASSERT_EQ(api_->devicePrimaryCtxRetain(&ctx0, 0), 0);
  ASSERT_EQ(api_->ctxSetCurrent(ctx0), 0);
  api_->devicePrimaryCtxRelease(0);
  api_->devicePrimaryCtxRelease(1);
}

// --- errors
// -----------------------------------------------------------------------------------------

TEST_F(CopierTest, CopyPastTheAllocationReturnsTheDriverErrorAndCallsNoCallback) {
  void* d = device(64 * 1024);
  std::vector<unsigned char> big(4 * kMiB, 0);
  const int sync = copier_->copy(big.data(), d, big.size());
  EXPECT_NE(sync, 0) << "reading 4 MiB out of a 64 KiB allocation";
  Completions c;
  std::pair<Completions*, int> t{&c, 1};
  const int async = copier_->copyAsync(big.data(), d, big.size(), &Completions::cb, &t);
  EXPECT_NE(async, 0);
  copier_->drain();
  EXPECT_TRUE(c.done.empty()) << "a refused copy calls no callback";
  EXPECT_EQ(copier_->outstanding(), 0u);
}

TEST_F(CopierTest, NullHostSideReturnsTheDriverError) {
  void* d = device(4096);
  Completions c;
  std::pair<Completions*, int> t{&c, 1};
  EXPECT_NE(copier_->copy(nullptr, d, 4096), 0);
  EXPECT_NE(copier_->copyAsync(nullptr, d, 4096, &Completions::cb, &t), 0);
  EXPECT_EQ(copier_->progress(), 0u);
  EXPECT_TRUE(c.done.empty());
}

// --- SYNC_MEMOPS
// -------------------------------------------------------------------------------------

TEST_F(CopierTest, SetSyncMemopsSetsTheAttribute) {
  if (api_->pointerSetAttribute == nullptr) GTEST_SKIP() << "no cuPointerSetAttribute in the fake";
  void* d = device(kMiB);
  EXPECT_EQ(setSyncMemops(static_cast<char*>(d) + 100), 0);
  unsigned v = 0;
  ASSERT_EQ(api_->pointerGetAttribute(&v, 6 /* SYNC_MEMOPS */, reinterpret_cast<std::uintptr_t>(d)),
            0);
  EXPECT_EQ(v, 1u);
  EXPECT_EQ(setSyncMemops(d), 0) << "idempotent";
  std::vector<char> host(16);
  EXPECT_NE(setSyncMemops(host.data()), 0) << "host memory is no device allocation";
}

}  // namespace
}  // namespace gmd::memtype
