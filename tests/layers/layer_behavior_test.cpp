// Behaviour beyond gradients and golden values: settings and error messages, initialization,
// dropout's counter-based masks, synchronized batch norm, accuracy's tie rule, Split sharing
// storage, and layers running inside a Net (Split insertion, loss seeding).
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "engine/base/thread_pool.h"
#include "engine/graph/net.h"
#include "tests/layers/gradient_check.h"
#include "tests/layers/layer_harness.h"
#include "tests/support/errors.h"

namespace cortado::testing {
namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kF64 = DType::kF64;

using testing::ErrorOf;

TEST(LayerRegistry, EveryLayerIsRegistered) {
  for (const char* type :
       {"Convolution", "InnerProduct", "BatchNorm", "ReLU", "Pooling", "Eltwise", "Dropout",
        "Flatten", "Concat", "SoftmaxWithLoss", "Accuracy", "Split", "L2Norm", "Permute", "Reshape",
        "PriorBox", "MultiBoxLoss", "DetectionOutput"}) {
    EXPECT_TRUE(LayerRegistry::Has(type)) << type;
  }
}

TEST(LayerErrors, UnknownSettingIsReported) {
  Settings s;
  s.Set("num_output", 4).Set("kernel", 3).Set("kernal_size", 3);
  std::string msg = ErrorOf([&] {
    LayerHarness h("Convolution", s, {RandomTensor({1, 1, 5, 5}, kF32, 1)});
  });
  EXPECT_NE(msg.find("kernal_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'layer' (Convolution)"), std::string::npos) << msg;
}

TEST(LayerErrors, WrongShapesAndDtypesNameTheLayer) {
  Settings conv;
  conv.Set("num_output", 2).Set("kernel", 3);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("Convolution", conv, {RandomTensor({2, 5, 5}, kF32, 1)});
            }).find("must be 4-d"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("Convolution", conv, {LabelTensor(4, 3, 1)});
            }).find("must be f32, f64, bf16 or f16"),
            std::string::npos);
  // The input's channel count changes after SetUp.
  LayerHarness h("Convolution", conv, {RandomTensor({1, 3, 5, 5}, kF32, 1)});
  h.bottom()[0]->data = RandomTensor({1, 4, 5, 5}, kF32, 2);
  EXPECT_NE(ErrorOf([&] { h.Forward(); }).find("must be (N, 3, H, W)"), std::string::npos);
  Settings big;
  big.Set("num_output", 2).Set("kernel", 7);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h2("Convolution", big, {RandomTensor({1, 1, 5, 5}, kF32, 1)});
            }).find("smaller than"),
            std::string::npos);
  Settings groups;
  groups.Set("num_output", 4).Set("kernel", 1).Set("groups", 3);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h2("Convolution", groups, {RandomTensor({1, 4, 2, 2}, kF32, 1)});
            }).find("groups"),
            std::string::npos);
  Settings ip;
  ip.Set("num_output", 3);
  LayerHarness fc("InnerProduct", ip, {RandomTensor({2, 6}, kF32, 1)});
  fc.bottom()[0]->data = RandomTensor({2, 7}, kF32, 2);
  EXPECT_NE(ErrorOf([&] { fc.Forward(); }).find("6 features"), std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness e("Eltwise", Settings(),
                             {RandomTensor({2, 3}, kF32, 1), RandomTensor({3, 2}, kF32, 2)});
            }).find("same shape"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness e("Eltwise", Settings(),
                             {RandomTensor({2, 3}, kF32, 1), RandomTensor({2, 3}, kF64, 2)});
            }).find("same dtype"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness c("Concat", Settings(),
                             {RandomTensor({2, 3, 4}, kF32, 1), RandomTensor({2, 3, 5}, kF32, 2)});
            }).find("does not match"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness c("Concat", Settings(), {RandomTensor({2, 3}, kF32, 1)});
            }).find("at least 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness l("SoftmaxWithLoss", Settings(),
                             {RandomTensor({4, 3}, kF32, 1), RandomTensor({4}, kF32, 2)});
            }).find("must be i32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness l("SoftmaxWithLoss", Settings(),
                             {RandomTensor({4, 3}, kF32, 1), LabelTensor(5, 3, 2)});
            }).find("must be (4)"),
            std::string::npos);
}

