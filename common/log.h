// Log lines on stderr: "2026-11-30T13:45:05.123Z I qparams-server: message". The
// Abseil release we build on has no absl/log, and the server needs only this.

#ifndef QPARAMS_COMMON_LOG_H_
#define QPARAMS_COMMON_LOG_H_

#include "absl/strings/string_view.h"

namespace qparams {

enum class LogLevel { kInfo, kWarning, kError };

// Writes one line, whole, even when threads log at once.
void Log(LogLevel level, absl::string_view message);

inline void LogInfo(absl::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(absl::string_view message) { Log(LogLevel::kError, message); }

}  // namespace qparams

#endif  // QPARAMS_COMMON_LOG_H_
