// DataParallel's layout and single-rank behaviour: gradients seated as views in one block in
// reverse layer order, buckets of whole parameters with a small first and last bucket, and a
// step with one rank that leaves the gradients exactly as backward wrote them. (Several ranks:
// tests/tools/data_parallel_test.cpp, as processes.) A discarded step leaves the error-feedback
// residual as it was.
#include "engine/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <set>

#include "engine/base/random.h"
#include "models/builders.h"

namespace cortado {
namespace {

using dist::CodecKind;

std::unique_ptr<dist::Communicator> OneRank() {
  return dist::CreateCommunicator(dist::CommConfig{});
}

NetSpec Model(const std::string& name, int64_t side, int64_t channels, int64_t batch) {
  ModelOptions o;
  o.num_classes = name == "resnet50" ? 1000 : 10;
  o.in_channels = channels;
  o.height = o.width = side;
  o.batch_size = batch;
  return BuildModel(name, o);
}

// Every weight's gradient in `codec` (batch-norm parameters and biases stay f32).
void UseCodec(Net& net, const std::string& codec) {
  CodecPolicy policy;
  policy.codec = codec;
  ApplyCodecPolicy(net, policy);
}

// Checks the invariants of a layout and returns the bucket sizes in bytes.
std::vector<double> CheckLayout(Net& net, const DataParallel& dp, const DataParallelOptions& o) {
  const auto& buckets = dp.buckets();
  const Tensor& block = dp.gradient_block();
  EXPECT_FALSE(buckets.empty());
  // Parameters in reverse layer order, each a view in the block at increasing, aligned offsets.
  std::vector<Param*> order;
  for (auto it = net.layers().rbegin(); it != net.layers().rend(); ++it) {
    for (Param& p : (*it)->params()) order.push_back(&p);
  }
  int64_t last = -1;
  size_t b = 0;
  std::vector<int> seen(buckets.size(), 0);
  for (Param* p : order) {
    EXPECT_TRUE(p->grad.SharesStorageWith(block)) << p->name;
    const int64_t at = p->grad.storage_offset();
    EXPECT_GT(at, last) << p->name;
    EXPECT_EQ(at * 4 % 64, 0) << p->name << " is not on a cache line";
    last = at + p->grad.numel() - 1;
    while (b < buckets.size() && at >= buckets[b].end) ++b;
    EXPECT_LT(b, buckets.size()) << p->name;
    EXPECT_GE(at, buckets[b].begin) << p->name;
    EXPECT_LE(at + p->grad.numel(), buckets[b].end) << p->name;
    ++seen[b];
  }
  std::vector<double> mb;
  for (size_t i = 0; i < buckets.size(); ++i) {
    EXPECT_EQ(seen[i], buckets[i].params) << "bucket " << i;
    if (i > 0) {
      EXPECT_EQ(buckets[i].begin, buckets[i - 1].end);
    }
    const double bytes = 4.0 * static_cast<double>(buckets[i].end - buckets[i].begin);
    mb.push_back(bytes / 1048576.0);
    const double cap = i == 0                    ? o.first_bucket_mb
                       : i + 1 == buckets.size() ? o.last_bucket_mb
                                                 : o.bucket_mb;
    // A bucket may exceed its cap only by holding a single parameter (padding aside).
    if (buckets[i].params > 1) {
      EXPECT_LE(mb.back(), cap * 1.01) << "bucket " << i;
    }
  }
  EXPECT_EQ(buckets.front().begin, 0);
  EXPECT_EQ(buckets.back().end, block.numel());
  return mb;
}

TEST(DataParallel, ResNet50BucketsFollowReverseLayerOrderWithSmallEnds) {
  auto comm = OneRank();
  Net net(Model("resnet50", 32, 3, 1), 1);
  DataParallelOptions o;  // 25 MB, first and last 1 MB
  DataParallel dp(net, *comm, o);
  std::vector<double> mb = CheckLayout(net, dp, o);
  // fc (8 MB, one parameter) alone first; the stem and first stage last, in at most 1 MB.
  EXPECT_EQ(dp.buckets().front().first, "logits.weight");
  EXPECT_EQ(dp.buckets().front().params, 1);
  EXPECT_EQ(dp.buckets().back().last, "conv1.weight");
  EXPECT_LE(mb.back(), 1.0);
  double total = 0;
  for (double m : mb) total += m;
  EXPECT_NEAR(total, 25557032 * 4 / 1048576.0, 0.5);  // every parameter, plus padding
  EXPECT_GE(mb.size(), 6u);
}

TEST(DataParallel, BucketSizesFollowTheOptions) {
  auto comm = OneRank();
  Net net(Model("resnet20", 28, 1, 1), 1);
  for (double size : {0.01, 0.1, 25.0}) {
    SCOPED_TRACE(size);
    DataParallelOptions o;
    o.bucket_mb = size;
    o.first_bucket_mb = size / 4;
    o.last_bucket_mb = size / 2;
    DataParallel dp(net, *comm, o);
    std::vector<double> mb = CheckLayout(net, dp, o);
    if (size == 25.0) {
      EXPECT_EQ(mb.size(), 1u);  // the first bucket holds the whole net
    }
    if (size == 0.01) {
      EXPECT_GT(mb.size(), 20u);
    }
  }
  DataParallelOptions bad;
  bad.last_bucket_mb = 0;
  EXPECT_THROW(DataParallel(net, *comm, bad), Error);
}

// A net with one parameter has one bucket.
TEST(DataParallel, OneParameterOneBucket) {
  auto comm = OneRank();
  NetSpec spec;
  spec.name = "tiny";
  spec.inputs = {{"data", {2, 3}, DType::kF32}, {"label", {2}, DType::kI32}};
  LayerSpec fc;
  fc.name = "fc";
  fc.type = "InnerProduct";
  fc.inputs = {"data"};
  fc.outputs = {"logits"};
  fc.settings.Set("num_output", int64_t{4}).Set("bias", false);
  LayerSpec loss;
  loss.name = "loss";
  loss.type = "SoftmaxWithLoss";
  loss.inputs = {"logits", "label"};
  loss.outputs = {"loss"};
  spec.layers = {fc, loss};
  Net net(spec, 1);
  DataParallelOptions o;
  DataParallel dp(net, *comm, o);
  ASSERT_EQ(dp.buckets().size(), 1u);
  EXPECT_EQ(dp.buckets()[0].params, 1);
}

// With one rank the all-reduce averages over one: the gradients stay bit for bit what
// backward wrote, step after step (the views survive every Reshape), and the loss and stop
// vote come back through the control words.
TEST(DataParallel, OneRankLeavesGradientsAsBackwardWroteThem) {
  auto comm = OneRank();
  const NetSpec spec = Model("resnet20", 12, 1, 3);
  Net plain(spec, 7), glued(spec, 7);
  DataParallelOptions o;
  o.bucket_mb = 0.02;  // many buckets, issued during backward
  o.first_bucket_mb = o.last_bucket_mb = 0.005;
  DataParallel dp(glued, *comm, o);
  ASSERT_GT(dp.buckets().size(), 5u);
  for (int step = 0; step < 3; ++step) {
    for (Net* net : {&plain, &glued}) {
      Rng rng(100 + step);
      Tensor& x = net->input("data");
      for (int64_t i = 0; i < x.numel(); ++i)
        x.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
      for (int64_t i = 0; i < 3; ++i) net->input("label").data<int32_t>()[i] = (step + i) % 10;
    }
    const double loss_plain = plain.Forward();
    plain.Backward();
    dp.BeginStep();
    const double loss = glued.Forward();
    dp.SetControl(loss, step == 2);
    glued.Backward();
    DataParallel::StepResult r = dp.FinishStep();
    EXPECT_EQ(loss, loss_plain);
    EXPECT_FLOAT_EQ(r.loss, loss);
    EXPECT_EQ(r.stop, step == 2);
    std::vector<Param*> a = plain.params(), b = glued.params();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(b[i]->grad.SharesStorageWith(dp.gradient_block())) << b[i]->name;
      EXPECT_EQ(std::memcmp(a[i]->grad.raw_data(), b[i]->grad.raw_data(), a[i]->grad.nbytes()), 0)
          << b[i]->name << " at step " << step;
    }
  }
}

// For the error-feedback tests: a residual of small random values, set in dp and returned.
Tensor SeedResidual(DataParallel& dp) {
  Tensor residual = dp.residual().Clone();
  Rng rng(3);
  for (int64_t i = 0; i < residual.numel(); ++i) {
    residual.data<float>()[i] = static_cast<float>(rng.Normal(0, 1e-3));
  }
  dp.SetResidual(residual);
  return residual;
}

// One training step of a 2-sample net on the same data each time.
void FixedStep(Net& net, DataParallel& dp) {
  Rng data(5);
  Tensor& x = net.input("data");
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = static_cast<float>(data.Normal(0, 1));
  for (int64_t i = 0; i < 2; ++i) net.input("label").data<int32_t>()[i] = static_cast<int32_t>(i);
  dp.BeginStep(1);
  dp.SetControl(net.Forward(), false);
  net.Backward();
  dp.FinishStep();
}

// Error feedback through a step that is not applied: encoding folds the residual into the
// gradients (with one rank the whole residual goes into them), so a skipped step must put it
// back bitwise; an applied step keeps what the encoding left.
TEST(DataParallel, DiscardStepPutsTheResidualBackBitwise) {
  auto comm = OneRank();
  Net net(Model("resnet20", 12, 1, 2), 7);
  UseCodec(net, "epgc8");
  DataParallelOptions o;
  o.error_feedback = true;
  o.discardable_steps = true;
  DataParallel dp(net, *comm, o);
  const Tensor residual = SeedResidual(dp);
  auto same = [&](const Tensor& a) {
    return std::memcmp(a.raw_data(), dp.residual().raw_data(), a.nbytes()) == 0;
  };
  FixedStep(net, dp);
  EXPECT_FALSE(same(residual)) << "the step did not use the residual";
  dp.DiscardStep();
  EXPECT_TRUE(same(residual));
  FixedStep(net, dp);
  const Tensor applied = dp.residual().Clone();
  EXPECT_FALSE(same(residual));
  FixedStep(net, dp);  // BeginStep keeps the residual the applied step left, not the first one
  dp.DiscardStep();
  EXPECT_TRUE(same(applied));
}

// Without discardable_steps (no dynamic loss scale: a step is never skipped) BeginStep keeps no
// copy of the residual, and DiscardStep refuses rather than restore nothing; training with error
// feedback runs as before.
TEST(DataParallel, DiscardStepNeedsDiscardableSteps) {
  auto comm = OneRank();
  Net net(Model("resnet20", 12, 1, 2), 7);
  UseCodec(net, "epgc8");
  DataParallelOptions o;
  o.error_feedback = true;
  DataParallel dp(net, *comm, o);
  const Tensor residual = SeedResidual(dp);
  FixedStep(net, dp);
  EXPECT_NE(std::memcmp(residual.raw_data(), dp.residual().raw_data(), residual.nbytes()), 0)
      << "the step did not use the residual";
  EXPECT_THROW(dp.DiscardStep(), Error);
}

// distributed.codec: auto on one rank with a fixed slow link (CORTADO_AUTO_LINK's option): the
// auto buckets travel in the widest candidate during the warmup, then in the narrowest (nothing
// hides on a 1 KB/s link); the buckets kept in f32 never change; the plan survives
// SaveState/LoadState into a fresh DataParallel, which does not warm up again, and a checkpoint
// whose plan this run's candidates do not allow is refused. (The guard and several ranks:
// data_parallel_threads_test.cpp.)
TEST(DataParallel, AutoCodecsPlanAfterTheWarmupAndComeBackFromACheckpoint) {
  auto comm = OneRank();
  Net net(Model("resnet20", 12, 1, 2), 7);
  UseCodec(net, "auto");
  DataParallelOptions o;
  o.bucket_mb = 0.05;
  o.first_bucket_mb = o.last_bucket_mb = 0.01;
  o.auto_codec.enabled = true;
  o.auto_codec.warmup_steps = 2;
  o.auto_codec.interval = 1;
  o.auto_codec.max_residual_ratio = 1e9;
  o.auto_codec.link_override = {{0, 1e3}};
  o.auto_codec.hiding_fraction = 0.5;
  auto dp = std::make_unique<DataParallel>(net, *comm, o);
  EXPECT_TRUE(dp->options().error_feedback) << "epgc11 and epgc8 run with error feedback";
  int64_t iteration = 0;
  auto step = [&](DataParallel& d) {
    Rng data(5 + static_cast<uint64_t>(iteration));
    Tensor& x = net.input("data");
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(data.Normal(0, 1));
    for (int64_t i = 0; i < 2; ++i) net.input("label").data<int32_t>()[i] = static_cast<int32_t>(i);
    d.BeginStep(iteration++);
    d.SetControl(net.Forward(), false);
    net.Backward();
    d.FinishStep();
  };
  std::set<std::string> chosen;  // parameters whose codec the plan chooses
  for (Param* p : net.params()) {
    if (p->codec == "auto") chosen.insert(p->name);
  }
  std::vector<bool> weights;
  for (const auto& b : dp->buckets()) weights.push_back(chosen.count(b.first) > 0);
  auto codecs_are = [&](const DataParallel& d, CodecKind auto_codec) {
    for (size_t b = 0; b < d.buckets().size(); ++b) {
      const CodecKind want = weights[b] ? auto_codec : CodecKind::kF32;
      if (d.buckets()[b].codec != want) {
        ADD_FAILURE() << "bucket " << b << " (" << d.buckets()[b].first << ") travels in "
                      << dist::CodecName(d.buckets()[b].codec) << ", want "
                      << dist::CodecName(want);
        return false;
      }
    }
    return true;
  };
  ASSERT_GT(std::count(weights.begin(), weights.end(), true), 3);
  EXPECT_TRUE(codecs_are(*dp, CodecKind::kF32));
  step(*dp);
  EXPECT_TRUE(codecs_are(*dp, CodecKind::kF32));
  EXPECT_EQ(dp->codec_plans(), 0);
  step(*dp);  // the end of the warmup
  EXPECT_TRUE(codecs_are(*dp, CodecKind::kEpgc8));
  EXPECT_EQ(dp->codec_plans(), 1);
  step(*dp);  // a check: the rate did not move, the guard is far
  EXPECT_TRUE(codecs_are(*dp, CodecKind::kEpgc8));
  EXPECT_EQ(dp->codec_plans(), 1);

  // The plan goes into a checkpoint and comes back in a fresh DataParallel (no warmup).
  Checkpoint ckpt;
  dp->SaveState(ckpt);
  ASSERT_EQ(ckpt.meta.count("codec_auto_plan"), 1u);
  ASSERT_NE(ckpt.Find("codec_auto/measurements"), nullptr);
  EXPECT_EQ(ckpt.meta["codec_auto_hiding_fraction"], "0.5");
  const std::string plan = dp->codec_plan();
  const size_t runs = dp->runs().size();
  dp.reset();
  dp = std::make_unique<DataParallel>(net, *comm, o);
  EXPECT_TRUE(codecs_are(*dp, CodecKind::kF32));
  dp->LoadState(ckpt, "ckpt");
  EXPECT_EQ(dp->codec_plan(), plan);
  EXPECT_EQ(dp->codec_plans(), 1);
  EXPECT_EQ(dp->runs().size(), runs);
  step(*dp);
  EXPECT_TRUE(codecs_are(*dp, CodecKind::kEpgc8));
  EXPECT_EQ(dp->codec_plans(), 1);

  // A plan in a codec this run may not choose is refused, naming the checkpoint.
  dp.reset();
  o.auto_codec.candidates = {CodecKind::kF32, CodecKind::kBF16};
  dp = std::make_unique<DataParallel>(net, *comm, o);
  try {
    dp->LoadState(ckpt, "ckpt");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint 'ckpt': bucket 0 travels in epgc8"),
              std::string::npos)
        << e.what();
  }
}