TEST(LayerErrors, BadSettingValues) {
  auto conv_error = [](Settings s) {
    return ErrorOf([&] {
      LayerHarness h("Convolution", s, {RandomTensor({1, 1, 5, 5}, kF32, 1)});
    });
  };
  Settings no_kernel;
  no_kernel.Set("num_output", 2);
  EXPECT_NE(conv_error(no_kernel).find("'kernel'"), std::string::npos);
  Settings init;
  init.Set("num_output", 2).Set("kernel", 3).Set("weight_init", "xavier");
  EXPECT_NE(conv_error(init).find("kaiming_uniform, kaiming_normal, normal or xavier_uniform"),
            std::string::npos);
  Settings stray_std;
  stray_std.Set("num_output", 2).Set("kernel", 3).Set("weight_std", 0.1);
  EXPECT_NE(conv_error(stray_std).find("'weight_std' applies to weight_init: normal only"),
            std::string::npos);
  Settings bad_std;
  bad_std.Set("num_output", 2).Set("kernel", 3).Set("weight_init", "normal").Set("weight_std", 0.0);
  EXPECT_NE(conv_error(bad_std).find("'weight_std' must be positive"), std::string::npos);
  Settings bad_bias;
  bad_bias.Set("num_output", 2).Set("kernel", 3).Set("bias_init", "ones");
  EXPECT_NE(conv_error(bad_bias).find("'bias_init' expects default or zero"), std::string::npos);
  Settings neg;
  neg.Set("num_output", -1).Set("kernel", 3);
  EXPECT_NE(conv_error(neg).find("'num_output' must be positive"), std::string::npos);
  Settings pool;
  pool.Set("pool", "median").Set("kernel", 2);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("Pooling", pool, {RandomTensor({1, 1, 4, 4}, kF32, 1)});
            }).find("max or ave"),
            std::string::npos);
  Settings pad;
  pad.Set("pool", "max").Set("kernel", 2).Set("pad", 2);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("Pooling", pad, {RandomTensor({1, 1, 4, 4}, kF32, 1)});
            }).find("half the kernel"),
            std::string::npos);
  Settings coeffs;
  coeffs.SetList("coeffs", {"1", "2", "3"});
  EXPECT_NE(
      ErrorOf([&] {
        LayerHarness e("Eltwise", coeffs, {RandomTensor({2}, kF32, 1), RandomTensor({2}, kF32, 2)});
      }).find("one coefficient per input"),
      std::string::npos);
  Settings ratio;
  ratio.Set("ratio", 1.0);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("Dropout", ratio, {RandomTensor({2}, kF32, 1)});
            }).find("[0, 1)"),
            std::string::npos);
  Settings smoothing;
  smoothing.Set("label_smoothing", -0.1);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("SoftmaxWithLoss", smoothing,
                             {RandomTensor({2, 3}, kF32, 1), LabelTensor(2, 3, 1)});
            }).find("label_smoothing"),
            std::string::npos);
}

TEST(LayerErrors, LabelOutOfRangeNamesLayerAndSample) {
  Tensor label = LabelTensor(3, 4, 1);
  label.data<int32_t>()[2] = 4;
  LayerHarness loss("SoftmaxWithLoss", Settings(), {RandomTensor({3, 4}, kF32, 1), label}, 1,
                    Phase::kTrain, "xent");
  std::string msg = ErrorOf([&] { loss.Forward(); });
  EXPECT_NE(msg.find("layer 'xent' (SoftmaxWithLoss): label 4 of sample 2 is out of range [0, 4)"),
            std::string::npos)
      << msg;
  label.data<int32_t>()[2] = -1;
  LayerHarness acc("Accuracy", Settings(), {RandomTensor({3, 4}, kF32, 1), label}, 1, Phase::kTest,
                   "acc");
  EXPECT_NE(ErrorOf([&] { acc.Forward(); }).find("label -1 of sample 2"), std::string::npos);
}

