#include "md/rc/rc_pool.h"

#include <sys/mman.h>
#include <ucs/debug/log_def.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gmd::md::rc {

ucs_status_t BufferPool::init(ibv_pd* pd, std::size_t count, std::size_t size, const char* what,
                              const char* dev_name, std::size_t align) noexcept {
  align = std::max<std::size_t>(align, 64);
  stride_ = (size + align - 1) / align * align;
  count_ = count;
  bytes_ = stride_ * count_;
  // A mapping starts on a page; a larger alignment takes the slack to round up inside it.
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  map_bytes_ = bytes_ + (align > page ? align : 0);
  void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    ucs_error("gmd_rc %s: cannot allocate %zu bytes of %s: %s", dev_name, map_bytes_, what,
              std::strerror(errno));
    bytes_ = map_bytes_ = 0;
    return UCS_ERR_NO_MEMORY;
  }
  map_ = static_cast<std::uint8_t*>(p);
  base_ = reinterpret_cast<std::uint8_t*>(
      (reinterpret_cast<std::uintptr_t>(map_) + align - 1) & ~(std::uintptr_t{align} - 1));
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
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

}  // namespace gmd::md::rc