// Every entry DataParallel reads from a checkpoint is checked before it is used, and a crafted
// one is refused with one line naming the file and the entry (issue 40): error_feedback_ranks
// of 0 left no residual and the first was read out of bounds, a negative or NaN floor was cast to
// size_t, and a codec_auto_plans that is not a number threw std::invalid_argument (which the
// start-up broadcast did not pass on). A refused checkpoint leaves the run's state as it was.
TEST(DataParallel, ACraftedCheckpointIsRefusedNamingTheFileAndTheEntry) {
  auto comm = OneRank();
  Net net(Model("resnet20", 8, 1, 2), 7);
  UseCodec(net, "auto");
  DataParallelOptions o;
  o.bucket_mb = 0.05;
  o.first_bucket_mb = o.last_bucket_mb = 0.01;
  o.auto_codec.enabled = true;
  o.auto_codec.warmup_steps = 1;
  o.auto_codec.link_override = {{0, 1e3}};
  Checkpoint good;
  size_t n = 0;
  {
    DataParallel dp(net, *comm, o);
    ASSERT_TRUE(dp.options().error_feedback);
    Rng data(3);
    Tensor& x = net.input("data");
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data<float>()[i] = static_cast<float>(data.Normal(0, 1));
    }
    dp.BeginStep(0);
    dp.SetControl(net.Forward(), false);
    net.Backward();
    dp.FinishStep();  // the warmup's one step: the plan
    ASSERT_EQ(dp.codec_plans(), 1);
    dp.GatherForCheckpoint();
    dp.SaveState(good);
    for (auto& [name, t] : good.tensors) t = t.Clone();
    n = dp.buckets().size();
  }
  ASSERT_EQ(good.meta.count("error_feedback_ranks"), 1u);
  ASSERT_EQ(good.meta.count("codec_auto_plan"), 1u);
  {
    DataParallel dp(net, *comm, o);
    dp.LoadState(good, "good");
    EXPECT_EQ(dp.codec_plans(), 1);
  }
  using Craft = std::function<void(Checkpoint&)>;
  const auto meta = [](const std::string& key, const std::string& value) -> Craft {
    return [=](Checkpoint& c) { c.meta[key] = value; };
  };
  // [latency, rate, backward end, ready per bucket, floor per bucket, measured per bucket]
  const auto measured = [](size_t i, double value) -> Craft {
    return [=](Checkpoint& c) {
      for (auto& [name, t] : c.tensors) {
        if (name != "codec_auto/measurements") continue;
        t = t.Clone();
        t.data<double>()[i] = value;
      }
    };
  };
  const std::vector<std::pair<Craft, std::string>> cases = {
      {meta("error_feedback_ranks", "0"), "error_feedback_ranks is 0"},
      {meta("error_feedback_ranks", "-3"), "error_feedback_ranks is -3"},
      {meta("error_feedback_ranks", "two"), "entry 'error_feedback_ranks' is not an integer"},
      {meta("error_feedback_ranks", "2"), "lacks error_feedback/rank1"},
      {[](Checkpoint& c) {
         for (auto& [name, t] : c.tensors) {
           if (name == "error_feedback/rank0") t = Tensor({t.numel()}, DType::kF64);
         }
       },
       "error_feedback/rank0 is f64"},
      {meta("codec_auto_plans", "x"), "entry 'codec_auto_plans' is not an integer"},
      {meta("codec_auto_plans", "0"), "codec_auto_plans is 0"},
      {meta("codec_auto_plan", "epgc8,bogus"), "codec_auto_plan: "},
      {meta("codec_auto_hiding_fraction", "nan"), "codec_auto_hiding_fraction 'nan'"},
      {meta("codec_auto_hiding_fraction", ""), "codec_auto_hiding_fraction ''"},
      {measured(0, -1), "the latency is -1"},
      {measured(1, 0), "the link rate is 0"},
      {measured(1, NAN), "the link rate is nan"},
      {measured(2, INFINITY), "the end of backward is inf"},
      {measured(3 + 1, NAN), "the ready time of bucket 1 is nan"},
      {measured(3 + n, -1), "the floor of bucket 0 is -1"},
      {measured(3 + n + 2, NAN), "the floor of bucket 2 is nan"},
      {measured(3 + n, 0.5), "the floor of bucket 0 is 0.5"},
      {measured(3 + 2 * n, -INFINITY), "the measured transfer of bucket 0 is -inf"},
  };
  for (const auto& [craft, want] : cases) {
    SCOPED_TRACE(want);
    Checkpoint c = good;
    craft(c);
    DataParallel dp(net, *comm, o);
    const std::string warmup = dp.codec_plan();
    try {
      dp.LoadState(c, "crafted.cortado");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("checkpoint 'crafted.cortado'"), std::string::npos) << what;
      EXPECT_NE(what.find(want), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_EQ(dp.codec_plans(), 0);
    EXPECT_EQ(dp.codec_plan(), warmup);
  }
}