TEST(LayerParams, NamesKindsAndInitialization) {
  Settings s;
  s.Set("num_output", 64).Set("kernel", 3);
  LayerHarness conv("Convolution", s, {RandomTensor({1, 16, 8, 8}, kF32, 1)}, 1, Phase::kTrain,
                    "conv1");
  ASSERT_EQ(conv.layer().params().size(), 2u);
  const Param& w = conv.layer().params()[0];
  const Param& b = conv.layer().params()[1];
  EXPECT_EQ(w.name, "conv1.weight");
  EXPECT_EQ(b.name, "conv1.bias");
  EXPECT_EQ(w.kind, ParamKind::kWeight);
  EXPECT_EQ(b.kind, ParamKind::kBias);
  EXPECT_EQ(w.value.shape(), (Shape{64, 16, 3, 3}));
  // kaiming_uniform: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 16 * 9 = 144.
  const double bound = 1.0 / 12.0;
  double max_abs = 0, sum_sq = 0;
  for (int64_t i = 0; i < w.value.numel(); ++i) {
    const double v = w.value.data<float>()[i];
    max_abs = std::max(max_abs, std::fabs(v));
    sum_sq += v * v;
  }
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.95 * bound);
  EXPECT_NEAR(std::sqrt(sum_sq / w.value.numel()), bound / std::sqrt(3.0), 0.05 * bound);
  for (int64_t i = 0; i < b.value.numel(); ++i)
    EXPECT_LE(std::fabs(b.value.data<float>()[i]), bound);

  // kaiming_normal (fan_out, relu): std = sqrt(2 / (64 * 9)).
  s.Set("weight_init", "kaiming_normal").Set("bias", false);
  LayerHarness conv2("Convolution", s, {RandomTensor({1, 16, 8, 8}, kF32, 1)});
  ASSERT_EQ(conv2.layer().params().size(), 1u);
  const Tensor& w2 = conv2.layer().params()[0].value;
  sum_sq = 0;
  for (int64_t i = 0; i < w2.numel(); ++i) sum_sq += std::pow(w2.data<float>()[i], 2);
  EXPECT_NEAR(std::sqrt(sum_sq / w2.numel()), std::sqrt(2.0 / 576.0),
              0.03 * std::sqrt(2.0 / 576.0));

  // xavier_uniform (torchvision SSD's extra layers and heads): U(-a, a), a = sqrt(6 / (fan_in +
  // fan_out)) = sqrt(6 / (144 + 576)).
  Settings xavier = s;
  xavier.Set("weight_init", "xavier_uniform");
  LayerHarness conv3("Convolution", xavier, {RandomTensor({1, 16, 8, 8}, kF32, 1)});
  const Tensor& wx = conv3.layer().params()[0].value;
  const double a = std::sqrt(6.0 / 720.0);
  max_abs = 0, sum_sq = 0;
  for (int64_t i = 0; i < wx.numel(); ++i) {
    max_abs = std::max(max_abs, std::fabs(double{wx.data<float>()[i]}));
    sum_sq += std::pow(wx.data<float>()[i], 2);
  }
  EXPECT_LE(max_abs, a);
  EXPECT_GT(max_abs, 0.95 * a);
  EXPECT_NEAR(std::sqrt(sum_sq / wx.numel()), a / std::sqrt(3.0), 0.03 * a);

  // normal with weight_std, and zero biases (torchvision VGG's Linear and Conv2d).
  Settings fc;
  fc.Set("num_output", 300).Set("weight_init", "normal").Set("weight_std", 0.02);
  fc.Set("bias_init", "zero");
  LayerHarness linear("InnerProduct", fc, {RandomTensor({2, 100}, kF32, 1)});
  ASSERT_EQ(linear.layer().params().size(), 2u);
  const Tensor& w3 = linear.layer().params()[0].value;
  double sum = 0;
  sum_sq = 0;
  for (int64_t i = 0; i < w3.numel(); ++i) {
    sum += w3.data<float>()[i];
    sum_sq += std::pow(w3.data<float>()[i], 2);
  }
  EXPECT_NEAR(sum / w3.numel(), 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sum_sq / w3.numel()), 0.02, 0.0006);
  const Tensor& b3 = linear.layer().params()[1].value;
  for (int64_t i = 0; i < b3.numel(); ++i) EXPECT_EQ(b3.data<float>()[i], 0.0f);

  // Initialization depends on the run seed and the layer name, nothing else.
  LayerHarness same("Convolution", s, {RandomTensor({1, 16, 8, 8}, kF32, 9)}, 1, Phase::kTrain,
                    "layer", 7);
  LayerHarness other_seed("Convolution", s, {RandomTensor({1, 16, 8, 8}, kF32, 9)}, 1,
                          Phase::kTrain, "layer", 8);
  EXPECT_EQ(0, std::memcmp(w2.raw_data(), same.layer().params()[0].value.raw_data(), w2.nbytes()));
  EXPECT_NE(
      0, std::memcmp(w2.raw_data(), other_seed.layer().params()[0].value.raw_data(), w2.nbytes()));

  Settings bn;
  bn.Set("zero_init", true);
  LayerHarness norm("BatchNorm", bn, {RandomTensor({2, 3, 2, 2}, kF32, 1)}, 1, Phase::kTrain, "bn");
  ASSERT_EQ(norm.layer().params().size(), 2u);
  EXPECT_EQ(norm.layer().params()[0].name, "bn.weight");
  EXPECT_EQ(norm.layer().params()[0].kind, ParamKind::kNorm);
  EXPECT_EQ(norm.layer().params()[1].kind, ParamKind::kNorm);
  EXPECT_EQ(norm.layer().params()[0].value.data<float>()[1], 0.0f);
  ASSERT_EQ(norm.layer().buffers().size(), 2u);
  EXPECT_EQ(norm.layer().buffers()[0].name, "bn.running_mean");
  EXPECT_EQ(norm.layer().buffers()[1].name, "bn.running_var");
  EXPECT_EQ(norm.layer().buffers()[1].value.data<float>()[2], 1.0f);
}

