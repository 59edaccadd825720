// Subcommands of the `cortado` binary. Each lives in its own file and adds itself to the CLI11
// app; its callback stores the process exit code with SetExitCode. Errors are thrown as
// cortado::Error (or std::exception) and printed as one line by main.
#pragma once

#include <CLI/CLI.hpp>

namespace cortado::tools {

void SetExitCode(int code);
// Sets the engine's thread budget: threads > 0, else CORTADO_NUM_THREADS, else all cores.
void ApplyThreadBudget(int threads);
int ExitCode();

void AddTrainCommand(CLI::App& app);
void AddEvalCommand(CLI::App& app);
void AddConvertCommand(CLI::App& app);
void AddLaunchCommand(CLI::App& app);
void AddInspectCommand(CLI::App& app);

// `cortado bench <what>`: one subcommand per benchmark.
void AddBenchCommand(CLI::App& app);
void AddBenchTrainCommand(CLI::App& bench);
void AddBenchDataCommand(CLI::App& bench);
void AddBenchCommCommand(CLI::App& bench);

}  // namespace cortado::tools
