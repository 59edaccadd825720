// `cortado train --config F [--set k=v]... [--resume auto|PATH] [--metrics PATH] [--threads N]
//  [--trace PATH [--trace-iters N]]`; under `cortado launch`, mpirun or srun, one rank of a
// data-parallel job.
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "engine/log.h"
#include "engine/thread_pool.h"
#include "tools/commands.h"
#include "tools/stop_signals.h"
#include "tools/trainer.h"
#include "tools/world.h"

namespace cortado::tools {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string resume;
  std::string metrics;
  int threads = 0;
  int64_t stop_at = 0;
  bool no_progress = false;
  std::string trace;
  int64_t trace_iters = 20;
};

}  // namespace

void ApplyThreadBudget(int threads, int local_ranks) {
  if (threads > 0) return SetNumThreads(threads);
  if (std::getenv("CORTADO_NUM_THREADS") != nullptr || local_ranks <= 1) {
    return SetNumThreads(DefaultNumThreads());
  }
  // Ranks on one machine share its cores.
  SetNumThreads(std::max(1, DefaultNumThreads() / local_ranks));
}

void JoinAsRank(const World& world) {
  if (world.rank == 0) return;
  // Rank 0 tells the story; the others speak only about trouble, and say who they are.
  SetLogPrefix(StrCat("rank ", world.rank, ": "));
  if (!LogLevelFromEnv()) SetLogLevel(LogLevel::kWarning);
}

void AddTrainCommand(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a YAML config");
  cmd->add_option("--config", args->config, "YAML config file")->required();
  cmd->add_option("--set", args->sets, "Override a config key: --set solver.base_lr=0.05");
  cmd->add_option("--resume", args->resume, "'auto' (newest valid checkpoint) or a path");
  cmd->add_option("--metrics", args->metrics, "Write JSON-lines metrics to this file");
  cmd->add_option("--threads", args->threads,
                  "Thread budget per rank (default: CORTADO_NUM_THREADS, else the cores "
                  "divided among the ranks on this machine)");
  cmd->add_flag("--no-progress", args->no_progress, "No live progress bar");
  cmd->add_option("--stop-at-iter", args->stop_at,
                  "Stop at this iteration as if interrupted: checkpoint, exit 130 (for job time "
                  "limits; resume with --resume auto)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--trace", args->trace,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of the first iterations to "
                  "this file (per rank: PATH with .rank<r> before the extension)");
  cmd->add_option("--trace-iters", args->trace_iters,
                  "Iterations the trace records (default 20; 0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([args] {
    // SIGINT/SIGTERM finish the current step, save a checkpoint and exit non-zero. Set up
    // first: the threads started below must inherit the blocked signals (stop_signals.h).
    StopSignals stop;
    RunConfig config = LoadRunConfig(args->config, args->sets);
    World world = JoinWorld(config.distributed);
    JoinAsRank(world);
    ApplyThreadBudget(args->threads, world.local_size);
    Trainer trainer(std::move(config), std::move(world));
    TrainOptions options;
    options.resume = args->resume;
    options.metrics_path = args->metrics;
    options.progress_bar = !args->no_progress && isatty(STDOUT_FILENO);
    options.stop_at = args->stop_at;
    options.trace_path = args->trace;
    options.trace_iters = args->trace_iters;
    int code = trainer.Run(options, stop.flag());
    if (code == 0 && trainer.world().rank == 0) {
      const EvalResult& e = trainer.last_eval();
      if (e.images > 0) {
        LogInfo("done: top1 ", e.top1 * 100, "%  top5 ", e.top5 * 100, "% on ", e.images,
                " validation images");
      } else {
        LogInfo("done");
      }
    }
    SetExitCode(code);
  });
}

}  // namespace cortado::tools
