#include "common/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace gmd {
namespace {

std::atomic<LogHandler> g_handler{nullptr};

void defaultHandler(LogLevel level, const char* module, const char* message) noexcept {
  if (level > LogLevel::kWarn) return;
  std::fprintf(stderr, "gmd %s %s: %s\n", module, logLevelName(level), message);
}

}  // namespace

const char* logLevelName(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "unknown";
}

void setLogHandler(LogHandler handler) noexcept {
  g_handler.store(handler, std::memory_order_release);
}

LogHandler logHandler() noexcept { return g_handler.load(std::memory_order_acquire); }

void log(LogLevel level, const char* module, const char* fmt, ...) noexcept {
  char buf[kMaxLogLine];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  const LogHandler h = g_handler.load(std::memory_order_acquire);
  (h != nullptr ? h : defaultHandler)(level, module, buf);
}

}  // namespace gmd
