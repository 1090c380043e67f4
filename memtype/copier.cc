// The Copier: cuMemcpyAsync on one stream per device (created in that device's primary context on
// first use), one event per asynchronous copy from a per-device pool, and a FIFO per stream that
// progress() completes in order with cuEventQuery.
//
// Contexts: every driver call that needs one (stream and event creation and destruction, copies,
// queries) runs with the device's primary context current: pushed when the calling thread has
// another context or none, popped after, so the caller's context state is unchanged on return.
#include "memtype/copier.h"

#include <cstring>
#include <deque>
#include <new>
#include <vector>

#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace gmd::memtype {

using detail::CuContext;
using detail::CuDevicePtr;
using detail::CuEvent;
using detail::CuResult;
using detail::CuStream;
using detail::DriverApi;
using detail::kCudaErrorInvalidValue;
using detail::kCudaErrorNotReady;
using detail::kCudaErrorOutOfMemory;
using detail::kCudaSuccess;
using detail::kLogModule;

namespace {

constexpr int kAttrDeviceOrdinal = 9;          // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kStreamNonBlocking = 0x1;   // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING
constexpr std::size_t kMaxIdleEvents = 64;     // per device; more are destroyed when they come back

CuDevicePtr devPtr(const void* p) noexcept { return reinterpret_cast<CuDevicePtr>(p); }

// Caller mistakes (a bad pointer or length) are the caller's to report; anything else is the
// device's or the driver's failure.
void logCopyError(const char* what, CuResult r, void* dst, const void* src,
                  std::size_t len) noexcept {
  const bool caller = r == kCudaErrorInvalidValue || r == 400 /* INVALID_HANDLE */ || r == 500;
  log(caller ? LogLevel::kDebug : LogLevel::kError, kLogModule,
      "%s(%p <- %p, %zu bytes) failed: CUDA error %d", what, dst, src, len, r);
}

// The device ordinal of a CUDA pointer per the driver, or -1.
int deviceOf(const DriverApi& api, const void* p) noexcept {
  int ordinal = -1;
  if (api.pointerGetAttribute(&ordinal, kAttrDeviceOrdinal, devPtr(p)) != kCudaSuccess) return -1;
  return ordinal;
}

// Makes `ctx` current for the scope when it is not already (push/pop), so that the caller's
// context state is the same afterwards. Thread safety: a scope object lives on one thread's stack
// (contexts are per-thread state).
class ScopedContext {
 public:
  ScopedContext(const DriverApi& api, CuContext ctx) noexcept : api_(api) {
    CuContext cur = nullptr;
    if (api.ctxGetCurrent(&cur) == kCudaSuccess && cur == ctx) return;
    result_ = api.ctxPushCurrent(ctx);
    pushed_ = result_ == kCudaSuccess;
  }
  ~ScopedContext() {
    if (!pushed_) return;
    CuContext popped = nullptr;
    api_.ctxPopCurrent(&popped);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  CuResult result() const noexcept { return result_; }

 private:
  const DriverApi& api_;
  CuResult result_ = kCudaSuccess;
  bool pushed_ = false;
};

}  // namespace

// Thread safety: none of its own; the Copier's contract (one thread at a time) covers it.
struct Copier::Impl {
  struct Pending {
    CuEvent event;  // nullptr: finished when queued (host copies, 0 bytes)
    CopyDone done;
    void* arg;
  };
  // One per device ordinal, created on first use of that device.
  struct Device {
    CuContext ctx = nullptr;  // its primary context, retained by this Copier
    bool retained = false;
    CuStream stream = nullptr;
    std::vector<CuEvent> idle_events;
    std::deque<Pending> fifo;
  };

  const DriverApi& api;
  std::vector<Device> devices;  // sized once in create(): callbacks never see it move
  std::deque<Pending> host_done;
  std::size_t outstanding = 0;

  explicit Impl(const DriverApi& a) : api(a) {}

  // The device's primary context and stream, created on first use.
  CuResult prepare(int ordinal) noexcept {
    Device& d = devices[static_cast<std::size_t>(ordinal)];
    if (d.stream != nullptr) return kCudaSuccess;
    if (!d.retained) {
      int dev = 0;
      CuResult r = api.deviceGet(&dev, ordinal);
      if (r == kCudaSuccess) r = api.devicePrimaryCtxRetain(&d.ctx, dev);
      if (r != kCudaSuccess) {
        log(LogLevel::kError, kLogModule, "copier: cannot retain device %d's primary context (%d)",
            ordinal, r);
        return r;
      }
      d.retained = true;
    }
    ScopedContext scope(api, d.ctx);
    if (scope.result() != kCudaSuccess) {
      log(LogLevel::kError, kLogModule, "copier: cannot make device %d's context current (%d)",
          ordinal, scope.result());
      return scope.result();
    }
    const CuResult r = api.streamCreate(&d.stream, kStreamNonBlocking);
    if (r != kCudaSuccess) {
      d.stream = nullptr;
      log(LogLevel::kError, kLogModule, "copier: cannot create a stream on device %d (%d)", ordinal,
          r);
    }
    return r;
  }

