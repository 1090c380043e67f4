// Shared by the cuda-label tests (gtest/cuda/): which driver got loaded and whether the tests may
// run on it, the driver's entry points looked up the way an application does (after gmd installed
// its hooks, so they come back hooked), the driver's own answer for an address (the oracle
// classify() is checked against), and a free recorder that asks the driver, from inside the
// notification, whether the freed memory is still allocated (the hooks must report a free before
// the memory can be reused).
//
// These tests are written for the real driver. gtest/cuda/run-on-gpu --fake runs them against the
// test driver (gtest/memtype/fake_cuda) with GMD_CUDA_TEST_FAKE=1, to check the tests and the
// script themselves; without that variable a fake driver makes them skip.
//
// Thread safety: the fixture is used from the test's thread; LiveFreeRecorder's and
// AllocEventRecorder's callbacks may run on any thread (each takes its own mutex).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "gtest/cuda/driver_truth.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace gmd::memtype::cudacheck {

constexpr std::size_t kMiB = std::size_t{1} << 20;

inline bool fakeAllowed() {
  const char* v = std::getenv("GMD_CUDA_TEST_FAKE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Empty when the cuda tests can run in this process, else why not (the skip reason).
inline std::string whyNotRunnable() {
  if (!Classifier::instance().cudaAvailable()) return "no CUDA driver or no GPU on this machine";
  if (detail::driver()->is_fake && !fakeAllowed()) {
    return "the fake test driver was loaded (LD_LIBRARY_PATH or GMD_CUDA_DRIVER_PATH); the cuda "
           "label needs the real libcuda.so.1 (gtest/cuda/run-on-gpu --fake sets "
           "GMD_CUDA_TEST_FAKE=1)";
  }
  return {};
}

inline bool fakeDriver() {
  const detail::DriverApi* api = detail::driver();
  return api != nullptr && api->is_fake;
}

// classify() must agree with the driver: type, base, size, device ordinal and buffer ID.
inline void expectMatchesDriver(const Info& info, std::uintptr_t address) {
  const Truth t = truth(address);
  if (!t.device) {
    EXPECT_EQ(info.type, MemType::kHost) << std::hex << address;
    return;
  }
  EXPECT_EQ(info.type, t.managed ? MemType::kCudaManaged : MemType::kCuda) << std::hex << address;
  EXPECT_EQ(info.base, t.base) << std::hex << address;
  EXPECT_EQ(info.size, t.size) << std::hex << address;
  EXPECT_EQ(info.device, t.device_ordinal) << std::hex << address;
  EXPECT_EQ(info.buffer_id, t.buffer_id) << std::hex << address;
}

inline Info classify(std::uintptr_t address) {
  return Classifier::instance().classify(reinterpret_cast<const void*>(address), 1);
}

// An allocation [p, p + size) on `device`, classified at `at`: its type, a range that is the
// allocation itself (exact) or covers it (pool allocations may be carved from a larger range), the
// device, and agreement with the driver.
inline void expectAllocation(std::uintptr_t at, std::uintptr_t p, std::size_t size, int device,
                             bool exact, MemType type = MemType::kCuda) {
  const Info info = classify(at);
  EXPECT_EQ(info.type, type);
  if (exact) {
    EXPECT_EQ(info.base, p);
  } else {
    EXPECT_LE(info.base, p);
  }
  EXPECT_GE(info.base + info.size, p + size);
  EXPECT_EQ(info.device, device);
  EXPECT_NE(info.buffer_id, 0u);
  expectMatchesDriver(info, at);
}

// Records each free notification with the buffer ID the driver reported for its start at that
// moment: non-zero means the memory was still allocated when gmd reported the free.
class LiveFreeRecorder {
 public:
  struct Event {
    std::uintptr_t start;
    std::size_t length;
    std::uint64_t live_buffer_id;
  };
  LiveFreeRecorder() { ok_ = Classifier::instance().subscribe(&LiveFreeRecorder::onFree, this); }
  ~LiveFreeRecorder() { Classifier::instance().unsubscribe(&LiveFreeRecorder::onFree, this); }
  LiveFreeRecorder(const LiveFreeRecorder&) = delete;
  LiveFreeRecorder& operator=(const LiveFreeRecorder&) = delete;

  bool subscribed() const { return ok_; }
  std::size_t count(std::uintptr_t start, std::size_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t c = 0;
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) {
      c += events_[i].start == start && events_[i].length == length;
    }
    return c;
  }
  std::size_t count(std::uintptr_t start) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t c = 0;
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) c += events_[i].start == start;
    return c;
  }
  // The buffer ID the driver still reported for `start` when its (first) free was reported; 0 when
  // the memory was already gone or no free of `start` was reported.
  std::uint64_t liveIdAtFree(std::uintptr_t start) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) {
      if (events_[i].start == start) return events_[i].live_buffer_id;
    }
    return 0;
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }

 private:
  static void onFree(void* arg, std::uintptr_t start, std::size_t length) {
    auto* self = static_cast<LiveFreeRecorder*>(arg);
    unsigned long long id = 0;
    // The raw driver (gmd's table), not the Classifier: subscribers must not call back into it.
    if (detail::driver()->pointerGetAttribute(&id, 7 /* BUFFER_ID */, start) != 0) id = 0;
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->n_ < self->events_.size()) self->events_[self->n_] = {start, length, id};
    ++self->n_;
  }
  std::mutex mu_;
  std::array<Event, 1024> events_{};
  std::size_t n_ = 0;
  bool ok_ = false;
};

