// `cortado train --config F [--set k=v]... [--resume auto|PATH] [--weights F.safetensors]
//  [--weights-partial] [--metrics PATH] [--threads N] [--stop-at-iter N] [--trace PATH
//  [--trace-iters N]]
//  [--overwrite] [--dry-run]`; under `cortado launch`, mpirun or srun, one rank of a data-parallel
//  job. Exits 0 at the end of training, 128 + the
// signal after SIGINT/SIGTERM (130 after --stop-at-iter), having saved a checkpoint and printed
// the command that resumes.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/base/log.h"
#include "engine/base/thread_pool.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/file_kind.h"
#include "tools/stop_signals.h"
#include "tools/trainer.h"
#include "tools/world.h"

namespace cortado::tools {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string device;
  std::string resume;
  std::string weights;
  bool weights_partial = false;
  std::string metrics;
  int threads = 0;
  int64_t stop_at = 0;
  bool no_progress = false;
  std::string trace;
  int64_t trace_iters = 20;
  bool dry_run = false;
  bool overwrite = false;
};

namespace fs = std::filesystem;

// A file that training appends to (metrics) or rewrites (trace): opened for appending when it
// exists (changing nothing), else created and removed.
void ProbeFile(const std::string& what, const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path, ec)) {
    CORTADO_CHECK(std::ofstream(path, std::ios::app).good(), what, ": cannot write '",
                  path.string(), "'");
    return;
  }
  const fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const fs::path created = FirstMissing(parent);
  fs::create_directories(parent, ec);
  const bool ok = !ec && std::ofstream(path).good();
  fs::remove(path, ec);
  if (!created.empty()) fs::remove_all(created, ec);
  CORTADO_CHECK(ok, what, ": cannot create '", path.string(), "'");
}

// --dry-run: everything training does before its first step, in this process alone, and a
// report on stdout.
int DryRun(RunConfig config, const TrainOptions& options) {
  const std::string file = config.file;
  const std::string resolved = config.resolved_yaml;
  const std::string ckpt_dir = config.checkpoint.dir;
  const RunConfig copy = config;
  Trainer trainer(std::move(config));
  // Checks the checkpoint it would resume from, and that the run may use its folder.
  const RunFolder folder = trainer.RunFolderOf(options);
  trainer.Start(options.resume, &folder);
  if (!options.metrics_path.empty()) ProbeFile("--metrics", options.metrics_path);
  if (!options.trace_path.empty()) ProbeFile("--trace", options.trace_path);
  std::printf("# resolved config (%s with the --set overrides)\n%s\n", file.c_str(),
              resolved.c_str());
  std::printf("%s", NetTable(trainer.net()).c_str());
  std::printf("%s", LayoutSummary(copy, trainer.net()).c_str());
  std::unique_ptr<BatchSource> train = MakeTrainSource(copy.data, ShardSpec{}, copy.seed);
  std::printf("%s", DataSummary(copy, *train).c_str());
  std::printf("training: from iteration %lld to %lld; checkpoints in '%s'%s%s\n",
              static_cast<long long>(trainer.iteration()),
              static_cast<long long>(trainer.max_iter()), ckpt_dir.c_str(),
              options.metrics_path.empty() ? "" : ", metrics to ", options.metrics_path.c_str());
  if (options.overwrite && CountCheckpoints(ckpt_dir) > 0) {
    std::printf("--overwrite: training would first delete the %d checkpoint(s) in '%s'%s\n",
                CountCheckpoints(ckpt_dir), ckpt_dir.c_str(),
                options.metrics_path.empty() ? "" : " and empty the metrics file");
  }
  std::printf(
      "dry run: the config, net, data and output paths are fine; nothing was trained "
      "or written\n");
  return 0;
}

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

