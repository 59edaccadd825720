#include "engine/tensor/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/net.h"
#include "engine/graph/solver.h"
#include "engine/io/checkpoint.h"
#include "models/builders.h"
#include "tests/support/files.h"

namespace cortado {
namespace {

// data (caller's) -> L0 -> b (100 bytes) -> L1 -> c (10) -> L2 -> d (1, the result). Every
// layer runs backward and reads its input there, none its output.
PlanGraph Chain() {
  PlanGraph g;
  g.blob_bytes = {1000, 100, 10, 1};
  g.external = {true, false, false, false};
  for (int i = 0; i < 3; ++i) {
    PlanLayer l;
    l.inputs = {i};
    l.outputs = {i + 1};
    l.shares_input = {-1};
    l.runs_backward = true;
    l.backward_reads_inputs = true;
    l.backward_reads_outputs = false;
    g.layers.push_back(l);
  }
  return g;
}

TEST(MemoryPlan, InferenceGivesABufferBackOnceTheNextLayerHasReadIt) {
  const MemoryPlan p = PlanMemory(Chain(), /*training=*/false);
  ASSERT_EQ(p.steps, 3);
  EXPECT_EQ(p.group, (std::vector<int>{-1, 0, 1, 2}));
  EXPECT_EQ(p.live_bytes, (std::vector<size_t>{100, 110, 11}));
  EXPECT_EQ(p.peak_bytes, 110u);
  EXPECT_EQ(p.give_after[1], (std::vector<int>{0}));
  EXPECT_EQ(p.give_after[2], (std::vector<int>{1}));
  EXPECT_EQ(p.group_last[2], 3) << "the result is kept past the pass";
}

TEST(MemoryPlan, TrainingKeepsWhatABackwardReadsUntilItHasRun) {
  // Steps: forward L0 L1 L2 (0-2), backward L2 L1 L0 (3-5). b is read by L1's backward (4),
  // c by L2's (3).
  const MemoryPlan p = PlanMemory(Chain(), /*training=*/true);
  ASSERT_EQ(p.steps, 6);
  EXPECT_EQ(p.live_bytes, (std::vector<size_t>{100, 110, 111, 111, 101, 1}));
  EXPECT_EQ(p.peak_bytes, 111u);
  EXPECT_EQ(p.give_after[3], (std::vector<int>{1}));
  EXPECT_EQ(p.give_after[4], (std::vector<int>{0}));
  // A backward that reads its output instead keeps that output: L1 reads c at step 4.
  PlanGraph g = Chain();
  g.layers[1].backward_reads_outputs = true;
  EXPECT_EQ(PlanMemory(g, true).group_last[1], 4);
  // A layer that does not run backward reads nothing there.
  g = Chain();
  g.layers[1].runs_backward = false;
  g.layers[2].runs_backward = false;
  EXPECT_EQ(PlanMemory(g, true).live_bytes, (std::vector<size_t>{100, 110, 11, 1, 1, 1}));
}

// No two groups alive during the same step share a byte of the arena, and every group lies
// inside it; returns whether some gradient lies over bytes an activation used (a reuse).
bool ExpectArenaLayoutIsSafe(const MemoryPlan& p, const std::string& what) {
  bool reused = false;
  const size_t n = p.group_bytes.size();
  EXPECT_EQ(p.group_offset.size(), n) << what;
  EXPECT_GE(p.arena_bytes, p.peak_bytes) << what;
  auto last = [&](size_t g) { return std::min(p.group_last[g], p.steps - 1); };
  for (size_t a = 0; a < n; ++a) {
    EXPECT_EQ(p.group_offset[a] % kPlanAlignment, 0u) << what;
    EXPECT_LE(p.group_offset[a] + p.group_bytes[a], p.arena_bytes) << what << " group " << a;
    for (size_t b = a + 1; b < n; ++b) {
      const bool disjoint = p.group_offset[a] + p.group_bytes[a] <= p.group_offset[b] ||
                            p.group_offset[b] + p.group_bytes[b] <= p.group_offset[a];
      const bool together = p.group_first[a] <= last(b) && p.group_first[b] <= last(a);
      if (together) {
        EXPECT_TRUE(disjoint) << what << ": groups " << a << " and " << b;
      }
      if (!disjoint && p.group_is_grad[a] != p.group_is_grad[b]) reused = true;
    }
  }
  return reused;
}

TEST(MemoryPlan, GradientsLiveFromTheirWriterToTheirProducersBackward) {
  // Chain with gradients: L2's backward writes c's gradient (step 3), L1's b's (step 4); L0
  // does not propagate to the net input. d's gradient, written by nobody (a loss seed), is
  // taken before the first backward step.
  PlanGraph g = Chain();
  g.gradients = true;
  g.layers[0].propagate = {false};
  g.layers[1].propagate = {true};
  g.layers[2].propagate = {true};
  const MemoryPlan p = PlanMemory(g, true);
  ASSERT_EQ(p.group_bytes.size(), 6u);
  EXPECT_EQ(p.grad_group, (std::vector<int>{-1, 3, 4, 5}));
  EXPECT_EQ(p.group_is_grad, (std::vector<bool>{false, false, false, true, true, true}));
  EXPECT_EQ(p.group_first, (std::vector<int>{0, 1, 2, 4, 3, 3}));
  EXPECT_EQ(p.group_last, (std::vector<int>{4, 3, 6, 5, 4, 3}));
  // Step 4 (L1's backward): b and d, and the gradients of b and c.
  EXPECT_EQ(p.live_bytes, (std::vector<size_t>{100, 110, 111, 122, 211, 101}));
  EXPECT_EQ(p.peak_bytes, 211u);
  EXPECT_EQ(p.take_before[4], (std::vector<int>{3}));
  EXPECT_EQ(p.give_after[4], (std::vector<int>{0, 4}));
  // Largest first: b's data at 0, its gradient after it; d's 1-byte seed, alive only at step
  // 3, fills the hole c's gradient leaves.
  EXPECT_EQ(p.group_offset, (std::vector<size_t>{0, 128, 320, 128, 256, 192}));
  EXPECT_EQ(p.arena_bytes, 384u);
  ExpectArenaLayoutIsSafe(p, "chain");
  // Without gradients (inference, or a graph that does not ask) there are none.
  EXPECT_EQ(PlanMemory(g, false).group_bytes.size(), 3u);
  g.gradients = false;
  EXPECT_EQ(PlanMemory(g, true).grad_group, (std::vector<int>{-1, -1, -1, -1}));
}

TEST(MemoryPlan, SharedStorageIsOneBufferAliveForEveryBlobOnIt) {
  // L1 writes c into b's storage (in place): one 100-byte group read until L2's backward.
  PlanGraph g = Chain();
  g.layers[1].shares_input = {0};
  const MemoryPlan p = PlanMemory(g, true);
  EXPECT_EQ(p.group[1], p.group[2]);
  EXPECT_EQ(p.group_bytes.size(), 2u);
  EXPECT_EQ(p.group_last[static_cast<size_t>(p.group[1])], 4);
  EXPECT_EQ(p.live_bytes, (std::vector<size_t>{100, 100, 101, 101, 101, 1}));
  // A view of a net input belongs to the caller too.
  g = Chain();
  g.layers[0].shares_input = {0};
  EXPECT_EQ(PlanMemory(g, false).group[1], -1);
}

void FillRandom(Net& net, uint64_t seed) {
  Rng rng(seed);
  Tensor& x = net.input("data");
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = rng.Normal(0, 1);
    if (x.dtype() == DType::kF64) {
      x.data<double>()[i] = v;
    } else {
      x.data<float>()[i] = static_cast<float>(v);
    }
  }
  Tensor& label = net.input("label");
  for (int64_t i = 0; i < label.numel(); ++i)
    label.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
}

ModelOptions Small(int64_t channels, int64_t size) {
  ModelOptions o;
  o.in_channels = channels;
  o.height = o.width = size;
  o.batch_size = 4;
  o.num_classes = 10;
  return o;
}

// data -> fc1 -> relu -> {fc2, skip} -> sum -> fc3 -> {loss, acc}: fan-out and a residual sum.
NetSpec Residual() {
  auto layer = [](std::string name, std::string type, std::vector<std::string> in,
                  std::vector<std::string> out, Settings s) {
    LayerSpec spec;
    spec.name = std::move(name);
    spec.type = std::move(type);
    spec.inputs = std::move(in);
    spec.outputs = std::move(out);
    spec.settings = std::move(s);
    return spec;
  };
  NetSpec spec;
  spec.name = "residual";
  spec.inputs = {{"data", {4, 5}, DType::kF32}, {"label", {4}, DType::kI32}};
  Settings fc6, fc3, sum;
  fc6.Set("num_output", int64_t{6});
  fc3.Set("num_output", int64_t{3});
  sum.Set("operation", "sum");
  spec.layers = {layer("fc1", "InnerProduct", {"data"}, {"fc1"}, fc6),
                 layer("relu", "ReLU", {"fc1"}, {"h"}, {}),
                 layer("fc2", "InnerProduct", {"h"}, {"fc2"}, fc6),
                 layer("sum", "Eltwise", {"fc2", "h"}, {"s"}, sum),
                 layer("fc3", "InnerProduct", {"s"}, {"logits"}, fc3),
                 layer("loss", "SoftmaxWithLoss", {"logits", "label"}, {"loss"}, {}),
                 layer("acc", "Accuracy", {"logits", "label"}, {"acc"}, {})};
  return spec;
}

struct Case {
  std::string name;
  NetSpec spec;
};

std::vector<Case> Cases() {
  return {{"lenet", BuildModel("lenet", Small(1, 28))},
          {"resnet20", BuildModel("resnet20", Small(3, 16))},
          {"residual", Residual()}};
}

// The pool's measured high-water mark is the plan's peak, in training and in inference, and
// for training it is well below every activation alive at once (the old footprint).
TEST(MemoryPlan, PlannedPeakIsThePoolsHighWaterMark) {
  SetNumThreads(2);
  for (const Case& c : Cases()) {
    for (NetMode mode : {NetMode::kTrain, NetMode::kInference}) {
      NetOptions options;
      options.mode = mode;
      options.plan_memory = true;
      Net net(c.spec, 1, DType::kF32, options);
      FillRandom(net, 2);
      for (int step = 0; step < 2; ++step) {
        net.Forward();
        if (mode == NetMode::kTrain) net.Backward();
      }
      const MemoryPlan& plan = net.memory_plan();
      EXPECT_EQ(net.activation_pool().peak_bytes_lent(), plan.peak_bytes) << c.name;
      EXPECT_EQ(net.activation_pool().bytes_created(), plan.arena_bytes) << c.name;
      size_t results = 0;  // still lent after the pass: the blobs nothing reads
      for (size_t g = 0; g < plan.group_bytes.size(); ++g) {
        if (plan.group_last[g] >= plan.steps) results += plan.group_bytes[g];
      }
      EXPECT_EQ(net.activation_pool().bytes_lent(), results) << c.name;
      const bool reused = ExpectArenaLayoutIsSafe(plan, c.name);
      // Training plans the activation gradients in the same arena: no separate pool, and
      // gradients land on memory of activations already given back.
      size_t grads = 0;
      for (size_t g = 0; g < plan.group_bytes.size(); ++g) grads += plan.group_is_grad[g];
      if (mode == NetMode::kTrain) {
        EXPECT_GT(grads, 0u) << c.name;
        EXPECT_EQ(net.grad_bytes_peak(), 0u) << c.name;
        EXPECT_TRUE(reused) << c.name;
      } else {
        EXPECT_EQ(grads, 0u) << c.name;
      }
      // The arena costs at most the groups' alignment over the peak (LeNet's and ResNet-20's
      // are within 200 bytes of it): placement wastes no whole buffer.
      EXPECT_LE(plan.arena_bytes, plan.peak_bytes + kPlanAlignment * plan.group_bytes.size())
          << c.name;
      size_t all = 0;
      for (size_t g = 0; g < plan.group_bytes.size(); ++g) {
        if (!plan.group_is_grad[g]) all += plan.group_bytes[g];
      }
      // LeNet's training reads every activation in backward (a ReLU its output, a convolution
      // or fc its input); ResNet-20's sums and splits give buffers back early.
      if (mode == NetMode::kInference || c.name == "resnet20") {
        EXPECT_LT(plan.peak_bytes, all) << c.name << ": every activation alive at once";
      }
    }
  }
  // ResNet-20 in inference holds a few feature maps, not its 60-odd.
  NetOptions infer;
  infer.mode = NetMode::kInference;
  Net net(BuildModel("resnet20", Small(3, 16)), 1, DType::kF32, infer);
  size_t all = 0;
  for (size_t b : net.memory_plan().group_bytes) all += b;
  EXPECT_LT(net.memory_plan().peak_bytes * 8, all);
}

// Every buffer the plan gives back is filled with NaN; gradients through a fan-out, residual
// sums, in-place ReLUs, batch norm and pooling still match the numeric ones and equal, bit for
// bit, those of a net that keeps every activation: nothing reads a buffer after it went back.
TEST(MemoryPlan, PoisonedReleasedBuffersAreNeverRead) {
  SetNumThreads(2);
  for (const Case& c : Cases()) {
    NetOptions poison;
    poison.plan_memory = true;
    poison.poison_released = true;
    Net net(c.spec, 3, DType::kF64, poison);
    Net plain(c.spec, 3, DType::kF64);
    FillRandom(net, 4);
    FillRandom(plain, 4);
    const double loss = net.Forward();
    EXPECT_EQ(loss, plain.Forward()) << c.name;
    net.Backward();
    plain.Backward();
    std::vector<Param*> params = net.params(), plain_params = plain.params();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(std::memcmp(params[i]->grad.raw_data(), plain_params[i]->grad.raw_data(),
                            params[i]->grad.nbytes()),
                0)
          << c.name << " " << params[i]->name;
    }
    // The poison is there: some activation other than a result reads NaN now, and so does
    // some activation gradient (they are given back, and poisoned, too).
    bool poisoned = false, poisoned_grad = false;
    for (auto& layer : net.layers()) {
      const Blob& b = *net.blob(layer->spec().outputs[0]);
      const Tensor& t = b.data;
      if (t.dtype() == DType::kF64 && t.numel() > 0 && std::isnan(t.data<double>()[0])) {
        poisoned = true;
      }
      if (b.grad.defined() && b.grad.dtype() == DType::kF64 && b.grad.numel() > 0 &&
          std::isnan(b.grad.data<double>()[0])) {
        poisoned_grad = true;
      }
    }
    EXPECT_TRUE(poisoned) << c.name;
    EXPECT_TRUE(poisoned_grad) << c.name;
    // Gradients were placed on bytes of activations given back before them (and activations
    // of the next pass on the gradients'), so a stale read would have met another buffer's
    // numbers or the poison.
    EXPECT_TRUE(ExpectArenaLayoutIsSafe(net.memory_plan(), c.name)) << c.name;
    // Numeric gradients (central differences) of a few weights of each parameter.
    const double eps = 1e-6;
    for (size_t k = 0; k < params.size(); k += c.name == "resnet20" ? 7 : 1) {
      Param* p = params[k];
      const Tensor analytic = p->grad.Clone();
      for (int64_t i = 0; i < p->value.numel(); i += std::max<int64_t>(1, p->value.numel() / 2)) {
        double& w = p->value.data<double>()[i];
        const double saved = w;
        w = saved + eps;
        const double plus = net.Forward();
        w = saved - eps;
        const double minus = net.Forward();
        w = saved;
        const double numeric = (plus - minus) / (2 * eps);
        EXPECT_NEAR(analytic.data<double>()[i], numeric, 1e-5 * std::max(1.0, std::abs(numeric)))
            << c.name << " " << p->name << " index " << i;
      }
    }
  }
}

