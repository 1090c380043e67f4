// Copies between host and CUDA memory through the driver memtype/ loads at run time. UCX-free: the
// engine under md/copy/ (the gmd_copy transport), usable and tested without UCX.
//
// Either side of a copy may be host (pageable or not), CUDA device or CUDA managed memory; the
// driver's unified addressing decides the direction. Copies run on streams of the Copier's own (one
// per device, created in that device's primary context on first use), so they are unordered with
// the application's streams, as UCX's own cuda_copy transport is. When the calling thread has no
// current context, the device's primary context is retained and pushed around each call and popped
// after it: the caller's context state is the same on return.
//
// Thread safety: one Copier is used by one thread at a time (a UCT iface is driven by its worker's
// thread); distinct Copiers are independent. Done callbacks run inside progress() or drain(), on the
// calling thread.
#pragma once

#include <cstddef>
#include <memory>

namespace gmd::memtype {

// Called once per asynchronous copy, from progress() or drain(): cu_result is 0 (CUDA_SUCCESS) when
// the bytes are in place, else the driver's error.
using CopyDone = void (*)(void* arg, int cu_result);

class Copier {
 public:
  // A Copier, or nullptr when there is no driver or no device (logged at debug level) or the
  // driver lacks the copy, stream or event entry points (logged once at warn level).
  static std::unique_ptr<Copier> create() noexcept;
  ~Copier();
  Copier(const Copier&) = delete;
  Copier& operator=(const Copier&) = delete;

  // Copies len bytes and returns once they are in place: 0, or the driver's error (CUresult).
  // len 0 is a no-op returning 0.
  int copy(void* dst, const void* src, std::size_t len) noexcept;

  // Queues a copy of len bytes. Returns 0 when queued (done(arg, result) is called later, from
  // progress() or drain()), else the driver's error, and done is not called.
  int copyAsync(void* dst, const void* src, std::size_t len, CopyDone done, void* arg) noexcept;

  // Completes what the driver finished: calls done for each finished copy, in submission order per
  // stream, and returns how many. Never blocks.
  unsigned progress() noexcept;

  // Copies queued and not yet completed by progress() or drain().
  std::size_t outstanding() const noexcept;

  // Waits until every queued copy finished and completes them all (teardown, blocking flush).
  void drain() noexcept;

  struct Impl;

 private:
  explicit Copier(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

// Asks the driver for synchronous memory operations on the device allocation holding ptr
// (CU_POINTER_ATTRIBUTE_SYNC_MEMOPS), as UCX does for every device buffer it registers or copies:
// without it a GPUDirect read can overtake a cuMemcpy the application issued just before. Returns 0,
// or the driver's error (-1 without a driver or without cuPointerSetAttribute). Idempotent. On a
// thread without a current context, the pointer's device's primary context is pushed for the call
// (memtype/sync_memops.cc).
int setSyncMemops(const void* ptr) noexcept;

}  // namespace gmd::memtype
