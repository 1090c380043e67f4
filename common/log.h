// gmd's one logger. rcache/ and memtype/ know nothing of UCX; they log through log() here, and md/
// installs the one handler that forwards to UCX's logger (md/md.cc, mapped level for level:
// kError -> error, kWarn -> warn, kInfo -> info, kDebug -> debug). Without a handler, errors and
// warnings go to stderr and the rest is dropped.
//
// Levels follow UCX's own components: kError for system failures (device, driver, out of memory),
// once, where the failure is decided; caller mistakes that return an error status are kDebug (the
// caller has the status); kWarn for something the user should fix but that does not fail a call.
//
// Thread safety: any thread, any time, including inside memory hooks (CUDA free hooks, libucm
// events): log() does not allocate and takes no lock (the message is formatted into a fixed
// buffer of kMaxLogLine bytes and truncated).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gmd {

enum class LogLevel : std::uint8_t { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };
const char* logLevelName(LogLevel level) noexcept;

inline constexpr std::size_t kMaxLogLine = 256;

// `module` names the layer that logs ("rcache", "memtype", "md"); `message` is valid only during
// the call. A handler must be hook-safe as log() is.
using LogHandler = void (*)(LogLevel level, const char* module, const char* message) noexcept;
// nullptr restores the default (stderr) handler.
void setLogHandler(LogHandler handler) noexcept;
LogHandler logHandler() noexcept;

void log(LogLevel level, const char* module, const char* fmt, ...) noexcept
    __attribute__((format(printf, 3, 4)));

}  // namespace gmd
