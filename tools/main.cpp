// `cortado`: train, eval, convert, bench, launch and inspect in one binary, plus `help
// [command]` and `version`. Every error is one line, "cortado <command>: error: ...", and the
// exit code says what kind of failure it was (tools/command_line.h): CLI11's own messages and
// exit codes (104-114) are rewritten here.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/closest_name.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace cortado::tools {
namespace {
int g_exit_code = 0;
constexpr const char* kVersion = "cortado 0.1.0";
constexpr int kUsageExit = 2;

std::vector<std::string> Names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    out.push_back(sub->get_name());
  }
  return out;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// "unknown command 'trian' (did you mean 'train'?)", or with the list of commands.
std::string Unknown(const std::string& what, const std::string& name,
                    const std::vector<std::string>& known) {
  const std::string best = ClosestName(name, known);
  if (!best.empty()) return StrCat("unknown ", what, " '", name, "' (did you mean '", best, "'?)");
  return StrCat("unknown ", what, " '", name, "' (known: ", Join(known), ")");
}

int PrintError(const std::string& command, const std::string& message, int code) {
  std::string line = message;
  // One line: CLI11 lists extras and requirements over several.
  std::replace(line.begin(), line.end(), '\n', ' ');
  while (!line.empty() && line.back() == ' ') line.pop_back();
  // In a multi-rank job the prefix says which rank is speaking ("rank 1: ").
  std::fprintf(stderr, "cortado%s%s: error: %s%s\n", command.empty() ? "" : " ", command.c_str(),
               cortado::LogPrefix().c_str(), line.c_str());
  return code;
}

// CLI11's parse errors, reworded where they are cryptic.
std::string UsageMessage(const CLI::ParseError& e, const std::string& command) {
  std::string m = e.what();
  if (m == "A subcommand is required") {
    return command == "bench" ? "a benchmark is required: train, data, comm or codec"
                              : "a command is required (see 'cortado help')";
  }
  const std::string convert = "Could not convert: ";
  if (m.rfind(convert, 0) == 0) {
    const size_t eq = m.find(" = ", convert.size());
    if (eq != std::string::npos) {
      return StrCat(m.substr(convert.size(), eq - convert.size()), ": cannot read '",
                    m.substr(eq + 3), "' as a number");
    }
  }
  const std::string extra = "The following argument was not expected: ";
  if (m.rfind(extra, 0) == 0 && m.find('=') != std::string::npos && m[extra.size()] != '-') {
    const std::string arg = m.substr(extra.size());
    return StrCat("unexpected argument '", arg, "'; a config key is overridden with --set ",
                  "(--set ", arg, ")");
  }
  if (m == "--resume: 1 required TEXT missing") {
    return "--resume needs a value: auto (the newest valid checkpoint in checkpoint.dir) or a "
           "checkpoint file (ckpt-*.cortado)";
  }
  if (command == "launch" && m == "command is required") {
    return "no command to run: cortado launch [OPTIONS] -- CMD [ARGS...]";
  }
  const std::string hint = command.empty() ? "cortado help" : "cortado help " + command;
  return StrCat(m, " (see '", hint, "')");
}

// Help lines as "--threads INT   Thread budget ... (>= 0) [default: 0]": CLI11's own packs
// the range and the default into the type ("INT:>=0=0").
class Formatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (opt->get_type_size() == 0) return "";
    std::string type = opt->get_type_name();
    type = type.substr(0, type.find(':'));
    std::string out = " " + type;
    if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " ...";
    if (opt->get_required()) out += " REQUIRED";
    return out;
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string out = opt->get_description();
    const std::string type = opt->get_type_name();
    if (const size_t colon = type.find(':'); colon != std::string::npos) {
      std::string range = type.substr(colon + 1);
      std::replace(range.begin(), range.end(), ':', ' ');
      out += " (" + range + ")";
    }
    const std::string def = opt->get_default_str();
    if (opt->get_type_size() != 0 && !opt->get_required() && !def.empty() && def != "[]") {
      out += " [default: " + def + "]";
    }
    return out;
  }
};

