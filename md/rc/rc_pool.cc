#include "md/rc/rc_pool.h"

#include <sys/mman.h>
#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstring>

namespace gmd::md::rc {

ucs_status_t BufferPool::init(ibv_pd* pd, std::size_t count, std::size_t size, const char* what,
                              const char* dev_name) noexcept {
  stride_ = (size + 63) / 64 * 64;
  count_ = count;
  bytes_ = stride_ * count_;
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    ucs_error("gmd_rc %s: cannot allocate %zu bytes of %s: %s", dev_name, bytes_, what,
              std::strerror(errno));
    bytes_ = 0;
    return UCS_ERR_NO_MEMORY;
  }
  base_ = static_cast<std::uint8_t*>(p);
  mr_ = ibv_reg_mr(pd, base_, bytes_, IBV_ACCESS_LOCAL_WRITE);
  if (mr_ == nullptr) {
    ucs_error("gmd_rc %s: cannot register %zu bytes of %s: %s", dev_name, bytes_, what,
              std::strerror(errno));
    return UCS_ERR_IO_ERROR;
  }
  try {
    free_.reserve(count_);
  } catch (...) {
    return UCS_ERR_NO_MEMORY;
  }
  for (std::size_t i = count_; i-- > 0;) free_.push_back(static_cast<std::uint32_t>(i));
  return UCS_OK;
}

BufferPool::~BufferPool() {
  if (mr_ != nullptr) ibv_dereg_mr(mr_);
  if (base_ != nullptr) munmap(base_, bytes_);
}

}  // namespace gmd::md::rc
