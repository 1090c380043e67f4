// gtest/mpi/pattern.h: the word-at-a-time fill writes the bytes the per-byte definition gives, and the
// check finds the first wrong byte wherever it lies (in a word or in the tail past the last word).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gtest/mpi/pattern.h"

namespace {

using gmd::mpi_test::checkPattern;
using gmd::mpi_test::fillPattern;
using gmd::mpi_test::patternByte;

TEST(MpiPattern, FillWritesThePerByteDefinition) {
  for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 4096u, 4099u}) {
    const std::uint64_t seed = (1ull << 56) ^ (static_cast<std::uint64_t>(len) << 32);
    std::vector<std::uint8_t> buf(len + 1, 0xa5);
    fillPattern(buf.data(), len, seed);
    for (std::size_t i = 0; i < len; ++i) {
      // The definition spelled out: byte i % 8, little-endian, of the hash of word i / 8.
      std::uint64_t x = seed ^ (i / 8);
      x ^= x >> 33;
      x *= 0xff51afd7ed558ccdull;
      x ^= x >> 29;
      ASSERT_EQ(buf[i], static_cast<std::uint8_t>(x >> (8 * (i % 8)))) << "len " << len << " byte " << i;
      ASSERT_EQ(buf[i], patternByte(seed, i));
    }
    EXPECT_EQ(buf[len], 0xa5) << "fill wrote past the end (len " << len << ")";
    EXPECT_EQ(checkPattern(buf.data(), len, seed), len);
  }
}

TEST(MpiPattern, CheckFindsTheFirstWrongByte) {
  const std::size_t len = 4099;  // 512 words and a 3-byte tail
  const std::uint64_t seed = 0x1234;
  std::vector<std::uint8_t> buf(len);
  fillPattern(buf.data(), len, seed);
  for (std::size_t bad : {0u, 5u, 8u, 2047u, 4095u, 4096u, 4098u}) {
    std::vector<std::uint8_t> copy = buf;
    copy[bad] ^= 0x10;
    if (bad + 2 < len) copy[bad + 2] ^= 0x01;  // a later wrong byte must not be reported first
    EXPECT_EQ(checkPattern(copy.data(), len, seed), bad);
  }
  // Another seed (exchange or sender) differs at the first byte.
  EXPECT_EQ(checkPattern(buf.data(), len, seed + (1ull << 32)), 0u);
}

}  // namespace
