// `cortado bench train --config F [--iters N] [--warmup W] [--json] [--profile] [--infer]`:
// training throughput of the config's model and data, without evaluation or checkpoints, and
// the run's peak memory (and the activations' planned and measured peak,
// engine/tensor/memory_plan.h).
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

#include "engine/base/cpu_isa.h"
#include "engine/base/log.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/math.h"
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

struct BenchTrainArgs {
  std::string config, device;
  std::vector<std::string> sets;
  int64_t iters = 50, warmup = 5;
  bool json = false, profile = false, infer = false;
  int threads = 0;
};

// What is timed: the trainer's steps, or forward passes of an inference net alone.
struct Subject {
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<Net> infer_net;
  Net& net() const { return trainer ? trainer->net() : *infer_net; }
};

// An inference net (no gradients, no solver state, activations given back as soon as the next
// layer has read them) on one batch of the training data, fed once, after --warmup passes.
Subject StartInference(const BenchTrainArgs& a, const RunConfig& config, const World& world) {
  DataOptions data = config.data;
  data.channels_last = ConfigLayout(config) == MemoryFormat::kNHWC;  // the net's format
  std::unique_ptr<BatchSource> source =
      MakeTrainSource(data, ShardSpec{world.rank, world.size}, config.seed);
  Subject s;
  s.infer_net = std::make_unique<Net>(
      MakeNetSpec(config, source->sample_shape(), source->num_classes(), config.data.batch_size),
      config.seed, config.precision.compute, ConfigNetOptions(config, NetMode::kInference));
  source->Start(0, 0);
  Batch batch;
  CORTADO_CHECK(source->Next(batch), config.data.train, ": no batch to measure on");
  FeedBatch(*s.infer_net, batch);
  for (int64_t i = 0; i < a.warmup; ++i) s.infer_net->Forward();
  return s;
}

// The trainer's own steps, after --warmup of them.
Subject StartTraining(const BenchTrainArgs& a, const RunConfig& config, World world) {
  Subject s;
  s.trainer = std::make_unique<Trainer>(config, std::move(world));
  s.trainer->Start("");
  for (int64_t i = 0; i < a.warmup; ++i) s.trainer->Step();
  return s;
}

// The timed iterations: their summed parts, each one's wall time and, with --profile, each
// layer's forward and backward seconds in the net's order.
struct Timing {
  StepTimes sum;
  std::vector<double> step_s;
  double seconds = 0;
  std::map<std::string, std::pair<double, double>> per_layer;  // name -> (fwd, bwd) seconds
  std::vector<std::string> order;
};

void AddLayerTimes(const Net& net, Timing& t) {
  for (const auto& l : net.layer_times()) {
    if (!t.per_layer.count(l.name)) t.order.push_back(l.name);
    t.per_layer[l.name].first += l.forward_s;
    t.per_layer[l.name].second += l.backward_s;
  }
}

Timing TimeIterations(const BenchTrainArgs& a, Subject& s) {
  Net& net = s.net();
  net.set_profiling(a.profile);
  Timing timing;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < a.iters; ++i) {
    auto s0 = std::chrono::steady_clock::now();
    StepTimes t;
    if (a.infer) {
      net.Forward();
      t.compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    } else {
      t = s.trainer->Step();
    }
    timing.step_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
    timing.sum.data_wait += t.data_wait;
    timing.sum.compute += t.compute;
    timing.sum.comm_wait += t.comm_wait;
    timing.sum.sync_bn += t.sync_bn;
    if (a.profile) AddLayerTimes(net, timing);
  }
  timing.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(timing.step_s.begin(), timing.step_s.end());
  return timing;
}

// The figures both reports print, derived from the timing and the net.
struct Summary {
  std::string model;
  int64_t batch = 0;
  int ranks = 1;
  double n = 0;  // timed iterations
  double img_per_s = 0;
  double peak_rss_mb = 0;
  // Activations and, in training, their gradients: the plan's peak (the largest set alive at
  // once), the pool's measured high-water mark, and the storage the pool holds for it (the
  // plan's arena); grad_mb is 0, the gradients being in the plan.
  double planned_mb = 0, measured_mb = 0, pool_mb = 0, grad_mb = 0;
  // Per-layer arithmetic, for GFLOP/s: forward as the layer counts it, backward twice that
  // (the input and the weight gradient; the first layer computes only the latter).
  std::map<std::string, double> flops;
  double gemm_peak = 0;
};