// An inference net makes no parameter or activation gradient and no Split, loads a training
// net's checkpoint as it is, and computes what the training net computes in test phase, bit
// for bit (batch norm from its running statistics).
TEST(MemoryPlan, InferenceNetHasNoTrainingStateAndMatchesTestPhaseBitForBit) {
  SetNumThreads(2);
  for (const Case& c : Cases()) {
    Net train(c.spec, 5, DType::kF32);
    FillRandom(train, 6);
    // Move the batch-norm statistics away from their initial values.
    for (int i = 0; i < 2; ++i) {
      train.Forward();
      train.Backward();
    }
    Checkpoint ckpt;
    train.SaveState(ckpt);
    NetOptions infer;
    infer.mode = NetMode::kInference;
    Net net(c.spec, 99, DType::kF32, infer);
    net.LoadState(ckpt, "memory");
    FillRandom(net, 7);
    FillRandom(train, 7);
    train.set_phase(Phase::kTest);
    const double expected = train.Forward();
    const double got = net.Forward();
    EXPECT_EQ(std::memcmp(&expected, &got, sizeof got), 0)
        << c.name << ": " << got << " vs " << expected;
    for (const auto& layer : net.layers()) {
      EXPECT_NE(layer->type(), "Split") << c.name;
      for (const std::string& out : layer->spec().outputs) {
        if (!out.empty() && (out == "acc" || out == "top1" || out == "top5")) {
          const float a = net.blob(out)->data.data<float>()[0];
          const float b = train.blob(out)->data.data<float>()[0];
          EXPECT_EQ(a, b) << c.name << " " << out;
        }
      }
    }
    for (Param* p : net.params()) EXPECT_FALSE(p->grad.defined()) << c.name << " " << p->name;
    EXPECT_EQ(net.grad_bytes_peak(), 0u);
    EXPECT_EQ(net.memory_plan().grad_group, std::vector<int>(net.memory_plan().group.size(), -1));
    // Max pooling's argmax is one buffer of the net's in inference, not one per layer.
    if (c.name == "lenet") {
      EXPECT_EQ(net.context().scratch->ForwardOnly().numel(), 4 * 64 * 7 * 7) << "pool2's, last";
      EXPECT_FALSE(train.context().scratch->ForwardOnly().defined());
    }
    EXPECT_THROW(net.Backward(), Error);
    EXPECT_THROW(net.set_phase(Phase::kTrain), Error);
  }
}

