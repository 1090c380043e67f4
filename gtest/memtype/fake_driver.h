// Test helpers for memtype/: the fake driver's entry points (looked up the way a program would, so
// that they come back hooked once gmd is installed) and recorders of free and allocation
// notifications. Thread safety: the recorders' callbacks may run on any thread (each takes its own
// mutex); everything else is used from the test's thread.
#pragma once

#include <dlfcn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "gtest/common/log_capture.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace gmd::memtype::test {

struct FakeDriver {
  void* handle = nullptr;
  int (*memAlloc)(std::uint64_t*, std::size_t) = nullptr;
  int (*memAllocV1)(unsigned*, unsigned) = nullptr;
  int (*memFree)(std::uint64_t) = nullptr;
  int (*memAllocManaged)(std::uint64_t*, std::size_t, unsigned) = nullptr;
  int (*memAllocAsync)(std::uint64_t*, std::size_t, void*) = nullptr;
  int (*memAllocAsyncPtsz)(std::uint64_t*, std::size_t, void*) = nullptr;
  int (*memFreeAsync)(std::uint64_t, void*) = nullptr;
  int (*addressReserve)(std::uint64_t*, std::size_t, std::size_t, std::uint64_t,
                        unsigned long long) = nullptr;
  int (*addressFree)(std::uint64_t, std::size_t) = nullptr;
  int (*memCreate)(std::uint64_t*, std::size_t, const void*, unsigned long long) = nullptr;
  int (*memMap)(std::uint64_t, std::size_t, std::size_t, std::uint64_t,
                unsigned long long) = nullptr;
  int (*memUnmap)(std::uint64_t, std::size_t) = nullptr;
  int (*memRelease)(std::uint64_t) = nullptr;
  int (*getProcAddress)(const char*, void**, int, std::uint64_t, int*) = nullptr;
  // Copies, streams, events, contexts, pointer attributes (CUstream, CUevent, CUcontext: void*).
  int (*init)(unsigned) = nullptr;
  int (*memcpy)(std::uint64_t, std::uint64_t, std::size_t) = nullptr;
  int (*memcpyAsync)(std::uint64_t, std::uint64_t, std::size_t, void*) = nullptr;
  int (*memcpyHtoD)(std::uint64_t, const void*, std::size_t) = nullptr;
  int (*memcpyDtoH)(void*, std::uint64_t, std::size_t) = nullptr;
  int (*memcpyDtoD)(std::uint64_t, std::uint64_t, std::size_t) = nullptr;
  int (*memcpyHtoDAsync)(std::uint64_t, const void*, std::size_t, void*) = nullptr;
  int (*memcpyDtoHAsync)(void*, std::uint64_t, std::size_t, void*) = nullptr;
  int (*memcpyDtoDAsync)(std::uint64_t, std::uint64_t, std::size_t, void*) = nullptr;
  int (*memsetD8)(std::uint64_t, unsigned char, std::size_t) = nullptr;
  int (*streamCreate)(void**, unsigned) = nullptr;
  int (*streamDestroy)(void*) = nullptr;
  int (*streamSynchronize)(void*) = nullptr;
  int (*streamQuery)(void*) = nullptr;
  int (*eventCreate)(void**, unsigned) = nullptr;
  int (*eventRecord)(void*, void*) = nullptr;
  int (*eventQuery)(void*) = nullptr;
  int (*eventSynchronize)(void*) = nullptr;
  int (*eventDestroy)(void*) = nullptr;
  int (*primaryCtxRetain)(void**, int) = nullptr;
  int (*ctxSetCurrent)(void*) = nullptr;
  int (*ctxGetCurrent)(void**) = nullptr;
  int (*ctxPushCurrent)(void*) = nullptr;
  int (*ctxPopCurrent)(void**) = nullptr;
  int (*ctxGetDevice)(int*) = nullptr;
  int (*pointerGetAttribute)(void*, int, std::uint64_t) = nullptr;
  int (*pointerGetAttributes)(unsigned, int*, void**, std::uint64_t) = nullptr;
  int (*pointerSetAttribute)(const void*, int, std::uint64_t) = nullptr;
  void (*set)(const char*, long) = nullptr;
  long (*get)(const char*) = nullptr;

