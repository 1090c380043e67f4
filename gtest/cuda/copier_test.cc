// The Copier (memtype/copier.h) against the CUDA driver (label cuda): host (pageable) to device,
// device to host, device to device, managed, VMM-mapped memory and stream-ordered pool memory,
// every size class from 0 B to 64 MiB at odd offsets; asynchronous copies completed in submission
// order by progress() and by drain(); a thread that never had a context, and another context
// current (the caller's context state unchanged); a bad pointer returns the driver's error and
// calls no callback; setSyncMemops() makes CU_POINTER_ATTRIBUTE_SYNC_MEMOPS read back 1. Device
// bytes are only ever checked by copying them back to the host (a discrete GPU's memory is not
// CPU-accessible).
//
// Skipped with a reason where there is no driver or no GPU (see cuda_fixture.h for the fake), and
// where the driver lacks the copy, stream, event or context entry points.
#include "memtype/copier.h"

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/cuda/cuda_fixture.h"

namespace gmd::memtype::cudacheck {
namespace {

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<unsigned char>((i * 131 + (i >> 12) * 17 + seed * 7 + 1) & 0xff);
  }
  return v;
}

// Completion records; thread safety: callbacks run inside progress()/drain() on the test's thread.
struct Completions {
  std::vector<std::pair<int, int>> done;  // (tag, result), in completion order
  static void cb(void* arg, int result) {
    auto* t = static_cast<std::pair<Completions*, int>*>(arg);
    t->first->done.emplace_back(t->second, result);
  }
};

class Copier : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = whyNotRunnable();
    if (!why.empty()) GTEST_SKIP() << why;
    api_ = detail::driver();
    if (!api_->hasCopyApi()) {
      GTEST_SKIP() << "the driver lacks the copy, stream, event or context entry points"
                   << (fakeDriver() ? " (the fake does not implement them)" : "");
    }
    memAlloc_ = driverSymbol<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc_v2");
    memFree_ = driverSymbol<CUresult (*)(CUdeviceptr)>("cuMemFree_v2");
    memAllocManaged_ =
        driverSymbol<CUresult (*)(CUdeviceptr*, size_t, unsigned)>("cuMemAllocManaged");
    ASSERT_TRUE(memAlloc_ && memFree_ && memAllocManaged_);
    // The caller's state most programs have: device 0's primary context current.
    ASSERT_EQ(api_->devicePrimaryCtxRetain(&ctx0_, 0), 0);
    ASSERT_EQ(api_->ctxSetCurrent(ctx0_), 0);
    copier_ = gmd::memtype::Copier::create();
    ASSERT_NE(copier_, nullptr);
  }
  void TearDown() override {
    copier_.reset();
    for (CUdeviceptr p : allocs_) EXPECT_EQ(memFree_(p), CUDA_SUCCESS);
    if (ctx0_ != nullptr) api_->devicePrimaryCtxRelease(0);
  }
  void* device(std::size_t n) {
    CUdeviceptr p = 0;
    EXPECT_EQ(memAlloc_(&p, n), CUDA_SUCCESS);
    if (p != 0) allocs_.push_back(p);
    return reinterpret_cast<void*>(p);
  }
  void* managed(std::size_t n) {
    CUdeviceptr p = 0;
    EXPECT_EQ(memAllocManaged_(&p, n, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    if (p != 0) allocs_.push_back(p);
    return reinterpret_cast<void*>(p);
  }
  int attribute(CUdevice_attribute a) {
    int v = 0;
    return api_->deviceGetAttribute(&v, a, 0) == 0 ? v : 0;
  }
  void* current() {
    void* ctx = reinterpret_cast<void*>(1);
    EXPECT_EQ(api_->ctxGetCurrent(&ctx), 0);
    return ctx;
  }
  // host -> mem + off -> host through copy() (sync) or copyAsync() + drain() (async).
  void roundTrip(void* mem, std::size_t off, std::size_t n, unsigned seed, bool async) {
    const std::vector<unsigned char> in = pattern(n, seed);
    std::vector<unsigned char> out(n, 0);
    char* at = static_cast<char*>(mem) + off;
    if (async) {
      Completions c;
      std::pair<Completions*, int> t0{&c, 0}, t1{&c, 1};
      ASSERT_EQ(copier_->copyAsync(at, in.data(), n, &Completions::cb, &t0), 0) << n;
      ASSERT_EQ(copier_->copyAsync(out.data(), at, n, &Completions::cb, &t1), 0) << n;
      copier_->drain();
      ASSERT_EQ(c.done.size(), 2u);
      EXPECT_EQ(c.done[0], std::make_pair(0, 0));
      EXPECT_EQ(c.done[1], std::make_pair(1, 0));
    } else {
      ASSERT_EQ(copier_->copy(at, in.data(), n), 0) << n << " bytes at +" << off;
      ASSERT_EQ(copier_->copy(out.data(), at, n), 0) << n << " bytes at +" << off;
    }
    EXPECT_TRUE(std::memcmp(in.data(), out.data(), n) == 0) << n << " bytes at +" << off;
  }
  static std::vector<std::size_t> sizes() {
    return {1, 7, 8, 4097, 65536 + 3, kMiB + 1, 8 * kMiB, 64 * kMiB};
  }

  const detail::DriverApi* api_ = nullptr;
  void* ctx0_ = nullptr;  // device 0's primary context
  std::unique_ptr<gmd::memtype::Copier> copier_;
  std::vector<CUdeviceptr> allocs_;
  CUresult (*memAlloc_)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*memFree_)(CUdeviceptr) = nullptr;
  CUresult (*memAllocManaged_)(CUdeviceptr*, size_t, unsigned) = nullptr;
};