TEST(DataParallel, AutoLinkFromTheEnvironment) {
  setenv("CORTADO_AUTO_LINK", "1e6,40:1.25e9", 1);
  const auto link = AutoLinkFromEnv();
  ASSERT_EQ(link.size(), 2u);
  EXPECT_EQ(link[0], (std::pair<int64_t, double>{0, 1e6}));
  EXPECT_EQ(link[1], (std::pair<int64_t, double>{40, 1.25e9}));
  for (const char* bad : {"fast", "0", "40:1e9", "1e6,40:", "1e6,40:1e9,30:1e6"}) {
    setenv("CORTADO_AUTO_LINK", bad, 1);
    EXPECT_THROW(AutoLinkFromEnv(), Error) << bad;
  }
  unsetenv("CORTADO_AUTO_LINK");
  EXPECT_TRUE(AutoLinkFromEnv().empty());
}

// The codec policy: batch-norm parameters and biases stay f32 by default, overrides by name
// pattern win (the first that matches), and a pattern that matches nothing is an error.
TEST(DataParallel, CodecPolicyKeepsNormAndBiasInF32AndAppliesOverrides) {
  Net net(Model("resnet20", 28, 1, 1), 1);
  CodecPolicy policy;
  policy.codec = "epgc8";
  policy.overrides = {{"logits.*", "f16"}, {"logits.weight", "bf16"}, {"conv1.weight", "f32"}};
  ApplyCodecPolicy(net, policy);
  int compressed = 0;
  for (Param* p : net.params()) {
    SCOPED_TRACE(p->name);
    if (p->name == "logits.weight" || p->name == "logits.bias") {
      EXPECT_EQ(p->codec, "f16");  // the first matching override, over the bias exclusion
    } else if (p->name == "conv1.weight" || p->kind != ParamKind::kWeight) {
      EXPECT_EQ(p->codec, "f32");
    } else {
      EXPECT_EQ(p->codec, "epgc8");
      ++compressed;
    }
  }
  EXPECT_GT(compressed, 15);
  policy.keep_f32.clear();
  policy.overrides.clear();
  ApplyCodecPolicy(net, policy);
  for (Param* p : net.params()) EXPECT_EQ(p->codec, "epgc8") << p->name;

  policy.overrides = {{"fc*", "f16"}};
  try {
    ApplyCodecPolicy(net, policy);
    FAIL() << "a pattern that matches nothing was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc*' matches no parameter"), std::string::npos)
        << e.what();
  }
  policy.overrides = {{"*", "fp12"}};
  EXPECT_THROW(ApplyCodecPolicy(net, policy), Error);
}

