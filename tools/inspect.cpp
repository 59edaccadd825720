// `cortado inspect --config F` prints the resolved config and the net (layers, shapes,
// parameter count); `cortado inspect --checkpoint PATH` lists a checkpoint's contents.
#include <cstdio>

#include "engine/checkpoint.h"
#include "tools/commands.h"
#include "tools/trainer.h"

namespace cortado::tools {

void AddInspectCommand(CLI::App& app) {
  struct Args {
    std::string config, checkpoint;
    std::vector<std::string> sets;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a config's net or a checkpoint's contents");
  cmd->add_option("--config", args->config, "YAML config file");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint file");
  cmd->add_option("--set", args->sets, "Override a config key");
  cmd->callback([args] {
    CORTADO_CHECK(!args->config.empty() || !args->checkpoint.empty(),
                  "give --config and/or --checkpoint");
    if (!args->config.empty()) {
      RunConfig config = LoadRunConfig(args->config, args->sets);
      std::unique_ptr<BatchSource> source = MakeTrainSource(config.data, ShardSpec{}, config.seed);
      NetSpec spec = MakeNetSpec(config, source->sample_shape(), source->num_classes(),
                                 config.data.batch_size);
      Net net(spec, config.seed, config.precision.compute);
      std::printf("%s", net.Summary().c_str());
      std::printf("data: %lld samples, %lld batches of %lld per epoch, sample %s\n",
                  static_cast<long long>(source->samples_per_epoch()),
                  static_cast<long long>(source->batches_per_epoch()),
                  static_cast<long long>(config.data.batch_size),
                  ShapeString(source->sample_shape()).c_str());
    }
    if (!args->checkpoint.empty()) {
      Checkpoint ckpt = LoadCheckpoint(args->checkpoint);
      for (const auto& [k, v] : ckpt.meta) {
        if (k != "config") std::printf("%-18s %s\n", k.c_str(), v.c_str());
      }
      int64_t total = 0;
      for (const auto& [name, t] : ckpt.tensors) total += t.numel();
      std::printf("%zu tensors, %lld values\n", ckpt.tensors.size(), static_cast<long long>(total));
    }
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
