// Subcommands of the `cortado` binary. Each lives in its own file and adds itself to the CLI11
// app; its callback stores the process exit code with SetExitCode. Errors are thrown as
// cortado::Error (or std::exception; exit 1) or tools::UsageError (a flag the command cannot
// use; exit 2, tools/command_line.h) and printed as one line by main.
#pragma once

#include <CLI/CLI.hpp>

namespace cortado {
struct World;
}

namespace cortado::tools {

void SetExitCode(int code);
// Sets the engine's thread budget: threads > 0, else CORTADO_NUM_THREADS, else the cores
// divided among the local_ranks ranks of a job that share this machine.
void ApplyThreadBudget(int threads, int local_ranks = 1);
int ExitCode();
// A rank of a multi-rank job: its log lines carry its rank, and ranks other than 0 log only
// warnings and errors (unless CORTADO_LOG_LEVEL says otherwise).
void JoinAsRank(const World& world);

void AddTrainCommand(CLI::App& app);
void AddEvalCommand(CLI::App& app);
void AddConvertCommand(CLI::App& app);
void AddLaunchCommand(CLI::App& app);
void AddInspectCommand(CLI::App& app);
void AddExportCommand(CLI::App& app);

// `cortado bench <what>`: one subcommand per benchmark.
void AddBenchCommand(CLI::App& app);
void AddBenchTrainCommand(CLI::App& bench);
void AddBenchDataCommand(CLI::App& bench);
void AddBenchCommCommand(CLI::App& bench);
void AddBenchCodecCommand(CLI::App& bench);

}  // namespace cortado::tools
