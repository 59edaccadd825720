// The command line of the `cortado` binary as the subcommands see it: usage errors (exit 2)
// apart from runtime errors (exit 1), flag checks whose errors name the flag and the allowed
// range in words, checks that a path given for a flag is the kind of thing the flag expects,
// and the shell-quoted command line that a stopped training prints so it can be resumed.
//
// Exit codes of every subcommand (README.md, "Exit codes"): 0 success, 1 runtime error,
// 2 usage error, 128 + signal after SIGINT (130) or SIGTERM (143).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/base/error.h"

namespace cortado::tools {

// A flag or argument the command cannot work with; main prints it as one line and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void UsageFail(Args&&... args) {
  throw UsageError(StrCat(std::forward<Args>(args)...));
}

// Runs parse() (a flag value's parser, e.g. dist::ParseCodec) and turns its exception into a
// usage error naming the flag: "--codec: unknown codec 'fp12' (known: ...)".
template <typename F>
auto ParseFlag(const std::string& flag, F&& parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    UsageFail(flag, ": ", e.what());
  }
}

// CLI11 checks for numeric flags. The message CLI11 prints is "<flag>: <what we return>", e.g.
// "--threads: must be an integer >= 0 (0: the default), got '-3'".
CLI::Validator IntAtLeast(int64_t min, const std::string& note = "");
CLI::Validator IntBetween(int64_t lo, int64_t hi);
CLI::Validator NumberAtLeast(double min);
CLI::Validator NumberAbove(double min);
// One of a fixed set of words: "--op: must be one of allreduce, broadcast; got 'x'".
CLI::Validator OneOf(const std::vector<std::string>& choices);

// Puts "Example: CMD" at the top of the command's help footer (above what it inherited), so
// every command's help shows one line a user can start from.
void AddExample(CLI::App* cmd, const std::string& example);

// The process's argv, recorded by main before parsing.
void SetCommandLine(int argc, char** argv);
const std::vector<std::string>& CommandLine();

// One argument as the shell reads it back: unchanged when it holds only safe characters,
// else in single quotes ('it'\''s').
std::string ShellQuote(const std::string& arg);
std::string ShellJoin(const std::vector<std::string>& args);

// The command that resumes a training started with `argv`: every flag kept, `--resume auto`
// in place of any earlier --resume, without --stop-at-iter (resuming would stop again at
// once) and --dry-run. Under `cortado launch` (CORTADO_LAUNCH_COMMAND, set by the launcher) it
// is the launch command with the rank's command after `--`.
std::string ResumeCommand(const std::vector<std::string>& argv);

// Throw (runtime error, exit 1) naming the flag and the path unless `path` is an existing
// regular file (or a device such as /dev/stdin), resp. an existing folder. `what` says what
// was expected: "a checkpoint file (ckpt-*.cortado)".
void CheckInputFile(const std::string& flag, const std::string& path, const std::string& what);
void CheckInputDir(const std::string& flag, const std::string& path, const std::string& what);
// Throws unless `path` can be written as a file: not a folder, and its folder exists or can be
// created. Nothing is created.
void CheckOutputFile(const std::string& flag, const std::string& path);

}  // namespace cortado::tools
