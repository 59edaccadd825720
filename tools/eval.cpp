// `cortado eval --checkpoint PATH|auto [--config F] [--set k=v]... [--json] [--threads N]`:
// evaluates a checkpoint on the validation data; `--weights F.safetensors --config F` a
// weights file (cortado export, or torchvision's names), strictly: every tensor must fit. Without
// --config the config stored in the checkpoint (the resolved YAML of the run that wrote it) is
// used, and --set overrides it (a data.val path on another machine); --config replaces it.
// `--checkpoint auto` takes the newest loadable checkpoint in the config's checkpoint.dir, so it
// needs --config. Under `cortado launch`, mpirun or srun the ranks split the validation set and
// rank 0 prints the totals. The net is built for inference (engine/net.h: no gradients, no
// solver state, each activation's buffer reused once the next layer has read it).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "data/class_names.h"
#include "engine/checkpoint.h"
#include "engine/log.h"
#include "engine/safetensors.h"
#include "engine/thread_pool.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/file_kind.h"
#include "tools/trainer.h"
#include "tools/weights.h"
#include "tools/world.h"

namespace cortado::tools {

void AddEvalCommand(CLI::App& app) {
  struct Args {
    std::string config, checkpoint, weights;
    std::vector<std::string> sets;
    bool json = false;
    bool no_progress = false;
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Evaluate a checkpoint (or a weights file) on the validation data");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint file, or 'auto': the newest valid one in the config's "
                  "checkpoint.dir (needs --config)");
  cmd->add_option("--weights", args->weights,
                  "Evaluate a safetensors weights file instead (needs --config for the model and "
                  "data; every tensor must match the model)");
  cmd->add_option("--config", args->config,
                  "YAML config file (default: the config stored in the checkpoint)");
  cmd->add_option("--set", args->sets,
                  "Override a config key, e.g. --set data.val=PATH (applies to either config)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_option("--threads", args->threads,
                  "Thread budget per rank (0: CORTADO_NUM_THREADS, else the cores divided among "
                  "the ranks on this machine)")
      ->check(IntAtLeast(0, "0: the default budget"));
  cmd->add_flag("--no-progress", args->no_progress,
                "Accepted for symmetry with train (eval draws no progress bar)");
  cmd->callback([args] {
    if (!args->checkpoint.empty() && !args->weights.empty()) {
      UsageFail("give --checkpoint or --weights, not both: a checkpoint holds its own weights");
    }
    if (args->checkpoint.empty() && args->weights.empty()) {
      UsageFail("give --checkpoint (a checkpoint, or auto) or --weights (a safetensors file)");
    }
    if (!args->weights.empty() && args->config.empty()) {
      UsageFail("--weights needs --config: a weights file holds no model or data settings");
    }
    if (args->checkpoint == "auto" && args->config.empty()) {
      UsageFail("--checkpoint auto needs --config, whose checkpoint.dir it searches");
    }
    Checkpoint ckpt;
    std::string ckpt_path = args->checkpoint;
    RunConfig config;
    if (!args->weights.empty()) {
      CheckInputFile("--weights", args->weights, "a safetensors file (cortado export)");
      ExpectSafetensors("--weights", args->weights);
      config = LoadRunConfig(args->config, args->sets, /*need_train=*/false);
    } else if (ckpt_path == "auto") {
      config = LoadRunConfig(args->config, args->sets, /*need_train=*/false);
      ckpt_path = NewestLoadableCheckpoint(config.checkpoint.dir, &ckpt, Net::IsNetState);
      CORTADO_CHECK(!ckpt_path.empty(), "--checkpoint auto: no valid checkpoint in '",
                    config.checkpoint.dir, "' (checkpoint.dir of ", args->config, ")");
    } else {
      CheckInputFile("--checkpoint", ckpt_path, "a checkpoint file (ckpt-*.cortado)");
      ExpectCheckpoint("--checkpoint", ckpt_path,
                       "evaluate it with --weights " + ckpt_path + " --config F");
      ckpt = LoadCheckpoint(ckpt_path, Net::IsNetState);  // no solver state
      if (!args->config.empty()) {
        config = LoadRunConfig(args->config, args->sets, /*need_train=*/false);
      } else {
        auto stored = ckpt.meta.find("config");
        CORTADO_CHECK(stored != ckpt.meta.end(), "checkpoint '", ckpt_path,
                      "' holds no config; give --config");
        YamlConfig yaml = YamlConfig::FromString(stored->second, ckpt_path + " (stored config)");
        for (const std::string& o : args->sets) yaml.Set(o);
        config = ParseRunConfig(yaml, /*need_train=*/false);
      }
    }
    CORTADO_CHECK(HasValidation(config.data), config.file,
                  config.data.type == "synthetic"
                      ? ": data.synthetic.val_samples is 0; there is nothing to evaluate on "
                        "(--set data.synthetic.val_samples=N)"
                      : ": data.val is not set; there is nothing to evaluate on "
                        "(--set data.val=PATH)");
    const std::string classes_warning = CheckClassNames(config.data);
    World world = JoinWorld(config.distributed);
    JoinAsRank(world);
    ApplyThreadBudget(args->threads, world.local_size);
    std::unique_ptr<BatchSource> val =
        MakeEvalSource(config.data, ShardSpec{world.rank, world.size});
    int64_t batch =
        config.data.val_batch_size > 0 ? config.data.val_batch_size : config.data.batch_size;
    NetSpec spec = MakeNetSpec(config, val->sample_shape(), val->num_classes(), batch);
    // An inference net: the checkpoint's weights and batch-norm statistics load without any
    // gradient or solver state, and activations go back to the pool once read.
    NetOptions options;
    options.mode = NetMode::kInference;
    Net net(spec, config.seed, config.precision.compute, options);
    if (args->weights.empty()) {
      net.LoadState(ckpt, ckpt_path);
      ckpt.tensors = {};  // the net holds its own copy: not the weights twice while evaluating
    } else {
      LoadWeights(net, config.model.builder, LoadSafetensors(args->weights), args->weights,
                  /*strict=*/true);
    }
    const std::string source =
        args->weights.empty() ? "checkpoint " + ckpt_path : "weights " + args->weights;
    EvalResult r = Evaluate(net, *val, world.comm.get());
    CORTADO_CHECK(r.images > 0, "no record of ", config.data.val,
                  " could be read; there is nothing to evaluate");
    if (world.rank != 0) return SetExitCode(0);
    if (!classes_warning.empty()) LogWarning(classes_warning);
    if (r.skipped > 0) {
      LogWarning(r.skipped, " unreadable record(s) of ", config.data.val,
                 " were left out of the evaluation (the first are named above)");
    }
    if (args->json) {
      nlohmann::ordered_json j;
      j["top1"] = r.top1;
      j["top5"] = r.top5;
      j["loss"] = r.loss;
      j["images"] = r.images;
      j["skipped"] = r.skipped;
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      const std::string skipped =
          r.skipped > 0 ? StrCat(r.skipped, " unreadable record(s) skipped, ") : std::string();
      std::printf("top1 %.2f%%  top5 %.2f%%  loss %.4f  (%lld images, %s%s)\n", r.top1 * 100,
                  r.top5 * 100, r.loss, static_cast<long long>(r.images), skipped.c_str(),
                  source.c_str());
    }
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
