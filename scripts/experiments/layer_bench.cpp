// Microbenchmark of single layers on the shapes of LeNet and ResNet-20 at batch 128: the
// fastest of R forward and backward passes (the minimum filters out other processes on a
// shared machine). scripts/experiments/layer_bench.py times the same ops in PyTorch.
//
//   layer_bench [threads=2] [reps=20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/layer.h"

using namespace cortado;

struct Case {
  std::string label, type;
  Settings settings;
  Shape shape;
};

static double Seconds(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  SetNumThreads(threads);
  auto conv = [](int out, int k, int stride, int pad, bool bias) {
    Settings s;
    s.Set("num_output", out)
        .Set("kernel", k)
        .Set("stride", stride)
        .Set("pad", pad)
        .Set("bias", bias);
    return s;
  };
  Settings maxpool, bn, none, gap, fc512;
  maxpool.Set("pool", "max").Set("kernel", 2).Set("stride", 2);
  gap.Set("pool", "ave").Set("global", true);
  fc512.Set("num_output", 512);
  const Case cases[] = {
      {"lenet.conv1 1->32 5x5 28x28", "Convolution", conv(32, 5, 1, 2, true), {128, 1, 28, 28}},
      {"lenet.conv2 32->64 5x5 14x14", "Convolution", conv(64, 5, 1, 2, true), {128, 32, 14, 14}},
      {"lenet.pool1 2x2 32x28x28", "Pooling", maxpool, {128, 32, 28, 28}},
      {"lenet.relu1 32x28x28", "ReLU", none, {128, 32, 28, 28}},
      {"lenet.fc1 3136->512", "InnerProduct", fc512, {128, 64, 7, 7}},
      {"r20.conv 16->16 3x3 28x28", "Convolution", conv(16, 3, 1, 1, false), {128, 16, 28, 28}},
      {"r20.conv 16->32 3x3 s2", "Convolution", conv(32, 3, 2, 1, false), {128, 16, 28, 28}},
      {"r20.conv 32->32 3x3 14x14", "Convolution", conv(32, 3, 1, 1, false), {128, 32, 14, 14}},
      {"r20.conv 64->64 3x3 7x7", "Convolution", conv(64, 3, 1, 1, false), {128, 64, 7, 7}},
      {"r20.proj 16->32 1x1 s2", "Convolution", conv(32, 1, 2, 0, false), {128, 16, 28, 28}},
      {"r20.bn 16x28x28", "BatchNorm", bn, {128, 16, 28, 28}},
      {"r20.bn 64x7x7", "BatchNorm", bn, {128, 64, 7, 7}},
      {"r20.relu 16x28x28", "ReLU", none, {128, 16, 28, 28}},
      {"r20.gap 64x7x7", "Pooling", gap, {128, 64, 7, 7}},
  };
  std::printf("threads %d, fastest of %d\n%-32s %10s %10s\n", threads, reps, "layer", "fwd ms",
              "bwd ms");
  for (const Case& c : cases) {
    LayerContext context;
    LayerSpec spec;
    spec.name = "bench";
    spec.type = c.type;
    spec.settings = c.settings;
    spec.inputs = {"x"};
    spec.outputs = {"y"};
    auto layer = LayerRegistry::Create(spec);
    layer->set_context(&context);
    Blob x, y;
    x.data = Tensor(c.shape);
    Rng rng(1);
    for (int64_t i = 0; i < x.data.numel(); ++i)
      x.data.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
    std::vector<Blob*> bottom{&x}, top{&y};
    layer->SetUp(bottom, top);
    x.grad = Tensor(c.shape);
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r < reps + 2; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      layer->Reshape(bottom, top);
      layer->Forward(bottom, top);
      auto t1 = std::chrono::steady_clock::now();
      if (r == 0) {
        y.grad = Tensor(y.data.shape());
        for (int64_t i = 0; i < y.grad.numel(); ++i)
          y.grad.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
      }
      layer->Backward(top, {c.label.rfind("lenet.conv1", 0) != 0}, bottom);
      auto t2 = std::chrono::steady_clock::now();
      if (r >= 2) {
        fwd = std::min(fwd, Seconds(t0, t1));
        bwd = std::min(bwd, Seconds(t1, t2));
      }
    }
    std::printf("%-32s %10.3f %10.3f\n", c.label.c_str(), 1e3 * fwd, 1e3 * bwd);
  }
  return 0;
}