  // Loads libcuda.so.1 (the fake, via LD_LIBRARY_PATH or GMD_CUDA_DRIVER_PATH). False if absent or
  // not the fake.
  bool load() {
    const char* path = std::getenv("GMD_CUDA_DRIVER_PATH");
    handle = dlopen(path != nullptr && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW);
    if (handle == nullptr || dlsym(handle, "gmd_fake_cuda_driver") == nullptr) return false;
    sym(memAlloc, "cuMemAlloc_v2");
    sym(memAllocV1, "cuMemAlloc");
    sym(memFree, "cuMemFree_v2");
    sym(memAllocManaged, "cuMemAllocManaged");
    sym(memAllocAsync, "cuMemAllocAsync");
    sym(memAllocAsyncPtsz, "cuMemAllocAsync_ptsz");
    sym(memFreeAsync, "cuMemFreeAsync");
    sym(addressReserve, "cuMemAddressReserve");
    sym(addressFree, "cuMemAddressFree");
    sym(memCreate, "cuMemCreate");
    sym(memMap, "cuMemMap");
    sym(memUnmap, "cuMemUnmap");
    sym(memRelease, "cuMemRelease");
    sym(getProcAddress, "cuGetProcAddress_v2");
    sym(init, "cuInit");
    sym(memcpy, "cuMemcpy");
    sym(memcpyAsync, "cuMemcpyAsync");
    sym(memcpyHtoD, "cuMemcpyHtoD_v2");
    sym(memcpyDtoH, "cuMemcpyDtoH_v2");
    sym(memcpyDtoD, "cuMemcpyDtoD_v2");
    sym(memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    sym(memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    sym(memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    sym(memsetD8, "cuMemsetD8_v2");
    sym(streamCreate, "cuStreamCreate");
    sym(streamDestroy, "cuStreamDestroy_v2");
    sym(streamSynchronize, "cuStreamSynchronize");
    sym(streamQuery, "cuStreamQuery");
    sym(eventCreate, "cuEventCreate");
    sym(eventRecord, "cuEventRecord");
    sym(eventQuery, "cuEventQuery");
    sym(eventSynchronize, "cuEventSynchronize");
    sym(eventDestroy, "cuEventDestroy_v2");
    sym(primaryCtxRetain, "cuDevicePrimaryCtxRetain");
    sym(ctxSetCurrent, "cuCtxSetCurrent");
    sym(ctxGetCurrent, "cuCtxGetCurrent");
    sym(ctxPushCurrent, "cuCtxPushCurrent_v2");
    sym(ctxPopCurrent, "cuCtxPopCurrent_v2");
    sym(ctxGetDevice, "cuCtxGetDevice");
    sym(pointerGetAttribute, "cuPointerGetAttribute");
    sym(pointerGetAttributes, "cuPointerGetAttributes");
    sym(pointerSetAttribute, "cuPointerSetAttribute");
    sym(set, "gmd_fake_cuda_set");
    sym(get, "gmd_fake_cuda_get");
    return true;
  }
  template <typename F>
  void sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(handle, name));
  }
  std::uint64_t alloc(std::size_t size) {
    std::uint64_t p = 0;
    return memAlloc(&p, size) == 0 ? p : 0;
  }
};

// Records free notifications in a fixed array (subscribers must not allocate).
class FreeRecorder {
 public:
  FreeRecorder() { ok_ = Classifier::instance().subscribe(&FreeRecorder::onFree, this); }
  ~FreeRecorder() { Classifier::instance().unsubscribe(&FreeRecorder::onFree, this); }
  FreeRecorder(const FreeRecorder&) = delete;
  FreeRecorder& operator=(const FreeRecorder&) = delete;

  bool subscribed() const { return ok_; }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }
  std::size_t count(std::uintptr_t start, std::size_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t c = 0;
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) {
      c += events_[i].first == start && events_[i].second == length;
    }
    return c;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    n_ = 0;
  }

 private:
  static void onFree(void* arg, std::uintptr_t start, std::size_t length) {
    auto* self = static_cast<FreeRecorder*>(arg);
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->n_ < self->events_.size()) self->events_[self->n_] = {start, length};
    ++self->n_;
  }
  std::mutex mu_;
  std::array<std::pair<std::uintptr_t, std::size_t>, 4096> events_{};
  std::size_t n_ = 0;
  bool ok_ = false;
};

// Records allocation events in a fixed array (subscribers must not allocate), each with whether the
// driver already knew the range when the event arrived (asked through gmd's own driver table: a
// subscriber must not call back into the Classifier).
class AllocRecorder {
 public:
  struct Event {
    AllocEvent event;
    bool live;  // the driver answered a buffer ID for event.start from inside the callback
  };
  AllocRecorder() { ok_ = Classifier::instance().subscribeAllocations(&AllocRecorder::onAlloc, this); }
  ~AllocRecorder() { unsubscribe(); }
  AllocRecorder(const AllocRecorder&) = delete;
  AllocRecorder& operator=(const AllocRecorder&) = delete;

  bool subscribed() const { return ok_; }
  void unsubscribe() {
    if (ok_) Classifier::instance().unsubscribeAllocations(&AllocRecorder::onAlloc, this);
    ok_ = false;
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }
  std::size_t count(std::uintptr_t start) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t c = 0;
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) c += events_[i].event.start == start;
    return c;
  }
  // The first event for start (a default one with start 0 when none).
  Event first(std::uintptr_t start) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < n_ && i < events_.size(); ++i) {
      if (events_[i].event.start == start) return events_[i];
    }
    return {};
  }

 private:
  static void onAlloc(void* arg, const AllocEvent& event) {
    auto* self = static_cast<AllocRecorder*>(arg);
    unsigned long long id = 0;
    const bool live = detail::driver()->pointerGetAttribute(&id, 7 /* BUFFER_ID */, event.start) == 0 &&
                      id != 0;
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->n_ < self->events_.size()) self->events_[self->n_] = {event, live};
    ++self->n_;
  }
  std::mutex mu_;
  std::array<Event, 1024> events_{};
  std::size_t n_ = 0;
  bool ok_ = false;
};

// Captures memtype's log lines at or above a level.
using gmd::test::LogCapture;

}  // namespace gmd::memtype::test
