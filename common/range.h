// gmd's address ranges: one half-open Range type and the one place that aligns a request outwards.
//
// Every layer (rcache/, memtype/, md/) widens requests to whole pages (or a coarser alignment) with
// alignOutwards(); nobody else writes the arithmetic, so the boundary at the top of the address
// space is decided once (common/README.md, "Ranges"). Header-only, constexpr, no dependencies.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gmd {

// [start, end): end is exclusive, so the empty range has start == end. A Range never reaches the
// last byte of the address space (end would wrap to 0), which alignOutwards() guarantees.
struct Range {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;

  constexpr std::size_t length() const noexcept { return end - start; }
  constexpr bool empty() const noexcept { return end <= start; }
  constexpr bool overlaps(std::uintptr_t s, std::uintptr_t e) const noexcept {
    return start < e && s < end;
  }
  constexpr bool overlaps(const Range& o) const noexcept { return overlaps(o.start, o.end); }
  constexpr bool contains(const Range& o) const noexcept {
    return start <= o.start && o.end <= end;
  }
  friend constexpr bool operator==(const Range&, const Range&) = default;
};

// [address, address + length) widened to multiples of `alignment` (a power of two): the start
// rounded down, the end rounded up. Returns false and leaves *out untouched when length is 0, when
// address + length - 1 wraps around, or when the widened end would lie past the top of the address
// space (the last byte of the request is in the topmost aligned block, whose end 2^N does not fit
// in a uintptr_t).
constexpr bool alignOutwards(std::uintptr_t address, std::size_t length, std::size_t alignment,
                             Range* out) noexcept {
  const std::uintptr_t mask = alignment - 1;
  std::uintptr_t last = 0;
  if (length == 0 || __builtin_add_overflow(address, length - 1, &last) ||
      (last | mask) == UINTPTR_MAX) {
    return false;
  }
  *out = Range{address & ~mask, (last | mask) + 1};
  return true;
}

inline bool alignOutwards(const void* address, std::size_t length, std::size_t alignment,
                          Range* out) noexcept {
  return alignOutwards(reinterpret_cast<std::uintptr_t>(address), length, alignment, out);
}

}  // namespace gmd