  // Which device's stream carries a copy: the device side's (dst first), -1 for host to host.
  int deviceFor(void* dst, const void* src, std::size_t len, CuResult* err) noexcept {
    Classifier& c = Classifier::instance();
    const Info di = c.classify(dst, len);
    const Info si = c.classify(src, len);
    const Info* dev = di.type != MemType::kHost ? &di : si.type != MemType::kHost ? &si : nullptr;
    if (dev == nullptr) return -1;
    int ordinal = dev->device;
    if (ordinal < 0) ordinal = deviceOf(api, dev == &di ? static_cast<const void*>(dst) : src);
    if (ordinal < 0 || static_cast<std::size_t>(ordinal) >= devices.size()) {
      *err = kCudaErrorInvalidValue;
      log(LogLevel::kDebug, kLogModule, "copier: no device for %p <- %p", dst, src);
      return -2;
    }
    return ordinal;
  }

  CuEvent takeEvent(Device& d, CuResult* err) noexcept {
    if (!d.idle_events.empty()) {
      CuEvent e = d.idle_events.back();
      d.idle_events.pop_back();
      return e;
    }
    CuEvent e = nullptr;
    *err = api.eventCreate(&e, kEventDisableTiming);
    if (*err != kCudaSuccess) {
      log(LogLevel::kError, kLogModule, "copier: cannot create an event (%d)", *err);
      return nullptr;
    }
    return e;
  }

  // Caller has the device's context current.
  void giveEvent(Device& d, CuEvent e) noexcept {
    if (d.idle_events.size() < kMaxIdleEvents) {
      try {
        d.idle_events.push_back(e);
        return;
      } catch (...) {
      }
    }
    api.eventDestroy(e);
  }

  // Completes finished copies at the head of one FIFO; blocks on each when `wait`.
  unsigned complete(Device* d, std::deque<Pending>& fifo, bool wait) noexcept {
    unsigned n = 0;
    while (!fifo.empty()) {
      Pending p = fifo.front();
      CuResult r = kCudaSuccess;
      if (p.event != nullptr) {
        // The device's context only around the driver calls: callbacks see the caller's.
        ScopedContext scope(api, d->ctx);
        r = wait ? api.eventSynchronize(p.event) : api.eventQuery(p.event);
        if (r == kCudaErrorNotReady) break;
        if (r != kCudaSuccess) {
          log(LogLevel::kError, kLogModule, "copier: asynchronous copy failed: CUDA error %d", r);
        }
        giveEvent(*d, p.event);
      }
      fifo.pop_front();
      --outstanding;
      ++n;
      // May queue more copies (into this FIFO too): nothing above is held across the call.
      if (p.done != nullptr) p.done(p.arg, r);
    }
    return n;
  }

