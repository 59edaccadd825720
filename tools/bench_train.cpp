// `cortado bench train --config F [--iters N] [--warmup W] [--json] [--profile]`: training
// throughput of the config's model and data, without evaluation or checkpoints. --profile
// adds the per-layer forward/backward time, to see where a step goes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "engine/thread_pool.h"
#include "tools/commands.h"
#include "tools/trainer.h"

namespace cortado::tools {

void AddBenchTrainCommand(CLI::App& bench) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    int64_t iters = 50, warmup = 5;
    bool json = false, profile = false;
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand("train", "Training throughput (images/s) of a config");
  cmd->add_option("--config", args->config, "YAML config file")->required();
  cmd->add_option("--set", args->sets, "Override a config key");
  cmd->add_option("--iters", args->iters, "Timed iterations")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", args->warmup, "Untimed iterations first")->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", args->threads, "Thread budget");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--profile", args->profile, "Per-layer time");
  cmd->callback([args] {
    RunConfig config = LoadRunConfig(args->config, args->sets);
    ApplyThreadBudget(args->threads);
    std::unique_ptr<BatchSource> source = MakeTrainSource(config.data, ShardSpec{}, config.seed);
    NetSpec spec = MakeNetSpec(config, source->sample_shape(), source->num_classes(),
                               config.data.batch_size);
    Net net(spec, config.seed);
    SgdSolver solver(net.params(), config.solver.sgd);
    Batch batch;
    std::map<std::string, std::pair<double, double>> per_layer;  // name -> (fwd, bwd) seconds
    std::vector<std::string> order;
    double data_s = 0;
    auto step = [&](int64_t it, bool timed) {
      auto t0 = std::chrono::steady_clock::now();
      source->Next(batch);
      if (timed) data_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      net.input("data") = batch.images;
      net.input("label") = batch.labels;
      net.set_iteration(it);
      net.Forward();
      net.Backward();
      solver.Step(config.solver.schedule.base_lr);
      if (timed && args->profile) {
        for (const auto& t : net.layer_times()) {
          if (!per_layer.count(t.name)) order.push_back(t.name);
          per_layer[t.name].first += t.forward_s;
          per_layer[t.name].second += t.backward_s;
        }
      }
    };
    source->Start(0, 0);
    for (int64_t i = 0; i < args->warmup; ++i) step(i, false);
    net.set_profiling(args->profile);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < args->iters; ++i) step(args->warmup + i, true);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double img_per_s = args->iters * config.data.batch_size / seconds;
    std::string model = config.model.builder.empty() ? "graph" : config.model.builder;
    if (args->json) {
      std::printf("{\"model\":\"%s\",\"batch\":%lld,\"threads\":%d,\"iters\":%lld,"
                  "\"img_per_s\":%.2f,\"ms_per_iter\":%.3f,\"data_ms_per_iter\":%.3f",
                  model.c_str(), static_cast<long long>(config.data.batch_size), NumThreads(),
                  static_cast<long long>(args->iters), img_per_s, 1000 * seconds / args->iters,
                  1000 * data_s / args->iters);
      if (args->profile) {
        std::printf(",\"layers\":[");
        for (size_t i = 0; i < order.size(); ++i) {
          auto [f, b] = per_layer[order[i]];
          std::printf("%s{\"name\":\"%s\",\"forward_ms\":%.3f,\"backward_ms\":%.3f}", i ? "," : "",
                      order[i].c_str(), 1000 * f / args->iters, 1000 * b / args->iters);
        }
        std::printf("]");
      }
      std::printf("}\n");
    } else {
      std::printf("%s: batch %lld, %d thread(s): %.1f img/s (%.2f ms/iter, data %.2f ms/iter)\n",
                  model.c_str(), static_cast<long long>(config.data.batch_size), NumThreads(),
                  img_per_s, 1000 * seconds / args->iters, 1000 * data_s / args->iters);
      if (args->profile) {
        std::printf("%-26s %10s %10s %7s\n", "layer", "fwd ms", "bwd ms", "share");
        for (const std::string& name : order) {
          auto [f, b] = per_layer[name];
          std::printf("%-26s %10.3f %10.3f %6.1f%%\n", name.c_str(), 1000 * f / args->iters,
                      1000 * b / args->iters, 100 * (f + b) / seconds);
        }
      }
    }
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
