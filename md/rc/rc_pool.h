// A registered pool of equal buffers on a protection domain: gmd_rc's receive segments and send
// bounce buffers. One anonymous mapping, one memory registration (local write), a free list.
//
// Thread safety: none; used by its iface's thread only.
#pragma once

#include <infiniband/verbs.h>
#include <ucs/type/status.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gmd::md::rc {

class BufferPool {
 public:
  BufferPool() = default;
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // `count` buffers of at least `size` bytes, each starting on a boundary of 64 bytes or `align`
  // (a power of two), whichever is larger; all free. Logs (error level, naming `what`) and returns
  // UCS_ERR_NO_MEMORY or UCS_ERR_IO_ERROR on failure.
  ucs_status_t init(ibv_pd* pd, std::size_t count, std::size_t size, const char* what,
                    const char* dev_name, std::size_t align = 64) noexcept;

  std::uint8_t* buffer(std::uint32_t i) const noexcept { return base_ + i * stride_; }
  // The buffer `p` points into (p must be inside the pool).
  std::uint32_t indexOf(const void* p) const noexcept {
    return static_cast<std::uint32_t>((static_cast<const std::uint8_t*>(p) - base_) / stride_);
  }
  std::uint32_t lkey() const noexcept { return mr_->lkey; }
  std::size_t count() const noexcept { return count_; }
  std::size_t available() const noexcept { return free_.size(); }
  // Precondition: available() > 0.
  std::uint32_t get() noexcept {
    const std::uint32_t i = free_.back();
    free_.pop_back();
    return i;
  }
  void put(std::uint32_t i) noexcept { free_.push_back(i); }  // capacity reserved at init

 private:
  std::uint8_t* map_ = nullptr;   // the mapping (base_ rounded up to the alignment inside it)
  std::size_t map_bytes_ = 0;
  std::uint8_t* base_ = nullptr;
  std::size_t stride_ = 0;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
  ibv_mr* mr_ = nullptr;
  std::vector<std::uint32_t> free_;
};

}  // namespace gmd::md::rc