Summary Summarize(const BenchTrainArgs& a, const RunConfig& config, int ranks, Net& net,
                  const Timing& t, double peak_rss_mb) {
  Summary s;
  s.model = config.model.builder.empty() ? "graph" : config.model.builder;
  s.batch = config.data.batch_size;
  s.ranks = ranks;
  s.n = static_cast<double>(a.iters);
  s.img_per_s = s.n * static_cast<double>(config.data.batch_size * ranks) / t.seconds;
  s.peak_rss_mb = peak_rss_mb;
  s.planned_mb = static_cast<double>(net.memory_plan().peak_bytes) / 1e6;
  s.measured_mb = static_cast<double>(net.activation_pool().peak_bytes_lent()) / 1e6;
  s.pool_mb = static_cast<double>(net.activation_pool().bytes_created()) / 1e6;
  s.grad_mb = net.grad_bytes_peak() / 1e6;
  for (const auto& layer : net.layers()) s.flops[layer->name()] = layer->ForwardFlops();
  s.gemm_peak = a.profile ? MeasuredGemmPeak() : 0.0;
  return s;
}

double Gflops(double f, double s) { return s > 0 ? f / s / 1e9 : 0.0; }

// A layer's forward arithmetic; 0 for one the net does not list (no GFLOP/s then).
double FlopsOf(const Summary& s, const std::string& name) {
  auto it = s.flops.find(name);
  return it == s.flops.end() ? 0.0 : it->second;
}

nlohmann::ordered_json LayersJson(const Summary& s, const Timing& t) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const std::string& name : t.order) {
    auto [f, b] = t.per_layer.at(name);
    const double flops = FlopsOf(s, name);
    nlohmann::ordered_json l = {
        {"name", name}, {"forward_ms", 1000 * f / s.n}, {"backward_ms", 1000 * b / s.n}};
    if (flops > 0) {
      l["forward_gflops"] = Gflops(flops * s.n, f);
      l["backward_gflops"] = Gflops(2 * flops * s.n, b);
    }
    layers.push_back(std::move(l));
  }
  return layers;
}

