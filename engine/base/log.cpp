#include "engine/base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string_view>

#include "engine/base/env.h"

namespace cortado {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_mutex;
std::string g_prefix;
bool g_from_env = false;
}  // namespace

void SetLogPrefix(std::string prefix) { g_prefix = std::move(prefix); }
const std::string& LogPrefix() { return g_prefix; }
bool LogLevelFromEnv() { return g_from_env; }

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

void InitLogLevelFromEnv() {
  const std::string v =
      EnvChoice("CORTADO_LOG_LEVEL", "", {"debug", "info", "warning", "error", "off"});
  g_from_env = !v.empty();
  if (v == "debug") SetLogLevel(LogLevel::kDebug);
  if (v == "info") SetLogLevel(LogLevel::kInfo);
  if (v == "warning") SetLogLevel(LogLevel::kWarning);
  if (v == "error") SetLogLevel(LogLevel::kError);
  if (v == "off") SetLogLevel(LogLevel::kOff);
}

void LogLine(LogLevel level, const std::string& message) {
  static const char* kTags[] = {"D", "I", "W", "E", "-"};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "%s %s %s%s\n", kTags[static_cast<int>(level)], stamp, g_prefix.c_str(),
               message.c_str());
  std::fflush(stderr);
}

}  // namespace cortado
