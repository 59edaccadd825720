// `cortado bench train --config F [--iters N] [--warmup W] [--json] [--profile] [--infer]`:
// training throughput of the config's model and data, without evaluation or checkpoints, and
// the run's peak memory (and the activations' planned and measured peak, engine/memory_plan.h).
// --profile adds the per-layer forward/backward time and GFLOP/s, to see where a step goes;
// --infer measures forward passes of an inference net instead (test phase, no gradients, no
// solver, no training step first). Under `cortado launch`
// (or mpirun, srun) it measures data-parallel training: global images/s, and how much of each
// step was spent waiting for gradients (the exposed communication).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/log.h"
#include "engine/math.h"
#include "engine/thread_pool.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/trainer.h"
#include "tools/world.h"

namespace cortado::tools {
namespace {

// The process's peak resident memory so far, in MB (what the kernel counts: weights, gradients,
// activations, workspaces, the loader's buffers and the libraries).
double PeakRssMb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KB on Linux
}

// What this machine's matrix multiply reaches with the thread budget: the best of 3 runs of a
// 2048^3 fp32 GEMM (the engine's ParallelGemm, which the convolutions use), in GFLOP/s.
double MeasuredGemmPeak() {
  const int64_t n = 2048;
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a.size(), 0.0f);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ParallelGemm<float>(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

}  // namespace

void AddBenchTrainCommand(CLI::App& bench) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    int64_t iters = 50, warmup = 5;
    bool json = false, profile = false, infer = false;
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand("train", "Training throughput (images/s) of a config");
  cmd->add_option("--config", args->config, "YAML config file")->required();
  cmd->add_option("--set", args->sets, "Override a config key");
  cmd->add_option("--iters", args->iters, "Timed iterations")->check(IntAtLeast(1));
  cmd->add_option("--warmup", args->warmup, "Untimed iterations first")->check(IntAtLeast(0));
  cmd->add_option("--threads", args->threads,
                  "Thread budget per rank (0: CORTADO_NUM_THREADS, else the cores divided among "
                  "the ranks on this machine)")
      ->check(IntAtLeast(0, "0: the default budget"));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--profile", args->profile, "Per-layer time");
  cmd->add_flag("--infer", args->infer,
                "Inference instead: forward passes of an inference net (test phase, no gradients "
                "or solver state, activations given back once read)");
  cmd->callback([args] {
    RunConfig config = LoadRunConfig(args->config, args->sets);
    // Long enough for any run length: the schedule plays no part in a throughput measurement.
    config.solver.epoch_based = false;
    config.solver.max_iter = args->warmup + args->iters + 1;
    World world = JoinWorld(config.distributed);
    JoinAsRank(world);
    ApplyThreadBudget(args->threads, world.local_size);
    const int rank = world.rank, ranks = world.size;
    // Training runs the trainer's steps; --infer an inference net alone (no gradients, no
    // solver state, activations given back as soon as the next layer has read them) on one
    // batch of the training data, fed once.
    std::unique_ptr<Trainer> trainer;
    std::unique_ptr<Net> infer_net;
    if (args->infer) {
      std::unique_ptr<BatchSource> source =
          MakeTrainSource(config.data, ShardSpec{world.rank, world.size}, config.seed);
      NetOptions options;
      options.mode = NetMode::kInference;
      infer_net = std::make_unique<Net>(MakeNetSpec(config, source->sample_shape(),
                                                    source->num_classes(), config.data.batch_size),
                                        config.seed, config.precision.compute, options);
      source->Start(0, 0);
      Batch batch;
      CORTADO_CHECK(source->Next(batch), config.data.train, ": no batch to measure on");
      FeedBatch(*infer_net, batch);
      for (int64_t i = 0; i < args->warmup; ++i) infer_net->Forward();
    } else {
      trainer = std::make_unique<Trainer>(config, std::move(world));
      trainer->Start("");
      for (int64_t i = 0; i < args->warmup; ++i) trainer->Step();
    }
    Net& net = args->infer ? *infer_net : trainer->net();
    std::map<std::string, std::pair<double, double>> per_layer;  // name -> (fwd, bwd) seconds
    std::vector<std::string> order;
    net.set_profiling(args->profile);
    StepTimes sum;
    std::vector<double> step_s;
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < args->iters; ++i) {
      auto s0 = std::chrono::steady_clock::now();
      StepTimes t;
      if (args->infer) {
        net.Forward();
        t.compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      } else {
        t = trainer->Step();
      }
      step_s.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
      sum.data_wait += t.data_wait;
      sum.compute += t.compute;
      sum.comm_wait += t.comm_wait;
      sum.sync_bn += t.sync_bn;
      if (args->profile) {
        for (const auto& l : net.layer_times()) {
          if (!per_layer.count(l.name)) order.push_back(l.name);
          per_layer[l.name].first += l.forward_s;
          per_layer[l.name].second += l.backward_s;
        }
      }
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double peak_rss_mb = PeakRssMb();
    if (rank != 0) return SetExitCode(0);
    // Per-layer arithmetic, for GFLOP/s: forward as the layer counts it, backward twice that
    // (the input and the weight gradient; the first layer computes only the latter).
    std::map<std::string, double> flops;
    for (const auto& layer : net.layers()) flops[layer->name()] = layer->ForwardFlops();
    const double gemm_peak = args->profile ? MeasuredGemmPeak() : 0.0;
    auto gflops = [](double f, double s) { return s > 0 ? f / s / 1e9 : 0.0; };
    std::sort(step_s.begin(), step_s.end());
    const double median = step_s[step_s.size() / 2];
    const double n = static_cast<double>(args->iters);
    const double img_per_s = n * static_cast<double>(config.data.batch_size * ranks) / seconds;
    // Activations and, in training, their gradients: the plan's peak (the largest set alive at
    // once), the pool's measured high-water mark, and the storage the pool holds for it (the
    // plan's arena); activation_grad_mb is 0, the gradients being in the plan.
    const double planned_mb = static_cast<double>(net.memory_plan().peak_bytes) / 1e6;
    const double measured_mb = static_cast<double>(net.activation_pool().peak_bytes_lent()) / 1e6;
    const double pool_mb = static_cast<double>(net.activation_pool().bytes_created()) / 1e6;
    std::string model = config.model.builder.empty() ? "graph" : config.model.builder;
    if (args->json) {
      nlohmann::ordered_json j;
      j["model"] = model;
      j["batch"] = config.data.batch_size;
      j["ranks"] = ranks;
      j["threads"] = NumThreads();
      j["iters"] = args->iters;
      j["mode"] = args->infer ? "inference" : "training";
      j["overlap"] = config.distributed.overlap;
      j["img_per_s"] = img_per_s;
      j["ms_per_iter"] = 1000 * seconds / n;
      j["step_ms_median"] = 1000 * median;
      j["step_ms_min"] = 1000 * step_s.front();
      j["step_ms_max"] = 1000 * step_s.back();
      j["compute_ms"] = 1000 * sum.compute / n;
      j["comm_wait_ms"] = 1000 * sum.comm_wait / n;
      j["sync_bn_ms"] = 1000 * sum.sync_bn / n;
      j["data_ms_per_iter"] = 1000 * sum.data_wait / n;
      j["peak_rss_mb"] = peak_rss_mb;
      j["activation_grad_mb"] = net.grad_bytes_peak() / 1e6;
      j["activation_mb"] = pool_mb;
      j["activation_planned_peak_mb"] = planned_mb;
      j["activation_measured_peak_mb"] = measured_mb;
      if (args->profile) {
        j["gemm_peak_gflops"] = gemm_peak;
        nlohmann::ordered_json layers = nlohmann::ordered_json::array();
        for (const std::string& name : order) {
          auto [f, b] = per_layer[name];
          nlohmann::ordered_json l = {
              {"name", name}, {"forward_ms", 1000 * f / n}, {"backward_ms", 1000 * b / n}};
          if (flops[name] > 0) {
            l["forward_gflops"] = gflops(flops[name] * n, f);
            l["backward_gflops"] = gflops(2 * flops[name] * n, b);
          }
          layers.push_back(std::move(l));
        }
        j["layers"] = std::move(layers);
      }
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf(
          "%s: batch %lld x %d rank(s), %d thread(s) each: %.1f img/s (%.2f ms/iter: "
          "compute %.2f, comm wait %.2f, data %.2f); peak memory %.0f MB (activations and their "
          "gradients %.0f MB of it; their peak planned %.1f MB, measured %.1f MB)\n",
          model.c_str(), static_cast<long long>(config.data.batch_size), ranks, NumThreads(),
          img_per_s, 1000 * seconds / n, 1000 * sum.compute / n, 1000 * sum.comm_wait / n,
          1000 * sum.data_wait / n, peak_rss_mb, pool_mb + net.grad_bytes_peak() / 1e6, planned_mb,
          measured_mb);
      if (args->profile) {
        std::printf("matrix-multiply peak (2048^3 fp32 GEMM, best of 3): %.1f GFLOP/s\n",
                    gemm_peak);
        std::printf("%-26s %10s %10s %7s %10s %10s %7s\n", "layer", "fwd ms", "bwd ms", "share",
                    "fwd GF/s", "bwd GF/s", "of peak");
        double total_flops = 0, total_s = 0;
        for (const std::string& name : order) {
          auto [f, b] = per_layer[name];
          std::printf("%-26s %10.3f %10.3f %6.1f%%", name.c_str(), 1000 * f / n, 1000 * b / n,
                      100 * (f + b) / seconds);
          if (flops[name] > 0) {
            const double rate = gflops(3 * flops[name] * n, f + b);
            std::printf(" %10.1f %10.1f %6.0f%%", gflops(flops[name] * n, f),
                        gflops(2 * flops[name] * n, b), 100 * rate / gemm_peak);
            total_flops += 3 * flops[name] * n;
            total_s += f + b;
          }
          std::printf("\n");
        }
        std::printf(
            "convolutions and fc: %.1f GFLOP/s over their %.0f%% of the time (%.0f%% of "
            "the GEMM peak)\n",
            gflops(total_flops, total_s), 100 * total_s / seconds,
            100 * gflops(total_flops, total_s) / gemm_peak);
      }
    }
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
