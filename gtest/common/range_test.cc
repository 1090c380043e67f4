// The shared vocabulary (common/): the one align-outwards and its boundaries, the errno
// translation, Result, and the logger.
#include "common/range.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>

#include "common/log.h"
#include "common/status.h"
#include "gtest/common/log_capture.h"

namespace gmd {
namespace {

constexpr std::size_t kA = 4096;
constexpr std::uintptr_t kTop = UINTPTR_MAX - (kA - 1);  // start of the topmost aligned block

Range align(std::uintptr_t address, std::size_t length, std::size_t alignment = kA) {
  Range r{1, 1};
  EXPECT_TRUE(alignOutwards(address, length, alignment, &r)) << address << "+" << length;
  return r;
}

TEST(AlignOutwards, RoundsTheStartDownAndTheEndUp) {
  EXPECT_EQ(align(0, 1), (Range{0, kA}));
  EXPECT_EQ(align(kA, kA), (Range{kA, 2 * kA})) << "aligned requests stay as they are";
  EXPECT_EQ(align(kA + 100, kA), (Range{kA, 3 * kA}));
  EXPECT_EQ(align(2 * kA - 1, 2), (Range{kA, 3 * kA})) << "two bytes across a boundary";
  EXPECT_EQ(align(2 * kA - 1, 1), (Range{kA, 2 * kA})) << "the last byte of a block";
  EXPECT_EQ(align(5, 10, 1 << 20), (Range{0, 1 << 20})) << "coarser alignment";
}

TEST(AlignOutwards, RefusesEmptyAndWrappingRequestsWithoutTouchingTheOutput) {
  Range r{7, 9};
  EXPECT_FALSE(alignOutwards(kA, 0, kA, &r)) << "zero length";
  EXPECT_FALSE(alignOutwards(UINTPTR_MAX, 2, kA, &r)) << "address + length wraps";
  EXPECT_FALSE(alignOutwards(1, SIZE_MAX, kA, &r)) << "address + length - 1 wraps";
  EXPECT_EQ(r, (Range{7, 9}));
}

// The boundary the five former copies disagreed on: a request whose last byte lies in the topmost
// aligned block has no representable end (it would be 2^64) and is refused, while one that ends
// exactly below that block is accepted.
TEST(AlignOutwards, TheTopmostAlignedBlockHasNoRepresentableEnd) {
  EXPECT_EQ(align(kTop - kA, kA), (Range{kTop - kA, kTop})) << "ends exactly below the top block";
  EXPECT_EQ(align(kTop - 1, 1), (Range{kTop - kA, kTop}));
  Range r{7, 9};
  EXPECT_FALSE(alignOutwards(kTop, 1, kA, &r)) << "first byte of the top block";
  EXPECT_FALSE(alignOutwards(kTop - 1, 2, kA, &r)) << "reaches into the top block";
  EXPECT_FALSE(alignOutwards(UINTPTR_MAX, 1, kA, &r)) << "the very last byte";
  EXPECT_FALSE(alignOutwards(std::uintptr_t{0}, SIZE_MAX, kA, &r)) << "the whole address space";
  EXPECT_EQ(r, (Range{7, 9}));
  static_assert(
      [] {
        Range c{};
        return alignOutwards(std::uintptr_t{4097}, 1, 4096, &c) && c == Range{4096, 8192};
      }(),
      "usable in constant expressions");
}

TEST(RangeTest, OverlapAndContainmentAreHalfOpen) {
  const Range a{10, 20};
  EXPECT_TRUE(a.overlaps(Range{19, 30}));
  EXPECT_FALSE(a.overlaps(Range{20, 30})) << "end is exclusive";
  EXPECT_FALSE(a.overlaps(Range{0, 10}));
  EXPECT_TRUE(a.overlaps(Range{0, 11}));
  EXPECT_TRUE(a.contains(Range{10, 20}));
  EXPECT_FALSE(a.contains(Range{10, 21}));
  EXPECT_EQ(a.length(), 10u);
  EXPECT_TRUE((Range{5, 5}).empty());
}

TEST(StatusTest, OneErrnoTranslation) {
  EXPECT_EQ(statusFromErrno(ENOMEM), Status::kNoResource);
  EXPECT_EQ(statusFromErrno(EAGAIN), Status::kNoResource);
  EXPECT_EQ(statusFromErrno(EOPNOTSUPP), Status::kUnsupported);
  EXPECT_EQ(statusFromErrno(ENOSYS), Status::kUnsupported);
  EXPECT_EQ(statusFromErrno(EPROTONOSUPPORT), Status::kUnsupported);
  EXPECT_EQ(statusFromErrno(EINVAL), Status::kIoError) << "arguments were checked before the call";
  EXPECT_EQ(statusFromErrno(EFAULT), Status::kIoError);
  EXPECT_EQ(statusFromErrno(EPERM), Status::kIoError);
  EXPECT_EQ(statusFromErrno(0), Status::kIoError);
  const Result r = Result::fromErrno(EFAULT);
  EXPECT_EQ(r.status, Status::kIoError);
  EXPECT_EQ(r.error, EFAULT);
  EXPECT_FALSE(r.ok());
  const Status s = r;  // converts, for callers that only need the status
  EXPECT_EQ(s, Status::kIoError);
  EXPECT_TRUE(Result().ok());
  EXPECT_EQ(Result(Status::kOk).error, 0);
}

TEST(LogTest, LinesReachTheHandlerWithLevelAndModuleAndAreTruncated) {
  test::LogCapture capture;
  log(LogLevel::kError, "rcache", "a %s line %d", "formatted", 7);
  log(LogLevel::kDebug, "memtype", "%s", std::string(2 * kMaxLogLine, 'x').c_str());
  ASSERT_EQ(capture.all(), 2);
  EXPECT_EQ(capture.at(LogLevel::kError), 1);
  EXPECT_EQ(capture.at(LogLevel::kDebug), 1);
  EXPECT_EQ(capture.loud(), 1);
  const auto lines = capture.lines();
  EXPECT_EQ(lines[0].module, "rcache");
  EXPECT_EQ(lines[0].message, "a formatted line 7");
  EXPECT_EQ(lines[1].message.size(), kMaxLogLine - 1);
}

}  // namespace
}  // namespace gmd