TEST(BatchNorm, PhaseSelectsStatistics) {
  LayerHarness h("BatchNorm", Settings(), {RandomTensor({4, 2, 3, 3}, kF32, 1, 3.0)});
  h.Forward();  // training: batch statistics, output has mean ~0
  double mean = 0;
  for (int64_t i = 0; i < h.top()[0]->data.numel(); ++i) mean += h.top()[0]->data.data<float>()[i];
  EXPECT_NEAR(mean / h.top()[0]->data.numel(), 0.0, 1e-5);
  const float rm = h.layer().buffers()[0].value.data<float>()[0];
  EXPECT_NE(rm, 0.0f);  // running mean moved
  h.context().phase = Phase::kTest;
  h.Forward();  // test: running statistics, not updated
  EXPECT_EQ(rm, h.layer().buffers()[0].value.data<float>()[0]);
}

// f32 inputs with |mean| >> std: the statistics must not cancel (sums around the running
// mean, accumulated in double). The running mean starts at 0, far from the data.
TEST(BatchNorm, LargeMeanKeepsPrecisionInF32) {
  Tensor x64 = RandomTensor({8, 2, 6, 6}, kF64, 21);
  for (int64_t i = 0; i < x64.numel(); ++i) x64.data<double>()[i] += 1000.0;
  Tensor x32({8, 2, 6, 6}, kF32);
  x32.ConvertFrom(x64);
  x64.ConvertFrom(x32);  // identical inputs
  LayerHarness h32("BatchNorm", Settings(), {x32});
  LayerHarness h64("BatchNorm", Settings(), {x64});
  h32.Forward();
  h64.Forward();
  double max_diff = 0;
  for (int64_t i = 0; i < x32.numel(); ++i) {
    max_diff = std::max(max_diff, std::fabs(h32.top()[0]->data.data<float>()[i] -
                                            h64.top()[0]->data.data<double>()[i]));
  }
  // The inputs themselves carry ~6e-5 of f32 rounding at 1000; outputs are O(1).
  EXPECT_LT(max_diff, 2e-3);
}

// Ranks as threads summing through a shared buffer, in rank order (so every rank gets the
// same doubles, as the communicator guarantees).
class ThreadStatsReducer : public BatchStatsReducer {
 public:
  struct Shared {
    explicit Shared(int n) : sync(n) {}
    std::barrier<> sync;
    std::vector<double> sums;
    int calls = 0;
  };
  ThreadStatsReducer(Shared* shared, int rank, int size)
      : shared_(shared), rank_(rank), size_(size) {}
  void AllReduceSum(double* values, int64_t count) override {
    if (rank_ == 0) {
      shared_->sums.assign(count, 0.0);
      ++shared_->calls;
    }
    shared_->sync.arrive_and_wait();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) {
        for (int64_t i = 0; i < count; ++i) shared_->sums[i] += values[i];
      }
      shared_->sync.arrive_and_wait();
    }
    std::copy(shared_->sums.begin(), shared_->sums.end(), values);
    shared_->sync.arrive_and_wait();
  }
  int group_size() const override { return size_; }

 private:
  Shared* shared_;
  int rank_, size_;
};

