// `cortado`: train, eval, convert, bench, launch and inspect in one binary.
#include <cstdio>
#include <exception>
#include <string>

#include "engine/error.h"
#include "engine/log.h"
#include "tools/commands.h"

namespace cortado::tools {
namespace {
int g_exit_code = 0;
}
void SetExitCode(int code) { g_exit_code = code; }
int ExitCode() { return g_exit_code; }

void AddBenchCommand(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (training speed, data loader, comm)");
  bench->require_subcommand(1);
  AddBenchTrainCommand(*bench);
  AddBenchDataCommand(*bench);
  AddBenchCommCommand(*bench);
  AddBenchCodecCommand(*bench);
}
}  // namespace cortado::tools

int main(int argc, char** argv) {
  using namespace cortado::tools;
  cortado::InitLogLevelFromEnv();
  CLI::App app{"Cortado: a data-parallel training engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cortado 0.1.0");
  AddTrainCommand(app);
  AddEvalCommand(app);
  AddConvertCommand(app);
  AddLaunchCommand(app);
  AddInspectCommand(app);
  AddBenchCommand(app);
  std::string command = argc > 1 ? argv[1] : "";
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    // In a multi-rank job the prefix says which rank is speaking ("rank 1: ").
    std::fprintf(stderr, "cortado %s: error: %s%s\n", command.c_str(),
                 cortado::LogPrefix().c_str(), e.what());
    return 1;
  }
  return ExitCode();
}
