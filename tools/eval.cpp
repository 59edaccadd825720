// `cortado eval --config F --checkpoint PATH [--json] [--set k=v]...`; under `cortado launch`,
// mpirun or srun the ranks split the validation set and rank 0 prints the totals.
#include <cstdio>

#include "engine/checkpoint.h"
#include "engine/log.h"
#include "engine/thread_pool.h"
#include "tools/commands.h"
#include "tools/trainer.h"
#include "tools/world.h"

namespace cortado::tools {

void AddEvalCommand(CLI::App& app) {
  struct Args {
    std::string config, checkpoint;
    std::vector<std::string> sets;
    bool json = false;
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("eval", "Evaluate a checkpoint on the config's validation data");
  cmd->add_option("--config", args->config, "YAML config file")->required();
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint file")->required();
  cmd->add_option("--set", args->sets, "Override a config key");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_option("--threads", args->threads, "Thread budget per rank");
  cmd->callback([args] {
    RunConfig config = LoadRunConfig(args->config, args->sets);
    CORTADO_CHECK(!config.data.val.empty() || config.data.type == "synthetic",
                  args->config, ": data.val is not set; there is nothing to evaluate on");
    World world = JoinWorld(config.distributed);
    JoinAsRank(world);
    ApplyThreadBudget(args->threads, world.local_size);
    Checkpoint ckpt = LoadCheckpoint(args->checkpoint);
    std::unique_ptr<BatchSource> val =
        MakeEvalSource(config.data, ShardSpec{world.rank, world.size});
    int64_t batch = config.data.val_batch_size > 0 ? config.data.val_batch_size
                                                   : config.data.batch_size;
    NetSpec spec = MakeNetSpec(config, val->sample_shape(), val->num_classes(), batch);
    Net net(spec, config.seed, config.precision.compute);
    net.LoadState(ckpt, args->checkpoint);
    EvalResult r = Evaluate(net, *val, world.comm.get());
    if (world.rank != 0) return SetExitCode(0);
    if (args->json) {
      std::printf("{\"top1\":%.6f,\"top5\":%.6f,\"loss\":%.6f,\"images\":%lld}\n", r.top1, r.top5,
                  r.loss, static_cast<long long>(r.images));
    } else {
      std::printf("top1 %.2f%%  top5 %.2f%%  loss %.4f  (%lld images, checkpoint %s)\n",
                  r.top1 * 100, r.top5 * 100, r.loss, static_cast<long long>(r.images),
                  args->checkpoint.c_str());
    }
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