// Splits the batch of x (and dy) into per-rank slices of the given sizes, runs one layer per
// rank on threads with synchronized statistics, and checks them against one layer on the whole
// batch: outputs, input gradients and running statistics; parameter gradients summed over ranks
// equal the full-batch ones. Returns how many all-reduce calls the ranks made.
// The ranks may run channels-last (`format`): each sample is contiguous in either format, so the
// slices are the same samples; results are compared in NCHW.
int CheckSynchronizedEqualsFullBatch(const std::vector<int64_t>& slices, Settings settings,
                                     MemoryFormat format = MemoryFormat::kNCHW) {
  const int64_t total = std::accumulate(slices.begin(), slices.end(), int64_t{0});
  const Shape full_shape{total, 3, 2, 3};
  const int64_t per_sample = 3 * 2 * 3;
  Tensor x = RandomTensor(full_shape, kF64, 11, 2.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] += 5.0;  // |mean| > std
  Tensor dy = RandomTensor(full_shape, kF64, 12);
  LayerHarness full("BatchNorm", settings, {x.Clone()}, 1, Phase::kTrain, "bn");
  full.Forward();
  full.Backward({dy});

  const int n = static_cast<int>(slices.size());
  ThreadStatsReducer::Shared shared(n);
  std::vector<std::unique_ptr<ThreadStatsReducer>> reducers;
  std::vector<std::unique_ptr<LayerHarness>> ranks;
  std::vector<int64_t> begin;
  int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    begin.push_back(at);
    Tensor xr({slices[r], 3, 2, 3}, kF64);
    std::copy(x.data<double>() + at * per_sample, x.data<double>() + (at + slices[r]) * per_sample,
              xr.data<double>());
    at += slices[r];
    reducers.push_back(std::make_unique<ThreadStatsReducer>(&shared, r, n));
    ranks.push_back(std::make_unique<LayerHarness>(
        "BatchNorm", settings, std::vector<Tensor>{xr.Reordered(format)}, 1, Phase::kTrain, "bn"));
    ranks[r]->context().batch_stats = reducers[r].get();
    ranks[r]->context().sync_batch_norm = true;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Tensor dyr({slices[r], 3, 2, 3}, kF64);
      std::copy(dy.data<double>() + begin[r] * per_sample,
                dy.data<double>() + (begin[r] + slices[r]) * per_sample, dyr.data<double>());
      ranks[r]->Forward();
      ranks[r]->Backward({dyr.Reordered(format)});
    });
  }
  for (auto& t : threads) t.join();
  // The sums travel in f64: agreement to double rounding.
  const double tol = 1e-12;
  for (int r = 0; r < n; ++r) {
    const Tensor y = ranks[r]->top()[0]->data.Reordered(MemoryFormat::kNCHW);
    const Tensor dx = ranks[r]->bottom()[0]->grad.Reordered(MemoryFormat::kNCHW);
    for (int64_t i = 0; i < slices[r] * per_sample; ++i) {
      EXPECT_NEAR(y.data<double>()[i],
                  full.top()[0]->data.data<double>()[begin[r] * per_sample + i], tol);
      EXPECT_NEAR(dx.data<double>()[i],
                  full.bottom()[0]->grad.data<double>()[begin[r] * per_sample + i], tol);
    }
    for (int b = 0; b < 2; ++b) {
      for (int c = 0; c < 3; ++c) {
        EXPECT_NEAR(ranks[r]->layer().buffers()[b].value.data<double>()[c],
                    full.layer().buffers()[b].value.data<double>()[c], tol);
        // Running statistics end bitwise identical on every rank of the group.
        EXPECT_EQ(ranks[r]->layer().buffers()[b].value.data<double>()[c],
                  ranks[0]->layer().buffers()[b].value.data<double>()[c]);
      }
    }
  }
  for (int p = 0; p < 2; ++p) {
    for (int c = 0; c < 3; ++c) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += ranks[r]->layer().params()[p].grad.data<double>()[c];
      EXPECT_NEAR(sum, full.layer().params()[p].grad.data<double>()[c], 1e-10);
    }
  }
  return shared.calls;
}

TEST(BatchNorm, SynchronizedAcrossRanksEqualsFullBatch) {
  EXPECT_EQ(CheckSynchronizedEqualsFullBatch({3, 3}, Settings()), 2);  // forward + backward
  EXPECT_EQ(CheckSynchronizedEqualsFullBatch({2, 2, 2}, Settings()), 2);
}