// The first option in args that `cmd` does not know, as an error message; "" when all are
// known. CLI11 would first complain about a missing required option, which hides the typo.
std::string UnknownOption(const CLI::App& cmd, const std::vector<std::string>& args) {
  // The help flag is among the options too: each name once.
  std::vector<std::string> known = {"--help", "-h"};
  auto add = [&known](const std::string& name) {
    if (std::find(known.begin(), known.end(), name) == known.end()) known.push_back(name);
  };
  for (const CLI::Option* o : cmd.get_options()) {
    for (const std::string& l : o->get_lnames()) add("--" + l);
    for (const std::string& s : o->get_snames()) add("-" + s);
  }
  for (const std::string& a : args) {
    if (a == "--") break;  // the rest belongs to launch's command
    if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9') || a[1] == '.') continue;
    const std::string name = a.substr(0, a.find('='));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::vector<std::string> longs;
    for (const std::string& k : known) {
      if (k.size() > 2) longs.push_back(k);
    }
    return Unknown("option", name, longs);
  }
  return "";
}

}  // namespace

void SetExitCode(int code) { g_exit_code = code; }
int ExitCode() { return g_exit_code; }

void AddBenchCommand(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Benchmarks: train (a config's images/s), data (the loader), comm (collectives), "
      "codec (gradient codecs)");
  bench->require_subcommand(1);
  AddBenchTrainCommand(*bench);
  AddBenchDataCommand(*bench);
  AddBenchCommCommand(*bench);
  AddBenchCodecCommand(*bench);
}
}  // namespace cortado::tools

namespace {
using namespace cortado::tools;

// One example line for every command's help (launch writes its own, with its usage), added
// once every command exists: a subcommand created later would inherit its parent's footer,
// example included.
void AddExamples(CLI::App& app) {
  const std::pair<const char*, const char*> kExamples[] = {
      {"train", "cortado train --config configs/fashion_lenet.yaml --set solver.max_epochs=1"},
      {"eval", "cortado eval --checkpoint runs/fashion_lenet/ckpt-00004680.cortado --json"},
      {"convert",
       "cortado convert --root /data/imagenet/train --out /data/imagenet/train_lmdb "
       "--resize-shorter 256 --shuffle"},
      {"inspect", "cortado inspect --config configs/resnet50.yaml"},
      {"export",
       "cortado export --checkpoint runs/resnet50/ckpt-00450360.cortado --out "
       "resnet50.safetensors"},
      {"bench", "cortado bench train --config configs/fashion_resnet20.yaml --infer"},
      {"bench train", "cortado bench train --config configs/fashion_resnet20.yaml --profile"},
      {"bench data", "cortado bench data --db /data/imagenet/train_lmdb --threads 2"},
      {"bench comm", "cortado launch --nproc 2 -- cortado bench comm --sizes 4K:64M"},
      {"bench codec", "cortado bench codec --codec bf16,epgc8 --count 64K"},
  };
  for (const auto& [path, example] : kExamples) {
    CLI::App* cmd = &app;
    std::istringstream words(path);
    for (std::string word; words >> word;) cmd = cmd->get_subcommand(word);
    AddExample(cmd, example);
  }
}

// The command path that errors name ("train", "bench comm"); "" for none. An unknown benchmark
// is a usage error, its exit code returned in *early_exit.
std::string CommandPath(CLI::App& app, const std::vector<std::string>& args, int* early_exit) {
  const std::vector<std::string> commands = Names(app);
  if (args.empty() || std::find(commands.begin(), commands.end(), args[0]) == commands.end()) {
    return "";
  }
  std::string command = args[0];
  if (command == "bench" && args.size() > 1 && args[1][0] != '-') {
    const std::vector<std::string> benches = Names(*app.get_subcommand("bench"));
    if (std::find(benches.begin(), benches.end(), args[1]) == benches.end()) {
      *early_exit = PrintError("bench", Unknown("benchmark", args[1], benches), kUsageExit);
      return "";
    }
    command += " " + args[1];
  }
  return command;
}

// `cortado help [COMMAND...]`.
int Help(CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* target = &app;
  std::string prefix;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::vector<std::string> known = Names(*target);
    if (std::find(known.begin(), known.end(), args[i]) == known.end()) {
      return PrintError("help", Unknown("command", args[i], known), kUsageExit);
    }
    prefix += (prefix.empty() ? "" : " ") + target->get_name();
    target = target->get_subcommand(args[i]);
  }
  std::cout << target->help(prefix);
  return 0;
}