TEST_F(Copier, HostDeviceHostEverySizeSyncAndAsync) {
  void* d = device(64 * kMiB + 64);
  ASSERT_NE(d, nullptr);
  for (std::size_t n : sizes()) {
    for (bool async : {false, true})
      roundTrip(d, n % 2 ? 13 : 0, n, static_cast<unsigned>(n), async);
  }
  EXPECT_EQ(copier_->copy(d, nullptr, 0), 0) << "0 bytes";
}

TEST_F(Copier, DeviceToDeviceEverySize) {
  void* a = device(64 * kMiB + 64);
  void* b = device(64 * kMiB + 64);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  for (std::size_t n : sizes()) {
    const std::vector<unsigned char> in = pattern(n, 3);
    std::vector<unsigned char> out(n, 0);
    ASSERT_EQ(copier_->copy(static_cast<char*>(a) + 5, in.data(), n), 0);
    ASSERT_EQ(copier_->copy(static_cast<char*>(b) + 1, static_cast<char*>(a) + 5, n), 0);
    ASSERT_EQ(copier_->copy(out.data(), static_cast<char*>(b) + 1, n), 0);
    EXPECT_TRUE(in == out) << n;
  }
}

TEST_F(Copier, ManagedMemory) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == 0) GTEST_SKIP() << "no managed memory";
  void* m = managed(8 * kMiB + 64);
  void* d = device(8 * kMiB);
  ASSERT_TRUE(m != nullptr && d != nullptr);
  roundTrip(m, 3, 8 * kMiB, 1, false);
  roundTrip(m, 0, kMiB + 1, 2, true);
  const std::vector<unsigned char> in = pattern(kMiB, 9);
  std::vector<unsigned char> out(kMiB, 0);
  ASSERT_EQ(copier_->copy(m, in.data(), kMiB), 0);
  ASSERT_EQ(copier_->copy(d, m, kMiB), 0);
  ASSERT_EQ(copier_->copy(out.data(), d, kMiB), 0);
  EXPECT_TRUE(in == out);
}