// Channels-last ranks (model.layout: nhwc) sum the same statistics, with the fused ReLU too.
TEST(BatchNorm, SynchronizedChannelsLastEqualsFullBatch) {
  Settings relu;
  relu.Set("relu", true);
  EXPECT_EQ(CheckSynchronizedEqualsFullBatch({3, 3}, Settings(), MemoryFormat::kNHWC), 2);
  EXPECT_EQ(CheckSynchronizedEqualsFullBatch({4, 2, 3}, relu, MemoryFormat::kNHWC), 2);
}

// A short last batch on one rank weighs by its size, not as much as a full one.
TEST(BatchNorm, SynchronizedWeighsUnequalBatchesBySize) {
  EXPECT_EQ(CheckSynchronizedEqualsFullBatch({5, 1}, Settings()), 2);
  EXPECT_EQ(CheckSynchronizedEqualsFullBatch({4, 2, 3}, Settings()), 2);
}

// `sync: false` on a layer keeps per-rank statistics even when the net-wide default is on;
// `sync: true` with no reducer (a single process) is simply local.
TEST(BatchNorm, PerLayerSyncSettingOverridesTheNetDefault) {
  Settings off;
  off.Set("sync", false);
  Tensor x = RandomTensor({4, 2, 3}, kF64, 5);
  ThreadStatsReducer::Shared shared(1);
  ThreadStatsReducer reducer(&shared, 0, 1);
  LayerHarness h("BatchNorm", off, {x}, 1, Phase::kTrain, "bn");
  h.context().batch_stats = &reducer;
  h.context().sync_batch_norm = true;
  h.Forward();
  EXPECT_EQ(shared.calls, 0);
  Settings on;
  on.Set("sync", true);
  LayerHarness h2("BatchNorm", on, {x}, 1, Phase::kTrain, "bn");
  h2.context().batch_stats = &reducer;
  h2.Forward();
  EXPECT_EQ(shared.calls, 1);
  LayerHarness h3("BatchNorm", on, {x}, 1, Phase::kTrain, "bn");
  h3.Forward();  // no reducer: local statistics, no error
}

// Counts how many elements the layer zeroed; returns the top data.
Tensor RunDropout(const std::string& name, uint64_t seed, int64_t iteration, const Tensor& x,
                  Phase phase = Phase::kTrain) {
  Settings s;
  s.Set("ratio", 0.3);
  LayerHarness h("Dropout", s, {x}, 1, phase, name, seed);
  h.context().iteration = iteration;
  h.Forward();
  return h.top()[0]->data.Clone();
}

TEST(Dropout, CounterBasedMaskIsReproducibleAndScaled) {
  Tensor x({100000}, kF32);
  x.Fill(1.0);
  Tensor a = RunDropout("drop", 1, 5, x);
  int64_t zeros = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float v = a.data<float>()[i];
    if (v == 0.0f) {
      ++zeros;
    } else {
      EXPECT_FLOAT_EQ(v, 1.0f / 0.7f);
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros) / a.numel(), 0.3, 0.01);
  // Same (seed, name, iteration): same mask, at any thread count.
  const int saved = NumThreads();
  SetNumThreads(3);
  Tensor b = RunDropout("drop", 1, 5, x);
  SetNumThreads(saved);
  EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()));
  // Any change of iteration, name or seed gives a different mask.
  for (const Tensor& other :
       {RunDropout("drop", 1, 6, x), RunDropout("drop2", 1, 5, x), RunDropout("drop", 2, 5, x)}) {
    EXPECT_NE(0, std::memcmp(a.raw_data(), other.raw_data(), a.nbytes()));
  }
  // Test phase: identity.
  Tensor t = RunDropout("drop", 1, 5, x, Phase::kTest);
  EXPECT_EQ(0, std::memcmp(x.raw_data(), t.raw_data(), x.nbytes()));
}

