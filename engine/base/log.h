// Logging: timestamped lines on stderr. The level is set once by the tool (CORTADO_LOG_LEVEL
// or --quiet); messages are built with StrCat so no format library is needed.
#pragma once

#include <string>

#include "engine/base/error.h"

namespace cortado {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Reads CORTADO_LOG_LEVEL (debug, info, warning, error, off); unknown values keep the default.
void InitLogLevelFromEnv();
void LogLine(LogLevel level, const std::string& message);
// A tag written before every message ("rank 1: "), so the lines of a data-parallel job's ranks
// can be told apart; empty in a single process. Set once, before other threads log.
void SetLogPrefix(std::string prefix);
const std::string& LogPrefix();
// True when CORTADO_LOG_LEVEL chose the level (then tools leave it alone).
bool LogLevelFromEnv();

template <typename... Args>
void LogInfo(Args&&... args) {
  if (GetLogLevel() <= LogLevel::kInfo) LogLine(LogLevel::kInfo, StrCat(args...));
}
template <typename... Args>
void LogWarning(Args&&... args) {
  if (GetLogLevel() <= LogLevel::kWarning) LogLine(LogLevel::kWarning, StrCat(args...));
}
template <typename... Args>
void LogDebug(Args&&... args) {
  if (GetLogLevel() <= LogLevel::kDebug) LogLine(LogLevel::kDebug, StrCat(args...));
}

}  // namespace cortado