TEST_F(Copier, StreamOrderedPoolMemory) {
  if (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) GTEST_SKIP() << "no memory pools";
  auto alloc = driverSymbol<CUresult (*)(CUdeviceptr*, size_t, CUstream)>("cuMemAllocAsync");
  auto free_async = driverSymbol<CUresult (*)(CUdeviceptr, CUstream)>("cuMemFreeAsync");
  ASSERT_TRUE(alloc && free_async);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 4 * kMiB, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(api_->streamSynchronize(nullptr), 0);
  roundTrip(reinterpret_cast<void*>(p), 1, 4 * kMiB - 1, 5, false);
  roundTrip(reinterpret_cast<void*>(p), 0, 4 * kMiB, 6, true);
  EXPECT_EQ(free_async(p, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_->streamSynchronize(nullptr), 0);
}

TEST_F(Copier, VmmMappedMemory) {
  if (attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0) {
    GTEST_SKIP() << "no VMM API";
  }
  auto reserve =
      driverSymbol<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
          "cuMemAddressReserve");
  auto address_free = driverSymbol<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  auto create =
      driverSymbol<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                                unsigned long long)>("cuMemCreate");
  auto map = driverSymbol<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                       unsigned long long)>("cuMemMap");
  auto set_access = driverSymbol<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>(
      "cuMemSetAccess");
  auto unmap = driverSymbol<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  auto release = driverSymbol<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  auto granularity =
      driverSymbol<CUresult (*)(size_t*, const CUmemAllocationProp*,
                                CUmemAllocationGranularity_flags)>("cuMemGetAllocationGranularity");
  ASSERT_TRUE(reserve && address_free && create && map && set_access && unmap && release &&
              granularity);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  ASSERT_EQ(granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  const size_t size = ((4 * kMiB + gran - 1) / gran) * gran;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(reserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(create(&h, size, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(map(va, size, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(set_access(va, size, &access, 1), CUDA_SUCCESS);
  roundTrip(reinterpret_cast<void*>(va), 7, size - 7, 4, false);
  roundTrip(reinterpret_cast<void*>(va), 0, size, 5, true);
  EXPECT_EQ(unmap(va, size), CUDA_SUCCESS);
  EXPECT_EQ(release(h), CUDA_SUCCESS);
  EXPECT_EQ(address_free(va, size), CUDA_SUCCESS);
}

TEST_F(Copier, ProgressCompletesInSubmissionOrder) {
  constexpr int kCopies = 32;
  const std::size_t n = kMiB + 17;
  void* d = device(kCopies * n);
  ASSERT_NE(d, nullptr);
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
  EXPECT_TRUE(c.done.empty()) << "callbacks run only inside progress() or drain()";
  EXPECT_EQ(copier_->outstanding(), static_cast<std::size_t>(kCopies));
  unsigned total = 0;
  while (copier_->outstanding() != 0) {
    total += copier_->progress();
    ASSERT_EQ(copier_->outstanding() + total, static_cast<std::size_t>(kCopies));
  }
  EXPECT_EQ(total, static_cast<unsigned>(kCopies));
  ASSERT_EQ(c.done.size(), static_cast<std::size_t>(kCopies));
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(c.done[i], std::make_pair(i, 0)) << "completion " << i;
  }
  for (int i = 0; i < kCopies; i += 7) {
    std::vector<unsigned char> out(n, 0);
    ASSERT_EQ(copier_->copy(out.data(), static_cast<char*>(d) + i * n, n), 0);
    EXPECT_TRUE(out == in[i]) << "copy " << i;
  }
}

// A thread that never had a context: the Copier pushes the device's primary context around each
// call and leaves the thread without one.
TEST_F(Copier, FreshThreadWithoutAContext) {
  void* d = device(8 * kMiB);
  ASSERT_NE(d, nullptr);
  const std::vector<unsigned char> in = pattern(8 * kMiB, 12);
  std::vector<unsigned char> out(8 * kMiB, 0);
  void* before = reinterpret_cast<void*>(1);
  void* after = reinterpret_cast<void*>(1);
  int r[4] = {-1, -1, -1, -1};
  const bool fake = fakeDriver();
  std::thread th([&] {
    // The fake gives a new thread the current device's context (a real driver gives it none):
    // there, leave the thread without one first.
    if (fake) api_->ctxSetCurrent(nullptr);
    api_->ctxGetCurrent(&before);
    std::unique_ptr<gmd::memtype::Copier> own = gmd::memtype::Copier::create();
    if (own == nullptr) return;
    r[0] = own->copy(d, in.data(), in.size());
    api_->ctxGetCurrent(&after);
    if (after != nullptr) return;
    r[1] = own->copyAsync(out.data(), d, out.size(), nullptr, nullptr);
    while (own->outstanding() != 0) own->progress();
    r[2] = 0;
    r[3] = setSyncMemops(d);
    own.reset();
    api_->ctxGetCurrent(&after);
  });
  th.join();
  EXPECT_EQ(before, nullptr) << "a new thread starts without a context";
  EXPECT_EQ(r[0], 0);
  EXPECT_EQ(r[1], 0);
  EXPECT_EQ(r[2], 0);
  EXPECT_EQ(r[3], 0) << "setSyncMemops without a current context";
  EXPECT_EQ(after, nullptr) << "the Copier left a context current";
  EXPECT_TRUE(in == out);
  // This test's own thread, with its context popped off: no context either.
  void* popped = nullptr;
  ASSERT_EQ(api_->ctxPopCurrent(&popped), 0);
  EXPECT_EQ(current(), nullptr);
  roundTrip(d, 1, kMiB, 13, false);
  roundTrip(d, 2, kMiB, 14, true);
  EXPECT_EQ(current(), nullptr);
  ASSERT_EQ(api_->ctxSetCurrent(ctx0_), 0);
}

// Another context current (a second GPU's primary context, else a context of the test's own on
// device 0): every call leaves it current.
TEST_F(Copier, CallersContextIsUnchanged) {
  void* other = nullptr;
  bool own_ctx = false;
  if (Classifier::instance().deviceCount() > 1) {
    ASSERT_EQ(api_->devicePrimaryCtxRetain(&other, 1), 0);
  } else {
    auto ctx_create = driverSymbol<CUresult (*)(void**, unsigned, CUdevice)>("cuCtxCreate_v2");
    if (ctx_create == nullptr || fakeDriver()) {
      GTEST_SKIP() << "one GPU and no cuCtxCreate: no second context to be current";
    }
    ASSERT_EQ(ctx_create(&other, 0, 0), CUDA_SUCCESS);
    own_ctx = true;
    void* popped = nullptr;
    ASSERT_EQ(api_->ctxPopCurrent(&popped), 0);  // cuCtxCreate pushed it
  }
  void* d = device(kMiB);  // in device 0's primary context
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(api_->ctxSetCurrent(other), 0);
  const std::vector<unsigned char> in = pattern(kMiB, 15);
  std::vector<unsigned char> out(kMiB, 0);
  EXPECT_EQ(copier_->copy(d, in.data(), kMiB), 0);
  EXPECT_EQ(current(), other);
  EXPECT_EQ(copier_->copyAsync(out.data(), d, kMiB, nullptr, nullptr), 0);
  EXPECT_EQ(current(), other);
  while (copier_->outstanding() != 0) copier_->progress();
  EXPECT_EQ(current(), other);
  EXPECT_TRUE(in == out);
  ASSERT_EQ(api_->ctxSetCurrent(ctx0_), 0);
  if (own_ctx) {
    auto ctx_destroy = driverSymbol<CUresult (*)(void*)>("cuCtxDestroy_v2");
    if (ctx_destroy != nullptr) {
      EXPECT_EQ(ctx_destroy(other), CUDA_SUCCESS);
    }
  } else {
    api_->devicePrimaryCtxRelease(1);
  }
}

TEST_F(Copier, BadPointerReturnsTheDriverErrorAndCallsNoCallback) {
  void* d = device(64 * 1024);
  ASSERT_NE(d, nullptr);
  std::vector<unsigned char> big(4 * kMiB, 0);
  EXPECT_NE(copier_->copy(big.data(), d, big.size()), 0) << "4 MiB out of a 64 KiB allocation";
  EXPECT_NE(copier_->copy(nullptr, d, 4096), 0) << "to a null host pointer";
  Completions c;
  std::pair<Completions*, int> t{&c, 1};
  EXPECT_NE(copier_->copyAsync(big.data(), d, big.size(), &Completions::cb, &t), 0);
  EXPECT_NE(copier_->copyAsync(nullptr, d, 4096, &Completions::cb, &t), 0);
  EXPECT_EQ(copier_->outstanding(), 0u);
  copier_->drain();
  EXPECT_TRUE(c.done.empty());
  // Still usable afterwards.
  roundTrip(d, 0, 4096, 16, true);
}

TEST_F(Copier, SyncMemopsReadsBackOne) {
  if (api_->pointerSetAttribute == nullptr) GTEST_SKIP() << "no cuPointerSetAttribute";
  void* d = device(2 * kMiB);
  ASSERT_NE(d, nullptr);
  const auto at = reinterpret_cast<std::uintptr_t>(d);
  EXPECT_EQ(setSyncMemops(static_cast<char*>(d) + 4096), 0);
  unsigned v = 0;
  ASSERT_EQ(api_->pointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, at), 0);
  EXPECT_EQ(v, 1u);
  EXPECT_EQ(setSyncMemops(d), 0) << "idempotent";
}

}  // namespace
}  // namespace gmd::memtype::cudacheck