// Records allocation events (memtype's allocation hooks), each with the buffer ID the driver
// reported for its start from inside the callback: non-zero means the allocation was live when
// reported.
class AllocEventRecorder {
 public:
  struct Event {
    AllocEvent event;
    std::uint64_t live_buffer_id;
  };
  AllocEventRecorder() {
    ok_ = Classifier::instance().subscribeAllocations(&AllocEventRecorder::onAlloc, this);
  }
  ~AllocEventRecorder() {
    if (ok_) Classifier::instance().unsubscribeAllocations(&AllocEventRecorder::onAlloc, this);
  }
  AllocEventRecorder(const AllocEventRecorder&) = delete;
  AllocEventRecorder& operator=(const AllocEventRecorder&) = delete;

  bool subscribed() const { return ok_; }
  std::size_t count(std::uintptr_t start) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t c = 0;
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) c += events_[i].event.start == start;
    return c;
  }
  // The first event for start ({} when none).
  Event first(std::uintptr_t start) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) {
      if (events_[i].event.start == start) return events_[i];
    }
    return {};
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }

 private:
  static void onAlloc(void* arg, const AllocEvent& event) {
    auto* self = static_cast<AllocEventRecorder*>(arg);
    unsigned long long id = 0;
    if (detail::driver()->pointerGetAttribute(&id, 7 /* BUFFER_ID */, event.start) != 0) id = 0;
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->n_ < self->events_.size()) self->events_[self->n_] = {event, id};
    ++self->n_;
  }
  std::mutex mu_;
  std::array<Event, 1024> events_{};
  std::size_t n_ = 0;
  bool ok_ = false;
};

// The one event for an allocation at p: exact start and length, type, device, reported while live,
// and agreeing with what classify() answers afterwards.
inline void expectAllocEvent(AllocEventRecorder& rec, std::uintptr_t p, std::size_t length,
                             MemType type, int device) {
  ASSERT_NE(p, 0u);
  EXPECT_EQ(rec.count(p), 1u) << "one event per allocation, not one per layer";
  const AllocEventRecorder::Event e = rec.first(p);
  EXPECT_EQ(e.event.start, p);
  EXPECT_EQ(e.event.length, length);
  EXPECT_EQ(e.event.type, type);
  EXPECT_EQ(e.event.device, device);
  EXPECT_NE(e.live_buffer_id, 0u) << "reported before the driver had the allocation";
  const Info info = classify(p);
  EXPECT_EQ(info.type, type);
  EXPECT_EQ(info.buffer_id, e.live_buffer_id);
}

// Allocates with `alloc` (returns 0 on failure) until the driver hands back `want` again: at most
// 8 tries, the misses are freed with `release` before returning. 0 when the address did not come
// back.
template <typename Alloc, typename Release>
std::uintptr_t allocateAt(std::uintptr_t want, Alloc alloc, Release release) {
  std::array<std::uintptr_t, 8> misses{};
  std::size_t n = 0;
  std::uintptr_t got = 0;
  for (; n < misses.size(); ++n) {
    const std::uintptr_t p = alloc();
    if (p == 0 || p == want) {
      got = p;
      break;
    }
    misses[n] = p;
  }
  for (std::size_t i = 0; i < n && i < misses.size(); ++i) release(misses[i]);
  return got;
}

// The check after a free: the address came back from the driver, and classify() answers the new
// allocation (new buffer ID), not the freed one still in a cache. A real driver that did not hand
// the address back makes the test skip (the free was still checked: reported while the memory was
// allocated); the fake always does, so there it is a failure.
inline void expectReuseClassifiedAfresh(std::uintptr_t address, std::uint64_t old_buffer_id,
                                        MemType type) {
  if (address == 0) {
    if (fakeDriver()) {
      ADD_FAILURE() << "the fake driver did not hand the freed address back";
      return;
    }
    GTEST_SKIP() << "the driver did not hand the freed address back in 8 allocations (the "
                    "re-use half of this check did not run)";
  }
  const Info again = classify(address);
  EXPECT_EQ(again.type, type);
  EXPECT_NE(again.buffer_id, old_buffer_id) << "classify() answered the freed allocation";
  expectMatchesDriver(again, address);
}

// One free path, checked end to end: allocate with alloc() (returns 0 on failure), classify, free
// with release(p) (returns true on success); the free must be reported once, while the driver still
// had the memory; then the same address is allocated again and must be classified afresh. sync()
// runs after each allocation and free (a stream synchronisation for stream-ordered paths).
template <typename Alloc, typename Release, typename Sync>
void checkFreeSeenBeforeReuse(LiveFreeRecorder& rec, MemType type, Alloc alloc, Release release,
                              Sync sync) {
  const std::uintptr_t p = alloc();
  ASSERT_NE(p, 0u);
  sync();
  const Info before = classify(p);
  ASSERT_EQ(before.type, type);
  expectMatchesDriver(before, p);
  ASSERT_TRUE(release(p));
  EXPECT_EQ(rec.count(before.base, before.size), 1u) << "seen once, not once per layer";
  EXPECT_EQ(rec.liveIdAtFree(before.base), before.buffer_id) << "reported after the free ran";
  sync();
  const std::uintptr_t q = allocateAt(p, alloc, release);
  sync();
  expectReuseClassifiedAfresh(q, before.buffer_id, type);
  if (q != 0) {
    EXPECT_TRUE(release(q));
  }
  sync();
}

// Looks an entry point up in the loaded driver (after gmd's hooks: the answer is hooked where gmd
// hooks it).
template <typename F>
F driverSymbol(const char* name) {
  return reinterpret_cast<F>(dlsym(detail::driver()->handle, name));
}

}  // namespace gmd::memtype::cudacheck
