#include "tools/command_line.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace cortado::tools {
namespace {

std::vector<std::string> g_command_line;

// A whole-string integer, or false.
bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

bool ParseNumber(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

std::string Number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

CLI::Validator IntAtLeast(int64_t min, const std::string& note) {
  const std::string range = StrCat(">= ", min, note.empty() ? "" : " (" + note + ")");
  return CLI::Validator(
      [range, min](std::string& text) -> std::string {
        int64_t v = 0;
        if (!ParseInt(text, &v) || v < min) {
          return StrCat("must be an integer ", range, ", got '", text, "'");
        }
        return "";
      },
      StrCat(">= ", min));
}

CLI::Validator IntBetween(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        if (!ParseInt(text, &v) || v < lo || v > hi) {
          return StrCat("must be an integer from ", lo, " to ", hi, ", got '", text, "'");
        }
        return "";
      },
      StrCat(lo, " to ", hi));
}

CLI::Validator NumberAtLeast(double min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        double v = 0;
        if (!ParseNumber(text, &v) || v < min) {
          return StrCat("must be a number >= ", Number(min), ", got '", text, "'");
        }
        return "";
      },
      ">= " + Number(min));
}

CLI::Validator NumberAbove(double min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        double v = 0;
        if (!ParseNumber(text, &v) || v <= min) {
          return StrCat("must be a number > ", Number(min), ", got '", text, "'");
        }
        return "";
      },
      "> " + Number(min));
}

CLI::Validator OneOf(const std::vector<std::string>& choices) {
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  return CLI::Validator(
      [choices, list](std::string& text) -> std::string {
        for (const std::string& c : choices) {
          if (c == text) return "";
        }
        return StrCat("must be one of ", list, "; got '", text, "'");
      },
      "");
}

void AddExample(CLI::App* cmd, const std::string& example) {
  const std::string inherited = cmd->get_footer();
  cmd->footer("Example: " + example + (inherited.empty() ? "" : "\n" + inherited));
}

void SetCommandLine(int argc, char** argv) { g_command_line.assign(argv, argv + argc); }
const std::vector<std::string>& CommandLine() { return g_command_line; }

std::string ShellQuote(const std::string& arg) {
  if (arg.empty()) return "''";
  bool safe = true;
  for (char c : arg) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string("_@%+=:,./-").find(c) != std::string::npos;
    safe &= ok;
  }
  if (safe) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string ShellJoin(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += (out.empty() ? "" : " ") + ShellQuote(a);
  return out;
}

std::string ResumeCommand(const std::vector<std::string>& argv) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--resume" || a == "--stop-at-iter") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--resume=", 0) == 0 || a.rfind("--stop-at-iter=", 0) == 0 || a == "--dry-run") {
      continue;
    }
    kept.push_back(a);
  }
  if (kept.empty()) kept = {"cortado", "train"};
  kept.push_back("--resume");
  kept.push_back("auto");
  std::string command = ShellJoin(kept);
  // The launcher passes its own command line (up to its `--`) to the ranks.
  if (const char* launch = std::getenv("CORTADO_LAUNCH_COMMAND"); launch && *launch) {
    command = std::string(launch) + " " + command;
  }
  return command;
}

void CheckInputFile(const std::string& flag, const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) Fail(flag, " '", path, "' does not exist; expected ", what);
  if (fs::is_directory(st)) Fail(flag, " '", path, "' is a folder; expected ", what);
}

void CheckInputDir(const std::string& flag, const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) Fail(flag, " '", path, "' does not exist; expected ", what);
  if (!fs::is_directory(st)) Fail(flag, " '", path, "' is a file, not a folder; expected ", what);
}

void CheckOutputFile(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    Fail(flag, " '", path, "' is a folder; expected a file path (such as ",
         (fs::path(path) / "out").string(), ")");
  }
  // The nearest existing ancestor must be a folder (a file there makes every path below it
  // impossible).
  for (fs::path p = fs::path(path).parent_path(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec))
        Fail(flag, " '", path, "': '", p.string(), "' is a file, not a folder");
      break;
    }
    if (p == p.parent_path()) break;
  }
}

}  // namespace cortado::tools
