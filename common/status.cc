#include "common/status.h"

#include <cerrno>

namespace gmd {

const char* statusString(Status s) noexcept {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kInvalidParam:
      return "invalid parameter";
    case Status::kNoMemory:
      return "out of memory";
    case Status::kNoResource:
      return "out of registration resources";
    case Status::kExceedsLimit:
      return "exceeds a configured limit";
    case Status::kUnsupported:
      return "unsupported";
    case Status::kIoError:
      return "registration failed";
  }
  return "unknown";
}

Status statusFromErrno(int err) noexcept {
  switch (err) {
    case ENOMEM:
    case EAGAIN:
      return Status::kNoResource;
    case EOPNOTSUPP:
    case ENOSYS:
    case EPROTONOSUPPORT:
      return Status::kUnsupported;
    default:
      return Status::kIoError;
  }
}

}  // namespace gmd