// Buckets never mix codecs, and the control words (stop vote, loss) travel in f32 even when
// the first layers' gradients are compressed.
TEST(DataParallel, BucketsNeverMixCodecsAndTheControlWordsStayF32) {
  auto comm = OneRank();
  Net net(Model("resnet20", 28, 1, 1), 1);
  UseCodec(net, "epgc11");
  DataParallelOptions o;
  DataParallel dp(net, *comm, o);
  CheckLayout(net, dp, o);
  const auto& buckets = dp.buckets();
  for (Param* p : net.params()) {
    const int64_t at = p->grad.storage_offset();
    for (const auto& b : buckets) {
      if (at >= b.begin && at < b.end) {
        EXPECT_EQ(dist::CodecName(b.codec), p->codec) << p->name;
      }
    }
  }
  // conv1.weight (epgc11) is the last parameter: the control words get a bucket of their own.
  ASSERT_GE(buckets.size(), 3u);
  EXPECT_EQ(buckets.back().params, 0);
  EXPECT_EQ(buckets.back().codec, dist::CodecKind::kF32);
  EXPECT_EQ(buckets.back().end - buckets.back().begin, 2);
  EXPECT_EQ(buckets[buckets.size() - 2].codec, dist::CodecKind::kEpgc11);
  // With one rank nothing travels: the step still returns the loss and the stop vote.
  dp.BeginStep(0);
  Rng rng(3);
  Tensor& x = net.input("data");
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
  const double loss = net.Forward();
  dp.SetControl(loss, true);
  net.Backward();
  DataParallel::StepResult r = dp.FinishStep();
  EXPECT_FLOAT_EQ(r.loss, loss);
  EXPECT_TRUE(r.stop);
  // Compressed buckets send fewer bytes than f32 would (nothing, with one rank).
  EXPECT_EQ(dp.wire_bytes_per_step(), 0.0);
}

// The engine's DType and the library's DataType number f16 differently: the mapping goes by
// name and element size, for every float dtype, and refuses the integer ones.
TEST(DataParallel, DTypeMapsToTheCommunicatorsTypeOfTheSameName) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(d));
    const dist::DataType t = WireTypeOf(d, "test");
    EXPECT_EQ(dist::DataTypeSize(t), DTypeSize(d));
    EXPECT_EQ(t, dist::ParseDataType(DTypeName(d)));
  }
  EXPECT_THROW(WireTypeOf(DType::kI32, "test"), Error);
  EXPECT_THROW(WireTypeOf(DType::kU8, "test"), Error);
}

}  // namespace
}  // namespace cortado
