// The message contents of the MPI exchange programs (gtest/mpi/): every 8-byte word of a message is a
// hash of the message's seed (sender and exchange) and the word's index, so that a byte delivered at
// the wrong offset, from another exchange or from the other rank never matches.
//
// Filled and checked a word at a time: the soft-RoCE VM emulates every instruction, and per byte the
// hash took about a third of an exchange test's time there. The byte at offset i is byte i % 8 of word
// i / 8 in little-endian order (the bytes the programs wrote one at a time before).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gmd::mpi_test {

inline std::uint64_t patternWord(std::uint64_t seed, std::size_t word) {
  std::uint64_t x = seed ^ word;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return x;
}

inline std::uint8_t patternByte(std::uint64_t seed, std::size_t i) {
  return static_cast<std::uint8_t>(patternWord(seed, i / 8) >> (8 * (i % 8)));
}

inline void fillPattern(std::uint8_t* buf, std::size_t len, std::uint64_t seed) {
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    std::uint8_t bytes[8];
    const std::uint64_t x = patternWord(seed, i / 8);
    for (int b = 0; b < 8; ++b) bytes[b] = static_cast<std::uint8_t>(x >> (8 * b));
    std::memcpy(buf + i, bytes, 8);
  }
  for (; i < len; ++i) buf[i] = patternByte(seed, i);
}

// The offset of the first byte that differs from the pattern, or len.
inline std::size_t checkPattern(const std::uint8_t* buf, std::size_t len, std::uint64_t seed) {
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    std::uint8_t want[8];
    const std::uint64_t x = patternWord(seed, i / 8);
    for (int b = 0; b < 8; ++b) want[b] = static_cast<std::uint8_t>(x >> (8 * b));
    if (std::memcmp(buf + i, want, 8) != 0) break;
  }
  for (; i < len; ++i) {
    if (buf[i] != patternByte(seed, i)) return i;
  }
  return len;
}

}  // namespace gmd::mpi_test
