// Test harness: one layer created through the registry, with blobs the test owns, so layers
// can be exercised without a Net. Header-only, for the tests in tests/layers.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/random.h"
#include "engine/graph/layer.h"
#include "engine/tensor/tensor.h"

namespace cortado::testing {

class LayerHarness {
 public:
  // Creates layer `type` named `name` with `settings`, feeds `inputs` as its bottoms (the
  // tensors are shared, not copied) and sets it up with `num_tops` outputs.
  LayerHarness(const std::string& type, const Settings& settings, std::vector<Tensor> inputs,
               int num_tops = 1, Phase phase = Phase::kTrain, const std::string& name = "layer",
               uint64_t seed = 7) {
    context_.phase = phase;
    context_.seed = seed;
    LayerSpec spec;
    spec.name = name;
    spec.type = type;
    spec.settings = settings;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto b = std::make_unique<Blob>();
      b->name = "in" + std::to_string(i);
      b->data = inputs[i];
      spec.inputs.push_back(b->name);
      bottom_.push_back(b.get());
      bottoms_.push_back(std::move(b));
    }
    for (int j = 0; j < num_tops; ++j) {
      auto t = std::make_unique<Blob>();
      t->name = "out" + std::to_string(j);
      spec.outputs.push_back(t->name);
      top_.push_back(t.get());
      tops_.push_back(std::move(t));
    }
    layer_ = LayerRegistry::Create(spec);
    layer_->set_context(&context_);
    layer_->SetUp(bottom_, top_);
    layer_->spec().settings.CheckAllUsed();
  }

  Layer& layer() { return *layer_; }
  LayerContext& context() { return context_; }
  const std::vector<Blob*>& bottom() { return bottom_; }
  const std::vector<Blob*>& top() { return top_; }

  void Forward() {
    layer_->Reshape(bottom_, top_);
    layer_->Forward(bottom_, top_);
  }
  // Sizes the gradients like the data (bottom grads filled with NaN, so that a layer that
  // reads or skips part of them is caught), copies `top_grads` in and runs Backward for the
  // inputs that can take a gradient.
  // (top_grads may be in either memory format: each is reordered into its output's.)
  void Backward(const std::vector<Tensor>& top_grads) {
    for (size_t j = 0; j < top_.size(); ++j) {
      top_[j]->grad.Resize(top_[j]->data.shape(), top_[j]->data.dtype());
      top_[j]->grad.set_format(top_[j]->data.format());  // a gradient lies like its data
      top_[j]->grad.ReorderFrom(top_grads[j]);
    }
    std::vector<bool> propagate;
    for (size_t i = 0; i < bottom_.size(); ++i) {
      const bool p =
          layer_->CanBackpropTo(static_cast<int>(i)) &&
          (bottom_[i]->data.dtype() == DType::kF32 || bottom_[i]->data.dtype() == DType::kF64 ||
           IsLowPrecision(bottom_[i]->data.dtype()));
      propagate.push_back(p);
      if (p) {
        bottom_[i]->grad.Resize(bottom_[i]->data.shape(), bottom_[i]->data.dtype());
        bottom_[i]->grad.set_format(bottom_[i]->data.format());
        bottom_[i]->grad.Fill(std::nan(""));
      }
    }
    for (Param& p : layer_->params()) p.grad.Fill(std::nan(""));
    layer_->Backward(top_, propagate, bottom_);
  }

 private:
  LayerContext context_;
  std::vector<std::unique_ptr<Blob>> bottoms_, tops_;
  std::vector<Blob*> bottom_, top_;
  std::unique_ptr<Layer> layer_;
};

// A tensor of the given shape and dtype (f32 or f64) with N(0, scale^2) entries.
inline Tensor RandomTensor(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0) {
  Tensor t(shape, dtype);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = rng.Normal(0.0, scale);
    if (dtype == DType::kF32) {
      t.data<float>()[i] = static_cast<float>(v);
    } else {
      t.data<double>()[i] = v;
    }
  }
  return t;
}

// Well-separated distinct values (a shuffled ramp in [-2, 2)): no ties, and no two values
// within 4 / numel of each other, for layers with kinks (max pooling, eltwise max).
inline Tensor DistinctTensor(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t(shape, dtype);
  const int64_t n = t.numel();
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.Below(i + 1)]);
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(perm[i]) / static_cast<double>(n) * 4.0 - 2.0;
    if (dtype == DType::kF32) {
      t.data<float>()[i] = static_cast<float>(v);
    } else {
      t.data<double>()[i] = v;
    }
  }
  return t;
}

// Random values with |x| >= margin (no input sits on a kink at 0).
inline Tensor AwayFromZeroTensor(const Shape& shape, DType dtype, uint64_t seed,
                                 double margin = 0.05) {
  Tensor t = RandomTensor(shape, dtype, seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kF32) {
      float& v = t.data<float>()[i];
      v += v >= 0 ? static_cast<float>(margin) : -static_cast<float>(margin);
    } else {
      double& v = t.data<double>()[i];
      v += v >= 0 ? margin : -margin;
    }
  }
  return t;
}

inline Tensor LabelTensor(int64_t n, int64_t classes, uint64_t seed) {
  Tensor t({n}, DType::kI32);
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng.Below(classes));
  return t;
}

}  // namespace cortado::testing
