// Per-layer time of one training step (forward + backward, no solver) for a model from
// models/, at batch 128 on the engine's thread budget. Used to find where the time goes when
// comparing with PyTorch (scripts/experiments/layer_profile.sh builds and runs it).
//
//   layer_profile [model=lenet] [batch=128] [threads=2] [iterations=20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/net.h"
#include "models/builders.h"

using namespace cortado;

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "lenet";
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 128;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int iterations = argc > 4 ? std::atoi(argv[4]) : 20;
  SetNumThreads(threads);
  ModelOptions options;
  options.batch_size = batch;
  Net net(BuildModel(model, options), 1);
  Rng rng(1);
  Tensor& data = net.input("data");
  for (int64_t i = 0; i < data.numel(); ++i)
    data.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
  Tensor& label = net.input("label");
  for (int64_t i = 0; i < label.numel(); ++i)
    label.data<int32_t>()[i] = static_cast<int32_t>(rng.Below(10));
  net.set_profiling(true);
  std::map<std::string, std::pair<double, double>> by_layer, by_type;
  std::vector<std::string> order;
  double total = 0, best = 1e30;
  for (int it = 0; it < iterations + 3; ++it) {
    net.set_iteration(it);
    auto t0 = std::chrono::steady_clock::now();
    net.Forward();
    net.Backward();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it < 3) continue;  // warm-up
    total += dt;
    best = std::min(best, dt);
    for (const auto& lt : net.layer_times()) {
      if (!by_layer.count(lt.name)) order.push_back(lt.name);
      by_layer[lt.name].first += lt.forward_s;
      by_layer[lt.name].second += lt.backward_s;
      by_type[lt.type].first += lt.forward_s;
      by_type[lt.type].second += lt.backward_s;
    }
  }
  std::printf(
      "%s batch %lld threads %d: %.2f ms/step (forward+backward; fastest %.2f), "
      "%.0f img/s\n",
      model.c_str(), static_cast<long long>(batch), threads, 1e3 * total / iterations, 1e3 * best,
      batch * iterations / total);
  std::printf("\n%-28s %10s %10s\n", "layer", "fwd ms", "bwd ms");
  for (const auto& name : order) {
    std::printf("%-28s %10.3f %10.3f\n", name.c_str(), 1e3 * by_layer[name].first / iterations,
                1e3 * by_layer[name].second / iterations);
  }
  std::printf("\n%-28s %10s %10s\n", "type", "fwd ms", "bwd ms");
  for (const auto& [type, t] : by_type) {
    std::printf("%-28s %10.3f %10.3f\n", type.c_str(), 1e3 * t.first / iterations,
                1e3 * t.second / iterations);
  }
  return 0;
}