TEST(Accuracy, TopKWithPessimisticTies) {
  // Sample 0: label 1 is the unique max. Sample 1: label 0 ties with class 2 for the max.
  // Sample 2: label 2 is second. Sample 3: NaN score for the label.
  Tensor scores({4, 3}, kF32);
  const float v[] = {0.1f, 0.9f, 0.2f, 0.5f, 0.1f, 0.5f, 0.3f, 0.9f, 0.5f, 1.0f, 2.0f, NAN};
  std::copy(v, v + 12, scores.data<float>());
  Tensor label({4}, DType::kI32);
  const int32_t l[] = {1, 0, 2, 2};
  std::copy(l, l + 4, label.data<int32_t>());
  auto accuracy = [&](int k) {
    Settings s;
    s.Set("top_k", k);
    LayerHarness h("Accuracy", s, {scores, label}, 1, Phase::kTest);
    h.Forward();
    EXPECT_EQ(h.top()[0]->data.numel(), 1);
    EXPECT_EQ(h.top()[0]->data.ndim(), 0);
    return h.top()[0]->data.data<float>()[0];
  };
  EXPECT_FLOAT_EQ(accuracy(1), 0.25f);  // only sample 0
  EXPECT_FLOAT_EQ(accuracy(2), 0.75f);  // the tie fits in the top 2; NaN never counts
  EXPECT_FLOAT_EQ(accuracy(3), 0.75f);
}

TEST(SoftmaxWithLoss, ScalarOutputAndLossWeight) {
  Settings s;
  s.Set("loss_weight", 0.5);
  LayerHarness h("SoftmaxWithLoss", s, {RandomTensor({4, 5}, kF32, 1), LabelTensor(4, 5, 2)});
  EXPECT_TRUE(h.layer().IsLoss());
  EXPECT_FALSE(h.layer().CanBackpropTo(1));
  EXPECT_FLOAT_EQ(h.layer().loss_weight(), 0.5f);
  h.Forward();
  EXPECT_EQ(h.top()[0]->data.shape(), Shape{});
  EXPECT_GT(h.top()[0]->data.data<float>()[0], 0.0f);
  // Logits (N, C, 1, 1) are accepted as (N, C).
  LayerHarness h4("SoftmaxWithLoss", Settings(),
                  {RandomTensor({4, 5, 1, 1}, kF32, 1), LabelTensor(4, 5, 2)});
  h4.Forward();
  LayerHarness h2("SoftmaxWithLoss", Settings(),
                  {RandomTensor({4, 5}, kF32, 1), LabelTensor(4, 5, 2)});
  h2.Forward();
  EXPECT_FLOAT_EQ(h4.top()[0]->data.data<float>()[0], h2.top()[0]->data.data<float>()[0]);
}

TEST(Split, TopsShareTheBottomStorage) {
  LayerHarness h("Split", Settings(), {RandomTensor({2, 3}, kF32, 1)}, 2);
  h.Forward();
  EXPECT_EQ(h.top()[0]->data.raw_data(), h.bottom()[0]->data.raw_data());
  EXPECT_EQ(h.top()[1]->data.raw_data(), h.bottom()[0]->data.raw_data());
  // A label blob can be split too (no gradient).
  LayerHarness labels("Split", Settings(), {LabelTensor(4, 3, 1)}, 2);
  labels.Forward();
  EXPECT_EQ(labels.top()[1]->data.dtype(), DType::kI32);
}

TEST(Pooling, OutputSizesFollowPyTorch) {
  struct Case {
    int64_t in, k, s, p;
    bool ceil;
    int64_t want;
  };
  // Values from torch.nn.functional.max_pool2d on an (in x in) input.
  const Case cases[] = {{28, 2, 2, 0, false, 14}, {7, 3, 2, 1, true, 4},  {5, 2, 2, 1, true, 3},
                        {6, 3, 2, 0, true, 3},    {6, 3, 2, 0, false, 2}, {8, 3, 2, 1, true, 5},
                        {1, 1, 1, 0, false, 1},   {4, 3, 3, 1, true, 2}};
  for (const Case& c : cases) {
    Settings s;
    s.Set("pool", "max")
        .Set("kernel", c.k)
        .Set("stride", c.s)
        .Set("pad", c.p)
        .Set("ceil_mode", c.ceil);
    LayerHarness h("Pooling", s, {RandomTensor({1, 1, c.in, c.in}, kF32, 1)});
    EXPECT_EQ(h.top()[0]->data.dim(2), c.want)
        << "in " << c.in << " k " << c.k << " s " << c.s << " p " << c.p << " ceil " << c.ceil;
  }
  // stride defaults to the kernel.
  Settings def;
  def.Set("pool", "ave").Set("kernel", 2);
  LayerHarness h("Pooling", def, {RandomTensor({1, 1, 6, 6}, kF32, 1)});
  EXPECT_EQ(h.top()[0]->data.dim(2), 3);
}

