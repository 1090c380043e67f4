// gmd registration cache: the public contract. UCX-free; md/ plugs it into UCX.
//
// One Cache per memory domain. A request (address, length, access) is aligned outwards to the cache
// alignment and answered by a Region that covers it, either an existing valid one (hit) or a new
// registration (miss) made through the Backend that the request's Resolver names. The rules the
// cache keeps are written in docs/design.md ("The registration cache's rules"); docs/rcache.md
// explains the implementation and rcache/README.md maps each rule to the code and its tests.
//
// Thread safety: every method of Cache may be called from any thread at any time. invalidate() may
// be called from inside a memory hook (munmap, free) including while the same thread is inside the
// cache; it does not allocate, does not block on a lock that get()/put() hold across a backend
// call, and defers deregistration to the next get()/put()/progress() outside the hook.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/mem_type.h"
#include "common/status.h"

namespace gmd::rcache {

// Outcomes are gmd's shared Status and Result (common/status.h): a backend's failure carries the
// errno that decided it, and get() hands it on to the caller. Log lines go through common/log.h.
using gmd::Result;
using gmd::Status;
using gmd::statusString;

// Requests longer than this are rejected as absurd (kInvalidParam): larger than any user address
// space.
inline constexpr std::size_t kMaxRequestLength = std::size_t{1} << 57;

// Access rights, a bit set. A region satisfies a request when it holds every requested bit.
enum Access : unsigned {
  kAccessLocalRead = 1u << 0,
  kAccessLocalWrite = 1u << 1,
  kAccessRemoteRead = 1u << 2,
  kAccessRemoteWrite = 1u << 3,
  kAccessRemoteAtomic = 1u << 4,
  kAccessAll = (1u << 5) - 1,
};

// What a backend produces for a registered range.
struct Registration {
  void* handle = nullptr;  // backend-owned object (e.g. struct ibv_mr*)
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
};

// The seam between the cache and the world: registers page-aligned ranges.
// Thread safety: reg()/dereg() may be called concurrently from several threads, never under a cache
// lock that invalidate() takes. A backend must not call back into the cache.
class Backend {
 public:
  virtual ~Backend() = default;
  // Register [start, start + length) (aligned) with at least `access`, as memory of `memory.type`
  // (on CUDA device `memory.device`, when known). On failure returns a status with the errno that
  // decided it (common/status.h) and leaves `out` untouched. kNoResource (ENOMEM/EAGAIN from the
  // device) makes the cache evict and retry.
  virtual Result reg(std::uintptr_t start, std::size_t length, unsigned access, MemoryKind memory,
                     Registration* out) noexcept = 0;
  virtual void dereg(const Registration& reg) noexcept = 0;
  virtual const char* name() const noexcept = 0;
};

// A cached registration. Callers see it read-only, between get() and put().
class Region {
 public:
  std::uintptr_t start() const noexcept { return start_; }
  std::uintptr_t end() const noexcept { return end_; }  // exclusive
  std::size_t length() const noexcept { return end_ - start_; }
  unsigned access() const noexcept { return access_; }
  MemType memType() const noexcept { return mem_type_; }
  Backend* backend() const noexcept { return backend_; }
  const Registration& registration() const noexcept { return reg_; }

 protected:
  Region() = default;
  ~Region() = default;
  // 42 bytes, narrow fields last: the cache's region puts its own hot fields in the tail.
  std::uintptr_t start_ = 0;
  std::uintptr_t end_ = 0;
  Backend* backend_ = nullptr;
  Registration reg_{};
  std::uint8_t access_ = 0;  // Access bits (kAccessAll fits)
  MemType mem_type_ = MemType::kHost;
};

// What a miss registers, as decided by a Resolver: the memory's kind and the backend for it.
struct Resolution {
  Result result;      // not ok: the request fails with it and nothing is registered
  MemoryKind memory;  // type and CUDA device of the memory
  Backend* backend = nullptr;
};

// How get() learns what to register on a miss. A classifying resolver (a function and its context)
// is called only on a miss, once, outside every cache lock, before the writer lock is taken; a hit
// then needs no classification (a virtual address is host or device memory, never both at once,
// and freed ranges leave the index before they can change type), so it matches any region with
// the access. A fixed resolver names the kind and backend up front, and hits only regions of
// that memory type registered through that backend.
// Thread safety: a value; the function must be callable from any thread.
class Resolver {
 public:
  using Fn = Resolution (*)(void* ctx, const void* address, std::size_t length) noexcept;

  constexpr Resolver(Fn fn, void* ctx) noexcept : fn_(fn), ctx_(ctx) {}
  static constexpr Resolver fixed(MemoryKind memory, Backend* backend) noexcept {
    Resolver r(nullptr, nullptr);
    r.fixed_.memory = memory;
    r.fixed_.backend = backend;
    return r;
  }