// A batch larger than the plan's: buffers that outgrow their place in the arena get storage of
// their own for that pass (so they cannot run into their neighbours), the next pass plans for
// the new size, and a smaller batch again fits the larger arena; every pass computes what a net
// that keeps every activation computes, bit for bit.
TEST(MemoryPlan, ABatchLargerThanThePlansNeverOverlapsItsNeighbours) {
  SetNumThreads(2);
  for (const Case& c : Cases()) {
    NetOptions options;
    options.plan_memory = true;
    options.poison_released = true;
    Net net(c.spec, 3, DType::kF64, options);
    Net plain(c.spec, 3, DType::kF64);
    std::vector<size_t> arena;  // by pass
    for (int64_t batch : {4, 6, 6, 3, 3}) {
      net.SetBatchSize(batch);
      plain.SetBatchSize(batch);
      FillRandom(net, static_cast<uint64_t>(batch));
      FillRandom(plain, static_cast<uint64_t>(batch));
      const double loss = net.Forward();
      EXPECT_EQ(loss, plain.Forward()) << c.name << " batch " << batch;
      net.Backward();
      plain.Backward();
      const std::vector<Param*> params = net.params(), plain_params = plain.params();
      for (size_t i = 0; i < params.size(); ++i) {
        ASSERT_EQ(std::memcmp(params[i]->grad.raw_data(), plain_params[i]->grad.raw_data(),
                              params[i]->grad.nbytes()),
                  0)
            << c.name << " batch " << batch << " " << params[i]->name;
      }
      arena.push_back(net.activation_pool().bytes_created());
    }
    // The first pass at 6 runs on the plan for 4 (what outgrew it on storage of its own), the
    // second plans for 6; 3 fits the arena made for 6, which stays.
    EXPECT_EQ(arena[1], arena[0]) << c.name;
    EXPECT_GT(arena[2], arena[0]) << c.name;
    EXPECT_EQ(arena[3], arena[2]) << c.name;
    EXPECT_EQ(arena[4], arena[2]) << c.name;
  }
}