void PrintJson(const BenchTrainArgs& a, const RunConfig& config, const Summary& s,
               const Timing& t) {
  const double n = s.n;
  nlohmann::ordered_json j;
  j["model"] = s.model;
  j["batch"] = config.data.batch_size;
  j["ranks"] = s.ranks;
  j["threads"] = NumThreads();
  j["cpu"] = CpuDescription();
  j["iters"] = a.iters;
  j["mode"] = a.infer ? "inference" : "training";
  j["overlap"] = config.distributed.overlap;
  j["img_per_s"] = s.img_per_s;
  j["ms_per_iter"] = 1000 * t.seconds / n;
  j["step_ms_median"] = 1000 * t.step_s[t.step_s.size() / 2];
  j["step_ms_min"] = 1000 * t.step_s.front();
  j["step_ms_max"] = 1000 * t.step_s.back();
  j["compute_ms"] = 1000 * t.sum.compute / n;
  j["comm_wait_ms"] = 1000 * t.sum.comm_wait / n;
  j["sync_bn_ms"] = 1000 * t.sum.sync_bn / n;
  j["data_ms_per_iter"] = 1000 * t.sum.data_wait / n;
  j["peak_rss_mb"] = s.peak_rss_mb;
  j["activation_grad_mb"] = s.grad_mb;
  j["activation_mb"] = s.pool_mb;
  j["activation_planned_peak_mb"] = s.planned_mb;
  j["activation_measured_peak_mb"] = s.measured_mb;
  if (a.profile) {
    j["gemm_peak_gflops"] = s.gemm_peak;
    j["layers"] = LayersJson(s, t);
  }
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// --profile's table: each layer's time, share of the run and GFLOP/s against the GEMM peak.
void PrintProfile(const Summary& s, const Timing& t) {
  const double n = s.n;
  std::printf("matrix-multiply peak (2048^3 fp32 GEMM, best of 3): %.1f GFLOP/s\n", s.gemm_peak);
  std::printf("%-26s %10s %10s %7s %10s %10s %7s\n", "layer", "fwd ms", "bwd ms", "share",
              "fwd GF/s", "bwd GF/s", "of peak");
  double total_flops = 0, total_s = 0;
  for (const std::string& name : t.order) {
    auto [f, b] = t.per_layer.at(name);
    const double flops = FlopsOf(s, name);
    std::printf("%-26s %10.3f %10.3f %6.1f%%", name.c_str(), 1000 * f / n, 1000 * b / n,
                100 * (f + b) / t.seconds);
    if (flops > 0) {
      const double rate = Gflops(3 * flops * n, f + b);
      std::printf(" %10.1f %10.1f %6.0f%%", Gflops(flops * n, f), Gflops(2 * flops * n, b),
                  100 * rate / s.gemm_peak);
      total_flops += 3 * flops * n;
      total_s += f + b;
    }
    std::printf("\n");
  }
  std::printf(
      "convolutions and fc: %.1f GFLOP/s over their %.0f%% of the time (%.0f%% of "
      "the GEMM peak)\n",
      Gflops(total_flops, total_s), 100 * total_s / t.seconds,
      100 * Gflops(total_flops, total_s) / s.gemm_peak);
}

void PrintText(const BenchTrainArgs& a, const Summary& s, const Timing& t) {
  const double n = s.n;
  std::printf(
      "%s: batch %lld x %d rank(s), %d thread(s) each: %.1f img/s (%.2f ms/iter: "
      "compute %.2f, comm wait %.2f, data %.2f); peak memory %.0f MB (activations and their "
      "gradients %.0f MB of it; their peak planned %.1f MB, measured %.1f MB)\n",
      s.model.c_str(), static_cast<long long>(s.batch), s.ranks, NumThreads(), s.img_per_s,
      1000 * t.seconds / n, 1000 * t.sum.compute / n, 1000 * t.sum.comm_wait / n,
      1000 * t.sum.data_wait / n, s.peak_rss_mb, s.pool_mb + s.grad_mb, s.planned_mb,
      s.measured_mb);
  if (a.profile) PrintProfile(s, t);
}

void RunBenchTrain(const BenchTrainArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (!a.device.empty()) sets.push_back("device=" + a.device);
  RunConfig config = LoadRunConfig(a.config, sets);
  // Long enough for any run length: the schedule plays no part in a throughput measurement.
  config.solver.epoch_based = false;
  config.solver.max_iter = a.warmup + a.iters + 1;
  World world = JoinWorld(config.distributed);
  JoinAsRank(world);
  ApplyThreadBudget(a.threads, world.local_size);
  const int rank = world.rank, ranks = world.size;
  // With --infer the world stays here, joined, while the net runs alone.
  Subject subject =
      a.infer ? StartInference(a, config, world) : StartTraining(a, config, std::move(world));
  const Timing timing = TimeIterations(a, subject);
  const double peak_rss_mb = PeakRssMb();
  if (rank != 0) return;
  const Summary summary = Summarize(a, config, ranks, subject.net(), timing, peak_rss_mb);
  if (a.json) {
    PrintJson(a, config, summary, timing);
  } else {
    PrintText(a, summary, timing);
  }
}

}  // namespace

void AddBenchTrainCommand(CLI::App& bench) {
  auto args = std::make_shared<BenchTrainArgs>();
  CLI::App* cmd = bench.add_subcommand("train", "Training throughput (images/s) of a config");
  cmd->add_option("--config", args->config, "YAML config file")->required();
  cmd->add_option("--set", args->sets, "Override a config key");
  cmd->add_option("--device", args->device,
                  "Where to run: cpu, test[:N] (the guarded host-memory test device, which says "
                  "nothing of speed) or cuda[:N]. Same as --set device=...");
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
    RunBenchTrain(*args);
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