  void destroy(Device& d, int ordinal) noexcept {
    if (d.retained) {
      {
        ScopedContext scope(api, d.ctx);
        for (CuEvent e : d.idle_events) api.eventDestroy(e);
        if (d.stream != nullptr) api.streamDestroy(d.stream);
      }
      int dev = 0;
      if (api.deviceGet(&dev, ordinal) == kCudaSuccess) api.devicePrimaryCtxRelease(dev);
    }
    d = Device{};
  }
};

std::unique_ptr<Copier> Copier::create() noexcept {
  if (!Classifier::instance().cudaAvailable()) {
    log(LogLevel::kDebug, kLogModule, "copier: no CUDA driver or device");
    return nullptr;
  }
  const DriverApi* api = detail::driver();
  if (api == nullptr) return nullptr;
  if (!api->hasCopyApi()) {
    static bool warned = false;  // once per process (create() runs per iface)
    if (!warned) {
      warned = true;
      log(LogLevel::kWarn, kLogModule,
          "CUDA driver version %d lacks the copy, stream, event or context entry points: no "
          "host/device copies",
          api->version);
    }
    return nullptr;
  }
  try {
    auto impl = std::make_unique<Impl>(*api);
    impl->devices.resize(static_cast<std::size_t>(api->device_count));
    return std::unique_ptr<Copier>(new Copier(std::move(impl)));
  } catch (...) {
    log(LogLevel::kError, kLogModule, "copier: out of memory");
    return nullptr;
  }
}

Copier::Copier(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Copier::~Copier() {
  drain();
  for (std::size_t i = 0; i < impl_->devices.size(); ++i) {
    impl_->destroy(impl_->devices[i], static_cast<int>(i));
  }
}

int Copier::copy(void* dst, const void* src, std::size_t len) noexcept {
  if (len == 0) return kCudaSuccess;
  Impl& m = *impl_;
  CuResult r = kCudaSuccess;
  const int ordinal = m.deviceFor(dst, src, len, &r);
  if (ordinal == -1) {
    std::memcpy(dst, src, len);
    return kCudaSuccess;
  }
  if (ordinal < 0) return r;
  if ((r = m.prepare(ordinal)) != kCudaSuccess) return r;
  Impl::Device& d = m.devices[static_cast<std::size_t>(ordinal)];
  ScopedContext scope(m.api, d.ctx);
  if (scope.result() != kCudaSuccess) return scope.result();
  r = m.api.memCopyAsync(devPtr(dst), devPtr(src), len, d.stream);
  if (r != kCudaSuccess) {
    logCopyError("cuMemcpyAsync", r, dst, src, len);
    return r;
  }
  r = m.api.streamSynchronize(d.stream);
  if (r != kCudaSuccess) logCopyError("cuStreamSynchronize after cuMemcpyAsync", r, dst, src, len);
  return r;
}

int Copier::copyAsync(void* dst, const void* src, std::size_t len, CopyDone done,
                      void* arg) noexcept {
  Impl& m = *impl_;
  CuResult r = kCudaSuccess;
  const int ordinal = len == 0 ? -1 : m.deviceFor(dst, src, len, &r);
  if (ordinal == -1) {
    // Host to host (or nothing): done now, completed by the next progress() like any other.
    try {
      m.host_done.push_back({nullptr, done, arg});
    } catch (...) {
      log(LogLevel::kError, kLogModule, "copier: out of memory queueing a copy");
      return kCudaErrorOutOfMemory;
    }
    if (len != 0) std::memcpy(dst, src, len);
    ++m.outstanding;
    return kCudaSuccess;
  }
  if (ordinal < 0) return r;
  if ((r = m.prepare(ordinal)) != kCudaSuccess) return r;
  Impl::Device& d = m.devices[static_cast<std::size_t>(ordinal)];
  ScopedContext scope(m.api, d.ctx);
  if (scope.result() != kCudaSuccess) return scope.result();
  CuEvent ev = m.takeEvent(d, &r);
  if (ev == nullptr) return r;
  try {
    d.fifo.push_back({ev, done, arg});
  } catch (...) {
    m.giveEvent(d, ev);
    log(LogLevel::kError, kLogModule, "copier: out of memory queueing a copy");
    return kCudaErrorOutOfMemory;
  }
  r = m.api.memCopyAsync(devPtr(dst), devPtr(src), len, d.stream);
  if (r != kCudaSuccess) {
    logCopyError("cuMemcpyAsync", r, dst, src, len);
  } else if ((r = m.api.eventRecord(ev, d.stream)) != kCudaSuccess) {
    // The copy is queued but cannot be tracked: wait for it, and report the failure.
    log(LogLevel::kError, kLogModule, "copier: cuEventRecord failed (%d)", r);
    m.api.streamSynchronize(d.stream);
  }
  if (r != kCudaSuccess) {
    d.fifo.pop_back();
    m.giveEvent(d, ev);
    return r;
  }
  ++m.outstanding;
  return kCudaSuccess;
}

unsigned Copier::progress() noexcept {
  Impl& m = *impl_;
  if (m.outstanding == 0) return 0;
  unsigned n = m.complete(nullptr, m.host_done, false);
  for (Impl::Device& d : m.devices) {
    if (!d.fifo.empty()) n += m.complete(&d, d.fifo, false);
  }
  return n;
}

std::size_t Copier::outstanding() const noexcept { return impl_->outstanding; }

void Copier::drain() noexcept {
  Impl& m = *impl_;
  // Callbacks may queue more: until nothing is left.
  while (m.outstanding != 0) {
    m.complete(nullptr, m.host_done, true);
    for (Impl::Device& d : m.devices) {
      if (!d.fifo.empty()) m.complete(&d, d.fifo, true);
    }
  }
}

}  // namespace gmd::memtype
