// Captures gmd's log lines (common/log.h) for the life of the object, counting them by level, so a
// test can assert at which level something was reported. Restores the previous handler on
// destruction. Not thread-safe against a concurrent second capture (tests use one at a time).
#pragma once

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"

namespace gmd::test {

class LogCapture {
 public:
  struct Line {
    LogLevel level;
    std::string module;
    std::string message;
  };

  LogCapture() {
    reset();
    previous_ = logHandler();
    setLogHandler(&LogCapture::sink);
  }
  ~LogCapture() { setLogHandler(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  static int loud() { return loud_.load(); }  // kError, kWarn, kInfo
  static int all() { return count_.load(); }
  static int at(LogLevel level) { return by_level_[static_cast<int>(level)].load(); }
  static void reset() {
    count_ = 0;
    loud_ = 0;
    for (auto& n : by_level_) n = 0;
    std::lock_guard<std::mutex> g(mutex_);
    lines_.clear();
  }
  static std::vector<Line> lines() {
    std::lock_guard<std::mutex> g(mutex_);
    return lines_;
  }

 private:
  static void sink(LogLevel level, const char* module, const char* message) noexcept {
    ++count_;
    if (level != LogLevel::kDebug) ++loud_;
    ++by_level_[static_cast<int>(level) & 3];
    try {
      std::lock_guard<std::mutex> g(mutex_);
      lines_.push_back({level, module, message});
    } catch (...) {
    }
  }
  LogHandler previous_ = nullptr;
  static inline std::atomic<int> count_{0};
  static inline std::atomic<int> loud_{0};
  static inline std::atomic<int> by_level_[4] = {};
  static inline std::mutex mutex_;
  static inline std::vector<Line> lines_;
};

}  // namespace gmd::test
