// `cortado bench comm --codec auto` (bench_comm.h): the plan `distributed.codec: auto` would make
// for a model on a link, measured by training a few steps alone on synthetic data.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/parallel/data_parallel.h"
#include "models/builders.h"
#include "tools/bench_comm.h"

namespace cortado::tools::bench_comm {
namespace {

// "100mbit", "1gbit", "2.5gbit", "800kbit" (bits per second) or a plain number of bytes/s.
double ParseLinkRate(const std::string& text) {
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  double bytes_per_s = 0;
  if (used > 0 && unit.empty()) {
    bytes_per_s = value;
  } else if (used > 0 && (unit == "kbit" || unit == "mbit" || unit == "gbit")) {
    bytes_per_s = value / 8 * (unit == "kbit" ? 1e3 : unit == "mbit" ? 1e6 : 1e9);
  }
  if (!(bytes_per_s > 0) || !std::isfinite(bytes_per_s)) {
    UsageFail("--link ", text, ": want a rate such as 100mbit, 1gbit or a number of bytes/s");
  }
  return bytes_per_s;
}

// The shapes the plan is made for: ImageNet-style models on 224x224 images of 1000 classes, the
// others on 32x32 of 10 (the shapes of scripts/bench/scaling.sh).
ModelOptions AutoPlanShapes(const BenchArgs& a) {
  const bool imagenet = a.model.rfind("vgg", 0) == 0 || a.model == "resnet18" ||
                        a.model == "resnet34" || a.model == "resnet50" || a.model == "resnet101" ||
                        a.model == "resnet152";
  ModelOptions mo;
  mo.batch_size = a.batch;
  mo.in_channels = 3;
  mo.height = mo.width = imagenet ? 224 : 32;
  mo.num_classes = mo.height == 224 ? 1000 : 10;
  return mo;
}

// Trains `steps` steps on random data, so that dp measures when backward makes each bucket
// ready and makes its plan after them.
void RunPlanSteps(Net& net, DataParallel& dp, int64_t num_classes, int64_t steps) {
  Rng rng(1);
  for (int step = 0; step < steps; ++step) {
    Tensor& x = net.input("data");
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
    Tensor& label = net.input("label");
    for (int64_t i = 0; i < label.numel(); ++i) {
      label.data<int32_t>()[i] = static_cast<int32_t>(i % num_classes);
    }
    dp.BeginStep(step);
    const double loss = net.Forward();
    dp.SetControl(loss, false);
    net.Backward();
    dp.FinishStep();
  }
}

// The plan: one JSON object, or a heading and one line per bucket.
void PrintAutoPlan(const BenchArgs& a, double rate, const DataParallel& dp) {
  const auto& buckets = dp.buckets();
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = a.model;
    j["batch"] = a.batch;
    j["link_bytes_per_s"] = rate;
    j["ranks"] = a.ranks;
    j["codec_plan"] = dp.codec_plan();
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& b : buckets) {
      list.push_back({{"first", b.first},
                      {"last", b.last},
                      {"bytes", (b.end - b.begin) * 4},
                      {"codec", dist::CodecName(b.codec)}});
    }
    j["buckets"] = list;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("# cortado bench comm --codec auto: %s, batch %d per rank, %d ranks, link %.4g B/s\n",
              a.model.c_str(), a.batch, a.ranks, rate);
  std::printf("# %6s  %12s  %-7s  %s\n", "bucket", "bytes", "codec", "parameters");
  for (size_t i = 0; i < buckets.size(); ++i) {
    const auto& b = buckets[i];
    std::printf("  %6zu  %12lld  %-7s  %s .. %s\n", i,
                static_cast<long long>((b.end - b.begin) * 4), dist::CodecName(b.codec),
                b.first.c_str(), b.last.c_str());
  }
}

}  // namespace

// The plan of `distributed.codec: auto` for a.model on a link of a.link.
void RunAutoPlan(const BenchArgs& a) {
  const double rate = ParseLinkRate(a.link);
  if (a.threads > 0) SetNumThreads(a.threads);
  const ModelOptions mo = AutoPlanShapes(a);
  Net net(ParseFlag("--model", [&] { return BuildModel(a.model, mo); }), 1);
  auto comm = dist::CreateCommunicator(dist::CommConfig{});  // alone: only timing is measured
  CodecPolicy policy;
  policy.codec = "auto";
  ApplyCodecPolicy(net, policy);
  DataParallelOptions o;
  o.bucket_mb = a.bucket_mb;
  o.auto_codec.enabled = true;
  o.auto_codec.warmup_steps = 3;  // the first is left out
  o.auto_codec.interval = 0;
  o.auto_codec.plan_world_size = a.ranks;
  o.auto_codec.link_override = {{0, rate}};
  DataParallel dp(net, *comm, o);
  RunPlanSteps(net, dp, mo.num_classes, o.auto_codec.warmup_steps);
  PrintAutoPlan(a, rate, dp);
}

// The options of --codec auto only (the plan for a model and a link); registered in their
// place among the others, so the help lists them in the same order.
void AddAutoPlanOptions(CLI::App& cmd, BenchArgs& args) {
  cmd.add_option("--model", args.model, "With --codec auto: the model to plan for");
  cmd.add_option("--batch", args.batch, "With --codec auto: per-rank batch")->check(IntAtLeast(1));
  cmd.add_option("--link", args.link,
                 "With --codec auto: the link's rate (100mbit, 1gbit, ... or bytes/s)");
  cmd.add_option("--ranks", args.ranks, "With --codec auto: ranks of the job planned for")
      ->check(IntAtLeast(2));
  cmd.add_option("--threads", args.threads, "With --codec auto: compute threads (0: default)")
      ->check(IntAtLeast(0));
  cmd.add_option("--bucket-mb", args.bucket_mb, "With --codec auto: distributed.bucket_mb");
}

}  // namespace cortado::tools::bench_comm
