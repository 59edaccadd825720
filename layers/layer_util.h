// Small helpers shared by the CPU layers: input checks that name the layer, weight
// initialization with PyTorch's conventions, and the per-layer element-type dispatch.
//
// Header-only; nothing here owns state.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/layer.h"
#include "engine/random.h"
#include "engine/tensor.h"

namespace cortado {

// Throws unless t is f32 or f64 (the CPU compute types).
inline void CheckFloatInput(const Layer& layer, const Tensor& t, const char* what) {
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF64) {
    Fail(layer.Describe(), ": ", what, " must be f32 or f64, got ", t.ToString());
  }
}

// Throws unless all inputs share bottom[0]'s dtype.
inline void CheckSameDType(const Layer& layer, const std::vector<Blob*>& bottom) {
  for (size_t i = 1; i < bottom.size(); ++i) {
    if (bottom[i]->data.dtype() != bottom[0]->data.dtype()) {
      Fail(layer.Describe(), ": input ", i, " ('", bottom[i]->name, "') is ",
           bottom[i]->data.ToString(), " but input 0 ('", bottom[0]->name, "') is ",
           bottom[0]->data.ToString(), "; all inputs must have the same dtype");
    }
  }
}

// Throws unless params were created in the dtype the layer now computes in.
inline void CheckParamDType(const Layer& layer, DType dtype) {
  for (const Param& p : layer.params()) {
    if (p.value.dtype() != dtype) {
      Fail(layer.Describe(), ": parameter '", p.name, "' is ", DTypeName(p.value.dtype()),
           " but the input is ", DTypeName(dtype), " (the input dtype changed after SetUp)");
    }
  }
}

// Weight initializers, by the name used in the `weight_init` setting.
//   kaiming_uniform: PyTorch's default for nn.Conv2d / nn.Linear (kaiming_uniform_ with
//                    a = sqrt(5)), which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
//   kaiming_normal:  torchvision ResNet's kaiming_normal_(mode='fan_out',
//                    nonlinearity='relu'): N(0, 2 / fan_out).
// The bias, when present, always takes PyTorch's default U(-1/sqrt(fan_in), 1/sqrt(fan_in))
// (torchvision re-initializes only the weight).
enum class WeightInit { kKaimingUniform, kKaimingNormal };

inline WeightInit ParseWeightInit(const Layer& layer, const std::string& name) {
  if (name == "kaiming_uniform") return WeightInit::kKaimingUniform;
  if (name == "kaiming_normal") return WeightInit::kKaimingNormal;
  Fail(layer.Describe(), ": key 'weight_init' expects kaiming_uniform or kaiming_normal, got '",
       name, "'");
}

// Fills weight (and bias, if defined) from rng. fan_in/fan_out as PyTorch computes them.
inline void InitWeights(WeightInit init, int64_t fan_in, int64_t fan_out, Rng& rng, Tensor& weight,
                        Tensor* bias) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  const double stddev = fan_out > 0 ? std::sqrt(2.0 / static_cast<double>(fan_out)) : 0.0;
  auto fill = [&](Tensor& t, bool is_weight) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = (is_weight && init == WeightInit::kKaimingNormal) ? rng.Normal(0.0, stddev)
                                                                   : rng.Uniform(-bound, bound);
      if (t.dtype() == DType::kF32) {
        t.data<float>()[i] = static_cast<float>(v);
      } else {
        t.data<double>()[i] = v;
      }
    }
  };
  fill(weight, true);
  if (bias != nullptr) fill(*bias, false);
}

// Product of shape[begin, end).
inline int64_t ShapeCount(const Shape& shape, int begin, int end) {
  int64_t n = 1;
  for (int i = begin; i < end; ++i) n *= shape[i];
  return n;
}

// Resolves a possibly negative axis against ndim; throws naming the layer when out of range.
inline int CanonicalAxis(const Layer& layer, int64_t axis, int ndim) {
  int64_t a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim) {
    Fail(layer.Describe(), ": axis ", axis, " is out of range for a ", ndim, "-d input");
  }
  return static_cast<int>(a);
}

}  // namespace cortado