// A misspelled option of a known command, named before CLI11 parses (it would first complain
// about a missing required option); -1 when every option is known.
int CheckOptions(CLI::App& app, const std::string& command, const std::vector<std::string>& args) {
  const CLI::App* cmd = app.get_subcommand(args[0]);
  size_t skip = 1;
  if (command.find(' ') != std::string::npos) {
    cmd = cmd->get_subcommand(args[1]);
    skip = 2;
  }
  const std::string unknown =
      UnknownOption(*cmd, std::vector<std::string>(args.begin() + skip, args.end()));
  if (unknown.empty()) return -1;
  // `cortado launch -n 2 cortado train --config F`: the rank's options need the `--`.
  const std::string hint = command == "launch"
                               ? " (the command to run goes after --: cortado launch "
                                 "[OPTIONS] -- CMD [ARGS...])"
                               : " (see 'cortado help " + command + "')";
  return PrintError(command, unknown + hint, kUsageExit);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cortado::tools;
  try {
    cortado::InitLogLevelFromEnv();
  } catch (const std::exception& e) {
    return PrintError("", e.what(), 1);
  }
  SetCommandLine(argc, argv);
  CLI::App app{"Cortado: a data-parallel training engine"};
  app.name("cortado");
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion);
  // Every option's help shows its default ("[20]").
  app.option_defaults()->always_capture_default();
  app.formatter(std::make_shared<Formatter>());
  app.footer(
      "More: cortado help COMMAND, cortado version. Exit codes: 0 success, 1 error, "
      "2 usage error, 128+N after signal N (130: SIGINT, 143: SIGTERM).");
  AddTrainCommand(app);
  AddEvalCommand(app);
  AddConvertCommand(app);
  AddLaunchCommand(app);
  AddInspectCommand(app);
  AddExportCommand(app);
  AddBenchCommand(app);
  AddExamples(app);

  const std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> all = Names(app);
  all.push_back("help");
  all.push_back("version");
  int early_exit = -1;
  const std::string command = CommandPath(app, args, &early_exit);
  if (early_exit >= 0) return early_exit;
  if (args.empty()) {
    return PrintError("", "a command is required: " + Join(all) + " (see 'cortado help')",
                      kUsageExit);
  }
  if (args[0] == "version") {
    std::printf("%s\n", kVersion);
    return 0;
  }
  if (args[0] == "help") return Help(app, args);
  if (command.empty() && args[0][0] != '-') {
    return PrintError("", Unknown("command", args[0], all), kUsageExit);
  }
  if (!command.empty()) {
    if (const int code = CheckOptions(app, command, args); code >= 0) return code;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const std::string name = e.get_name();
    if (name == "CallForHelp" || name == "CallForAllHelp" || name == "CallForVersion") {
      return app.exit(e);
    }
    return PrintError(command, UsageMessage(e, command), kUsageExit);
  } catch (const UsageError& e) {
    return PrintError(command, e.what(), kUsageExit);
  } catch (const std::exception& e) {
    return PrintError(command, e.what(), 1);
  }
  return ExitCode();
}