  bool isFixed() const noexcept { return fn_ == nullptr; }
  // The fixed resolver's backend (null for a classifying one).
  const Backend* fixedBackend() const noexcept { return fixed_.backend; }
  MemType fixedType() const noexcept { return fixed_.memory.type; }
  Resolution resolve(const void* address, std::size_t length) const noexcept {
    return fn_ != nullptr ? fn_(ctx_, address, length) : fixed_;
  }

 private:
  Fn fn_;
  void* ctx_;
  Resolution fixed_{};
};

// Where invalidations come from (libucm, CUDA free hooks, a test feed).
class InvalidationSink {
 public:
  virtual ~InvalidationSink() = default;
  virtual void invalidate(const void* address, std::size_t length) noexcept = 0;
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  // Start delivering events to `sink` until unsubscribe(). Several sinks may be subscribed.
  virtual Status subscribe(InvalidationSink* sink) noexcept = 0;
  virtual void unsubscribe(InvalidationSink* sink) noexcept = 0;
};

struct Config {
  std::size_t alignment = 4096;                // power of two, >= page size
  std::size_t max_regions = SIZE_MAX;          // regions registered at once (in index or held)
  std::size_t max_pinned_bytes = SIZE_MAX;     // bytes registered at once
  std::size_t max_unused_bytes = 512ul << 20;  // unused-but-cached bytes kept for reuse
  bool purge_on_fork = true;                   // child drops the parent's regions after fork()
};

// Counters, read with Cache::stats(); monotonic except regions / pinned / unused.
struct Stats {
  std::uint64_t hits = 0;
  std::uint64_t locked_hits = 0;             // of the hits, those found under the writer lock
                                             // (queued work first, a busy leaf, no reader slot)
  std::uint64_t misses = 0;
  std::uint64_t merges = 0;                  // misses that absorbed overlapping regions
  std::uint64_t evictions = 0;               // unused regions dropped for a limit or on ENOMEM
  std::uint64_t invalidations_in_use = 0;    // regions invalidated while held
  std::uint64_t invalidations_unused = 0;    // regions invalidated while unused
  std::uint64_t deferred_deregs = 0;         // deregistrations postponed to a later release
  std::uint64_t regions = 0;                 // registrations alive now (indexed or held)
  std::uint64_t pinned_bytes = 0;            // bytes they cover
  std::uint64_t unused_bytes = 0;            // bytes of unused regions still cached
  std::uint64_t invalidation_overflows = 0;  // invalidations that found the queue full and were
                                             // applied as the smallest range covering all such
};

class Cache : public InvalidationSink {
 public:
  // Validates `config` (kInvalidParam on bad limits/alignment) and builds a cache.
  static Status create(const Config& config, std::unique_ptr<Cache>* out);
  // Deregisters everything still cached. Destroy only when no thread is inside the cache and no
  // region is held, after unsubscribing the cache from its monitors.
  virtual ~Cache() = default;

  // Find or make a region covering [address, address + length) with `access`. A miss asks
  // `resolver` (once) what to register and through which backend. On kOk *region is held until
  // put(). On failure nothing changes; a backend failure's errno is in the result.
  virtual Result get(const void* address, std::size_t length, unsigned access,
                     const Resolver& resolver, Region** region) noexcept = 0;
  // The same with a fixed resolver: registered through `backend` as memory of `type`, and a hit
  // only on a region of that type and backend.
  Result get(const void* address, std::size_t length, unsigned access, MemType type,
             Backend* backend, Region** region) noexcept {
    return get(address, length, access, Resolver::fixed(type, backend), region);
  }
  // Hit-only lookup: a valid region covering the aligned range with `access`, whatever its memory
  // type and backend. On a hit takes a hold (released with put()) and counts a hit; otherwise
  // returns false and changes nothing, including when deferred invalidations are pending or a
  // writer keeps editing the part of the index the lookup reads (it never waits for the lock).
  virtual bool find(const void* address, std::size_t length, unsigned access,
                    Region** region) noexcept = 0;
  // Release a hold taken by get() or find(). May deregister (if the region was invalidated or
  // evicted).
  virtual void put(Region* region) noexcept = 0;
  // Memory in [address, address + length) is about to be unmapped or freed. Safe inside hooks.
  void invalidate(const void* address, std::size_t length) noexcept override = 0;
  // Finish deferred work (deregistrations queued by invalidate()).
  virtual void progress() noexcept = 0;
  virtual Stats stats() const noexcept = 0;
  virtual const Config& config() const noexcept = 0;
};

}  // namespace gmd::rcache