// A NaN inside a max-pooling window is the window's output (PyTorch's rule), on the 2x2 fast
// path and on the general one, and the gradient goes to it.
TEST(Pooling, MaxPropagatesNaN) {
  for (int pad = 0; pad < 2; ++pad) {
    Tensor x = DistinctTensor({1, 1, 4, 4}, kF32, 3);
    x.data<float>()[1 * 4 + 1] = NAN;
    Settings s;
    s.Set("pool", "max").Set("kernel", 2).Set("stride", 2).Set("pad", pad);
    LayerHarness h("Pooling", s, {x});
    h.Forward();
    const Tensor& y = h.top()[0]->data;
    const int64_t nan_out = pad == 0 ? 0 : 1 * y.dim(3) + 1;  // the window holding (1, 1)
    EXPECT_TRUE(std::isnan(y.data<float>()[nan_out])) << "pad " << pad;
    int nans = 0;
    for (int64_t i = 0; i < y.numel(); ++i) nans += std::isnan(y.data<float>()[i]) ? 1 : 0;
    EXPECT_EQ(nans, 1);
    Tensor dy(y.shape(), kF32);
    dy.Fill(1.0);
    h.Backward({dy});
    EXPECT_EQ(h.bottom()[0]->grad.data<float>()[1 * 4 + 1], 1.0f) << "pad " << pad;
  }
}

// A small residual network run through the Net: the net inserts Split for the fan-out, the
// loss gradient is seeded by the net, and a numerical check of every parameter through
// Net::Forward agrees with Net::Backward.
TEST(LayersInNet, ResidualBlockGradients) {
  NetSpec spec;
  spec.name = "tiny_resnet";
  spec.inputs = {{"data", {4, 2, 5, 5}, kF32}, {"label", {4}, DType::kI32}};
  auto layer = [&](const std::string& name, const std::string& type, std::vector<std::string> in,
                   std::vector<std::string> out, Settings s) {
    LayerSpec l;
    l.name = name;
    l.type = type;
    l.inputs = std::move(in);
    l.outputs = std::move(out);
    l.settings = s;
    spec.layers.push_back(l);
  };
  Settings conv;
  conv.Set("num_output", 3).Set("kernel", 3).Set("pad", 1).Set("bias", false);
  layer("conv0", "Convolution", {"data"}, {"c0"}, conv);
  layer("bn0", "BatchNorm", {"c0"}, {"b0"}, Settings());
  layer("relu0", "ReLU", {"b0"}, {"r0"}, Settings());
  layer("conv1", "Convolution", {"r0"}, {"c1"}, conv);
  layer("bn1", "BatchNorm", {"c1"}, {"b1"}, Settings());
  layer("add", "Eltwise", {"b1", "r0"}, {"sum"}, Settings());
  Settings gap;
  gap.Set("pool", "ave").Set("global", true);
  layer("pool", "Pooling", {"sum"}, {"pooled"}, gap);
  layer("flat", "Flatten", {"pooled"}, {"flat"}, Settings());
  Settings fc;
  fc.Set("num_output", 3);
  layer("fc", "InnerProduct", {"flat"}, {"logits"}, fc);
  Settings smooth;
  smooth.Set("label_smoothing", 0.1);
  layer("loss", "SoftmaxWithLoss", {"logits", "label"}, {"loss"}, smooth);
  layer("acc", "Accuracy", {"logits", "label"}, {"accuracy"}, Settings());

  Net net(spec, 3, kF64);
  bool has_split = false;
  for (auto& l : net.layers()) has_split = has_split || l->type() == "Split";
  EXPECT_TRUE(has_split) << "the net should split r0 (read by conv1 and add)";
  Tensor data = RandomTensor({4, 2, 5, 5}, kF64, 5);
  net.input("data").CopyFrom(data);
  net.input("label").CopyFrom(LabelTensor(4, 3, 6));
  net.Forward();
  net.Backward();
  const double h = 1e-5;
  int checked = 0;
  for (Param* p : net.params()) {
    double* v = p->value.data<double>();
    for (int64_t i = 0; i < p->value.numel(); i += 3) {
      const double saved = v[i];
      v[i] = saved + h;
      const double plus = net.Forward();
      v[i] = saved - h;
      const double minus = net.Forward();
      v[i] = saved;
      const double numeric = (plus - minus) / (2 * h);
      const double analytic = p->grad.data<double>()[i];
      EXPECT_NEAR(analytic, numeric, 1e-7 + 1e-5 * std::fabs(numeric))
          << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace cortado::testing