namespace {

// The flags checked and turned into options; --weights and --weights-partial become --set
// overrides of their config keys.
TrainOptions CheckTrainArgs(TrainArgs& args) {
  if (!args.metrics.empty()) CheckOutputFile("--metrics", args.metrics);
  if (!args.trace.empty()) CheckOutputFile("--trace", args.trace);
  if (!args.resume.empty() && args.resume != "auto") {
    CheckInputFile("--resume", args.resume,
                   "a checkpoint file (ckpt-*.cortado), or 'auto' for the newest in "
                   "checkpoint.dir");
    ExpectCheckpoint("--resume", args.resume,
                     "start a run from its weights with --weights " + args.resume);
  }
  if (!args.weights.empty()) {
    CheckInputFile("--weights", args.weights, "a safetensors file (cortado export)");
    ExpectSafetensors("--weights", args.weights);
    args.sets.push_back("model.weights=" + args.weights);
  }
  if (args.weights_partial) args.sets.push_back("model.weights_partial=true");
  if (!args.device.empty()) args.sets.push_back("device=" + args.device);
  if (args.overwrite && !args.resume.empty()) {
    UsageFail("--overwrite starts a run over; it cannot be combined with --resume");
  }
  TrainOptions options;
  options.resume = args.resume;
  options.overwrite = args.overwrite;
  options.metrics_path = args.metrics;
  options.progress_bar = !args.no_progress && isatty(STDOUT_FILENO);
  options.stop_at = args.stop_at;
  options.trace_path = args.trace;
  options.trace_iters = args.trace_iters;
  options.argv = CommandLine();
  return options;
}

// --dry-run. Data that is not on this machine fails it as it would fail training, but the net
// is still shown where the config alone says what it is.
void RunDryRun(const TrainArgs& args, const TrainOptions& options) {
  ApplyThreadBudget(args.threads);
  RunConfig config;
  try {
    config = LoadRunConfig(args.config, args.sets);
  } catch (const Error&) {
    try {
      std::printf("%s", NetTableWithoutData(LoadRunConfig(args.config, args.sets,
                                                          /*need_train=*/true,
                                                          /*check_data=*/false))
                            .c_str());
    } catch (const Error&) {
    }
    throw;
  }
  SetExitCode(DryRun(std::move(config), options));
}

void RunTrain(TrainArgs& args) {
  const TrainOptions options = CheckTrainArgs(args);
  if (args.dry_run) return RunDryRun(args, options);
  // SIGINT/SIGTERM finish the current step, save a checkpoint and exit non-zero. Set up
  // first: the threads started below must inherit the blocked signals (stop_signals.h).
  StopSignals stop;
  RunConfig config = LoadRunConfig(args.config, args.sets);
  World world = JoinWorld(config.distributed);
  JoinAsRank(world);
  ApplyThreadBudget(args.threads, world.local_size);
  Trainer trainer(std::move(config), std::move(world));
  int code = trainer.Run(options, stop.flag());
  if (code == 0 && trainer.world().rank == 0) {
    const EvalResult& e = trainer.last_eval();
    if (e.images > 0 && e.detection) {
      LogInfo("done: mAP@0.5 ", e.map50 * 100, "%  mAP ", e.map * 100, "% on ", e.images,
              " validation images");
    } else if (e.images > 0) {
      LogInfo("done: top1 ", e.top1 * 100, "%  top5 ", e.top5 * 100, "% on ", e.images,
              " validation images");
    } else {
      LogInfo("done");
    }
  }
  // Stopped by a signal: 128 + its number, the shell's convention (130 SIGINT, 143 SIGTERM);
  // --stop-at-iter, or a stop another rank voted for, reads as SIGINT.
  if (code != 0 && stop.signal() != 0) code = 128 + stop.signal();
  SetExitCode(code);
}

}  // namespace

void AddTrainCommand(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a YAML config");
  cmd->add_option("--config", args->config, "YAML config file")->required();
  cmd->add_option("--set", args->sets, "Override a config key: --set solver.base_lr=0.05");
  cmd->add_option("--device", args->device,
                  "Where to train: cpu, test[:N] (the guarded host-memory test device) or "
                  "cuda[:N]. Same as --set device=...");
  cmd->add_option("--resume", args->resume,
                  "'auto' (the newest valid checkpoint in checkpoint.dir) or a checkpoint file");
  cmd->add_option("--weights", args->weights,
                  "Initialize from a safetensors file (cortado export, or torchvision's names): "
                  "a final classifier of another shape (another class count) is listed and left "
                  "at its initialization; any other difference is refused. Same as --set "
                  "model.weights=PATH; a resumed run continues from its checkpoint instead");
  cmd->add_flag("--weights-partial", args->weights_partial,
                "With --weights: load what fits even where the model differs outside its final "
                "classifier (another architecture). Same as --set model.weights_partial=true");
  cmd->add_option("--metrics", args->metrics, "Write JSON-lines metrics to this file");
  cmd->add_option("--threads", args->threads,
                  "Thread budget per rank (0: CORTADO_NUM_THREADS, else the cores divided among "
                  "the ranks on this machine)")
      ->check(IntAtLeast(0, "0: the default budget"));
  cmd->add_flag("--no-progress", args->no_progress, "No live progress bar");
  cmd->add_option("--stop-at-iter", args->stop_at,
                  "Stop at this iteration as if interrupted: checkpoint, exit 130 (for job time "
                  "limits; resume with --resume auto)")
      ->check(IntAtLeast(1))
      ->default_str("none: run to the end");
  cmd->add_option("--trace", args->trace,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of the first iterations to "
                  "this file (per rank: PATH with .rank<r> before the extension)");
  cmd->add_option("--trace-iters", args->trace_iters, "Iterations the trace records (0: all)")
      ->check(IntAtLeast(0, "0: all"));
  cmd->add_flag("--overwrite", args->overwrite,
                "Start over in a checkpoint.dir an earlier run left checkpoints in: delete them "
                "(and empty the --metrics file) first. Without it such a start is refused");
  cmd->add_flag("--dry-run", args->dry_run,
                "Check the config, build the net, open the data, check that the outputs can be "
                "written, print the resolved config and the net, and exit without training");
  cmd->callback([args] { RunTrain(*args); });
}

}  // namespace cortado::tools
