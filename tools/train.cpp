// `cortado train --config F [--set k=v]... [--resume auto|PATH] [--metrics PATH] [--threads N]`
#include <unistd.h>

#include <atomic>
#include <csignal>

#include "engine/log.h"
#include "engine/thread_pool.h"
#include "tools/commands.h"
#include "tools/trainer.h"

namespace cortado::tools {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void OnStopSignal(int) { g_stop = true; }

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string resume;
  std::string metrics;
  int threads = 0;
  int64_t stop_at = 0;
  bool no_progress = false;
};

}  // namespace

void ApplyThreadBudget(int threads) { SetNumThreads(threads > 0 ? threads : DefaultNumThreads()); }

void AddTrainCommand(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a YAML config");
  cmd->add_option("--config", args->config, "YAML config file")->required();
  cmd->add_option("--set", args->sets, "Override a config key: --set solver.base_lr=0.05");
  cmd->add_option("--resume", args->resume, "'auto' (newest valid checkpoint) or a path");
  cmd->add_option("--metrics", args->metrics, "Write JSON-lines metrics to this file");
  cmd->add_option("--threads", args->threads,
                  "Thread budget (default: CORTADO_NUM_THREADS, else all cores)");
  cmd->add_flag("--no-progress", args->no_progress, "No live progress bar");
  cmd->add_option("--stop-at-iter", args->stop_at,
                  "Stop at this iteration as if interrupted: checkpoint, exit 130 (for job time "
                  "limits; resume with --resume auto)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([args] {
    RunConfig config = LoadRunConfig(args->config, args->sets);
    ApplyThreadBudget(args->threads);
    Trainer trainer(std::move(config));
    TrainOptions options;
    options.resume = args->resume;
    options.metrics_path = args->metrics;
    options.progress_bar = !args->no_progress && isatty(STDOUT_FILENO);
    options.stop_at = args->stop_at;
    // SIGINT/SIGTERM finish the current step, save a checkpoint and exit non-zero.
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    int code = trainer.Run(options, &g_stop);
    if (code == 0) {
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
