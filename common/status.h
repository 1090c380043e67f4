// gmd's status vocabulary: one Status enum for every layer, the one errno translation, and Result
// (a status plus the errno that decided it, so errors travel in return values, never through a
// thread-local). md/mapping.h maps Status onto ucs_status_t at the UCX edge.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>

namespace gmd {

enum class Status : std::uint8_t {
  kOk = 0,
  kInvalidParam,  // zero length, wrap-around, absurd size, bad access flags or limits
  kNoMemory,      // host allocation failed
  kNoResource,    // out of registration resources (after evict + one retry in the cache)
  kExceedsLimit,  // the request alone exceeds a configured limit
  kUnsupported,   // this memory cannot be registered here (e.g. no GPUDirect path)
  kIoError,       // a system failure that is not a resource shortage (EFAULT, EINVAL, EPERM...)
};
const char* statusString(Status s) noexcept;

// The errno of a failed system call (ibv_reg_mr, ibv_reg_dmabuf_mr...) as a Status:
//   ENOMEM, EAGAIN                        -> kNoResource (the cache evicts and retries once)
//   EOPNOTSUPP, ENOSYS, EPROTONOSUPPORT   -> kUnsupported
//   anything else (EFAULT, EINVAL, EPERM, EACCES, EIO, 0...) -> kIoError: the arguments were
//   checked before the call, so a refusal is the system's, not the caller's.
Status statusFromErrno(int err) noexcept;

// A Status and, when a system call decided it, that call's errno (0 otherwise). Converts to and
// from Status implicitly, so `if (st != Status::kOk)` and `Status s = f()` read as before; callers
// that print the failure use `error`.
struct Result {
  Status status = Status::kOk;
  int error = 0;

  constexpr Result() noexcept = default;
  constexpr Result(Status s, int err = 0) noexcept : status(s), error(err) {}  // NOLINT: implicit
  constexpr operator Status() const noexcept { return status; }                // NOLINT: implicit
  constexpr bool ok() const noexcept { return status == Status::kOk; }
  // The errno translation above, keeping the errno.
  static Result fromErrno(int err) noexcept { return Result(statusFromErrno(err), err); }
};

}  // namespace gmd
