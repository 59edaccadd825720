#include "tools/metrics.h"

#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "engine/base/error.h"

namespace cortado {

void IntervalStats::Add(double loss, const StepTimes& t) {
  ++steps;
  loss_sum += loss;
  time.data_wait += t.data_wait;
  time.compute += t.compute;
  time.comm_wait += t.comm_wait;
  time.sync_bn += t.sync_bn;
  time.comm_cpu += t.comm_cpu;
  time.comm_user += t.comm_user;
  time.comm_system += t.comm_system;
  time.comm_wakeups += t.comm_wakeups;
}

double IntervalStats::Seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void MetricsFile::Open(const std::string& path, bool append) {
  if (path.empty()) return;
  path_ = path;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  CORTADO_CHECK(!std::filesystem::is_directory(path, ec), "--metrics '", path,
                "' is a folder; expected a file path (such as ",
                (std::filesystem::path(path) / "metrics.jsonl").string(), ")");
  CORTADO_CHECK(out_.good(), "cannot write metrics file '", path, "': ", std::strerror(errno));
}

namespace {

void AppendShortest(const nlohmann::ordered_json& v, std::string& out) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) {
      out += "null";  // what JSON has for inf and NaN (nlohmann writes the same)
      return;
    }
    std::array<char, 32> buf;
    const auto result = std::to_chars(buf.data(), buf.data() + buf.size(), d);
    out.append(buf.data(), result.ptr);
    // Keep it a float when read back: 2.0, not 2.
    if (std::string_view(buf.data(), result.ptr - buf.data()).find_first_of(".eEn") ==
        std::string_view::npos) {
      out += ".0";
    }
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) out += ',';
      first = false;
      out += nlohmann::ordered_json(key).dump(-1, ' ', false,
                                              nlohmann::json::error_handler_t::replace);
      out += ':';
      AppendShortest(value, out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      AppendShortest(v[i], out);
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

}  // namespace

std::string DumpShortest(const nlohmann::ordered_json& value) {
  std::string out;
  AppendShortest(value, out);
  return out;
}

void MetricsFile::Write(const nlohmann::ordered_json& record) {
  if (!out_.is_open()) return;
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  nlohmann::ordered_json line;
  for (const auto& [key, value] : record.items()) {
    line[key] = value;
    if (key == "event") line["time"] = static_cast<double>(ms) / 1000.0;
  }
  out_ << DumpShortest(line) << "\n";
  out_.flush();
  CORTADO_CHECK(out_.good(), "writing metrics file '", path_, "' failed (disk full?)");
}

void ProgressBar::Update(int64_t iteration, int64_t max_iter, int64_t first_iteration,
                         double loss) {
  if (!enabled_ || max_iter <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_draw_).count() < 0.25) return;
  last_draw_ = now;
  const int width = 30;
  const int filled = static_cast<int>(width * iteration / max_iter);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  const double elapsed = std::chrono::duration<double>(now - run_start_).count();
  const double rate = static_cast<double>(iteration - first_iteration) / std::max(1e-9, elapsed);
  std::printf(
      "\r[%s] %5.1f%%  iter %lld/%lld  loss %.4f  ETA %s", bar.c_str(),
      100.0 * static_cast<double>(iteration) / static_cast<double>(max_iter),
      static_cast<long long>(iteration), static_cast<long long>(max_iter), loss,
      FormatDuration(static_cast<double>(max_iter - iteration) / std::max(rate, 1e-9)).c_str());
  std::fflush(stdout);
}

void ProgressBar::Clear() {
  if (!enabled_) return;
  // The bar lives on stdout and log lines on stderr: erase and flush before a log line.
  std::printf("\r\033[K");
  std::fflush(stdout);
}

std::string ConfigHash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

std::string Fixed(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace cortado