// A checkpoint file with solver state (momentum, as large as the weights) loads into an
// inference net with Net::IsNetState: the momentum is passed over in the file and never made
// a tensor, the net's outputs are those of the full load, and the net has no gradient.
TEST(MemoryPlan, ACheckpointLoadsIntoAnInferenceNetWithoutItsSolverState) {
  SetNumThreads(2);
  testing::TempDir dir;
  const NetSpec spec = BuildModel("lenet", Small(1, 28));
  Net train(spec, 5, DType::kF32);
  FillRandom(train, 6);
  SgdSolver solver(train.params(), SgdOptions{});
  train.Forward();
  train.Backward();
  solver.Step(0.1);
  Checkpoint saved;
  saved.meta["iteration"] = "1";
  train.SaveState(saved);
  solver.SaveState(saved);
  const std::string path = dir / "ckpt-00000001.cortado";
  SaveCheckpoint(saved, path);

  const Checkpoint all = LoadCheckpoint(path);
  const Checkpoint weights = LoadCheckpoint(path, Net::IsNetState);
  size_t momentum = 0, net_state = 0;
  for (const auto& [name, t] : all.tensors) {
    momentum += name.rfind("momentum/", 0) == 0;
    net_state += Net::IsNetState(name);
  }
  EXPECT_EQ(momentum, train.params().size());
  EXPECT_EQ(weights.tensors.size(), net_state);
  for (const auto& [name, t] : weights.tensors) EXPECT_TRUE(Net::IsNetState(name)) << name;
  EXPECT_EQ(weights.meta, all.meta);
  Checkpoint newest;
  EXPECT_EQ(NewestLoadableCheckpoint(dir.path(), &newest, Net::IsNetState), path);
  EXPECT_EQ(newest.tensors.size(), net_state);

  NetOptions infer;
  infer.mode = NetMode::kInference;
  Net from_all(spec, 9, DType::kF32, infer), from_weights(spec, 9, DType::kF32, infer);
  from_all.LoadState(all, path);
  from_weights.LoadState(weights, path);
  FillRandom(from_all, 8);
  FillRandom(from_weights, 8);
  EXPECT_EQ(from_all.Forward(), from_weights.Forward());
  for (Param* p : from_weights.params()) EXPECT_FALSE(p->grad.defined()) << p->name;
  // A damaged file is refused as it is without the filter.
  std::string bytes = testing::ReadFileBytes(path);
  bytes[bytes.size() / 2] ^= 1;
  testing::WriteFile(path, bytes);
  EXPECT_THROW(LoadCheckpoint(path, Net::IsNetState), Error);
}

}  // namespace
}  // namespace cortado
