// Small helpers shared by the CPU layers: input checks that name the layer, weight
// initialization with PyTorch's conventions, and the per-layer element-type dispatch.
//
// Header-only; nothing here owns state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "cortado/dist/codec.h"
#include "cortado/dist/types.h"
#include "engine/base/random.h"
#include "engine/graph/gemm_lowp.h"
#include "engine/graph/layer.h"
#include "engine/graph/math.h"
#include "engine/tensor/tensor.h"
#include "layers/element_codes.h"

namespace cortado {

// Storage and arithmetic types of a kernel that reads and writes S and computes in Compute<S>:
// f32 and f64 compute in themselves, bf16 and f16 in f32 (widened on load, rounded to nearest
// even on store, as Tensor::ConvertFrom does, so a native kernel equals the f32 fallback).
template <typename S>
struct ComputeOf {
  using type = S;
};
template <>
struct ComputeOf<BFloat16> {
  using type = float;
};
template <>
struct ComputeOf<Half> {
  using type = float;
};
template <typename S>
using Compute = typename ComputeOf<S>::type;

inline float Widen(float v) { return v; }
inline double Widen(double v) { return v; }
inline float Widen(BFloat16 v) { return dist::BFloat16ToFloat(v.bits); }
inline float Widen(Half v) {
#if defined(__F16C__)
  return _cvtsh_ss(v.bits);
#else
  return HalfToFloat(v);
#endif
}
template <typename S>
S Narrow(Compute<S> v) {
  if constexpr (std::is_same_v<S, BFloat16>) {
    return BFloat16{dist::FloatToBFloat16(v)};
  } else if constexpr (std::is_same_v<S, Half>) {
#if defined(__F16C__)
    return Half{static_cast<uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT))};
#else
    return FloatToHalf(v);
#endif
  } else {
    return v;
  }
}

template <typename S>
constexpr bool kIsLowPrecision = !std::is_same_v<S, Compute<S>>;

template <typename S>
constexpr dist::CodecKind LowpCodec() {
  return std::is_same_v<S, BFloat16> ? dist::CodecKind::kBF16 : dist::CodecKind::kF16;
}

// dst[0, n) = Narrow(src[0, n)), through the codec's vector kernels for bf16 and f16 (the same
// rounding as Narrow); a copy for f32 and f64.
template <typename S>
void NarrowSpan(const Compute<S>* src, int64_t n, S* dst) {
  if constexpr (kIsLowPrecision<S>) {
    dist::Encode(LowpCodec<S>(), src, static_cast<size_t>(n), dst);
  } else {
    std::copy(src, src + n, dst);
  }
}

// dst[0, n) = Widen(src[0, n)).
template <typename S>
void WidenSpan(const S* src, int64_t n, Compute<S>* dst) {
  if constexpr (kIsLowPrecision<S>) {
    dist::Decode(LowpCodec<S>(), src, static_cast<size_t>(n), dst);
  } else {
    std::copy(src, src + n, dst);
  }
}

// Calls fn(E{}) with the element codes (layers/element_codes.h) of a floating dtype, for a
// layer's device path to pick its shared bodies' instantiation; fails naming the layer otherwise.
template <class Fn>
void WithElementCodes(const Layer& layer, DType dtype, const Fn& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(kernels::PlainCodes<float>{});
    case DType::kF64:
      return fn(kernels::PlainCodes<double>{});
    case DType::kBF16:
      return fn(kernels::BF16Codes{});
    case DType::kF16:
      return fn(kernels::F16Codes{});
    default:
      Fail(layer.Describe(), ": no device kernel for ", DTypeName(dtype),
           " (floating dtypes only)");
  }
}

// t's elements as E stores them, at t's address on its device (for a body's pointers; the
// caller has dispatched on t's dtype).
template <class E>
typename E::Stored* StoredData(const Tensor& t) {
  return static_cast<typename E::Stored*>(t.raw_data());
}

// C (Compute<S>) = op(A) op(B) + beta C for operands stored as S: the f32/f64 GEMM, or the
// 16-bit product that accumulates in f32 (engine/graph/gemm_lowp.h). Single-threaded.
template <typename S>
void LayerGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* a, int64_t lda,
               const S* b, int64_t ldb, Compute<S> beta, Compute<S>* c, int64_t ldc) {
  if constexpr (kIsLowPrecision<S>) {
    GemmLdLowp<S>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
  } else {
    GemmLd<S>(ta, tb, m, n, k, S(1), a, lda, b, ldb, beta, c, ldc);
  }
}

// The same on the pool, dense leading dimensions.
template <typename S>
void ParallelLayerGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* a, const S* b,
                       Compute<S> beta, Compute<S>* c) {
  if constexpr (kIsLowPrecision<S>) {
    ParallelGemmLowp<S>(ta, tb, m, n, k, a, b, beta, c);
  } else {
    ParallelGemm<S>(ta, tb, m, n, k, S(1), a, b, beta, c);
  }
}

// The low-precision copy of a master (f32) parameter that a 16-bit kernel reads: converted
// from the master on every call, so it always matches the weights the solver last wrote.
template <typename S>
const S* LowPrecisionCopy(const Tensor& master, Tensor& copy) {
  if (copy.dtype() != DTypeOf<S>::value || copy.shape() != master.shape()) {
    copy.Resize(master.shape(), DTypeOf<S>::value);
  }
  copy.ConvertFrom(master);
  return copy.data<S>();
}

// Throws unless t is a compute type: f32 or f64, or bf16 or f16 (mixed precision).
inline void CheckFloatInput(const Layer& layer, const Tensor& t, const char* what) {
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF64 && !IsLowPrecision(t.dtype())) {
    Fail(layer.Describe(), ": ", what, " must be f32, f64, bf16 or f16, got ", t.ToString());
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
//   kaiming_normal:  torchvision ResNet's and VGG's convolutions, kaiming_normal_(mode='fan_out',
//                    nonlinearity='relu'): N(0, 2 / fan_out).
//   normal:          N(0, weight_std^2), weight_std 0.01 by default (torchvision VGG's Linear).
//   xavier_uniform:  U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) (xavier_uniform_, gain 1):
//                    torchvision SSD's extra layers, fc6/fc7 and heads.
// The bias, when present, takes PyTorch's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)), or 0 with
// `bias_init: zero` (torchvision VGG re-initializes its biases to 0; ResNet leaves them).
enum class WeightInit { kKaimingUniform, kKaimingNormal, kNormal, kXavierUniform };

struct InitSpec {
  WeightInit weight = WeightInit::kKaimingUniform;
  double weight_std = 0.01;  // kNormal only
  bool zero_bias = false;
};

// Reads weight_init, weight_std and bias_init from the layer's settings (errors name the layer).
inline InitSpec ParseInit(const Layer& layer, const Settings& settings) {
  InitSpec spec;
  const std::string name = settings.GetString("weight_init", "kaiming_uniform");
  if (name == "kaiming_uniform") {
    spec.weight = WeightInit::kKaimingUniform;
  } else if (name == "kaiming_normal") {
    spec.weight = WeightInit::kKaimingNormal;
  } else if (name == "normal") {
    spec.weight = WeightInit::kNormal;
  } else if (name == "xavier_uniform") {
    spec.weight = WeightInit::kXavierUniform;
  } else {
    Fail(layer.Describe(),
         ": key 'weight_init' expects kaiming_uniform, kaiming_normal, normal or xavier_uniform, "
         "got '",
         name, "'");
  }
  if (settings.Has("weight_std")) {
    if (spec.weight != WeightInit::kNormal) {
      Fail(layer.Describe(), ": key 'weight_std' applies to weight_init: normal only");
    }
    spec.weight_std = settings.GetFloat("weight_std", spec.weight_std);
    if (!(spec.weight_std > 0)) {
      Fail(layer.Describe(), ": key 'weight_std' must be positive, got ", spec.weight_std);
    }
  }
  const std::string bias = settings.GetString("bias_init", "default");
  if (bias != "default" && bias != "zero") {
    Fail(layer.Describe(), ": key 'bias_init' expects default or zero, got '", bias, "'");
  }
  spec.zero_bias = bias == "zero";
  return spec;
}

// Fills weight (and bias, if defined) from rng. fan_in/fan_out as PyTorch computes them.
inline void InitWeights(const InitSpec& init, int64_t fan_in, int64_t fan_out, Rng& rng,
                        Tensor& weight, Tensor* bias) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  const double stddev = init.weight == WeightInit::kNormal ? init.weight_std
                        : fan_out > 0 ? std::sqrt(2.0 / static_cast<double>(fan_out))
                                      : 0.0;
  const double xavier =
      fan_in + fan_out > 0 ? std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)) : 0.0;
  auto fill = [&](Tensor& t, bool is_weight) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = 0.0;
      if (is_weight && init.weight == WeightInit::kXavierUniform) {
        v = rng.Uniform(-xavier, xavier);
      } else if (is_weight && init.weight != WeightInit::kKaimingUniform) {
        v = rng.Normal(0.0, stddev);
      } else if (is_weight || !init.zero_bias) {
        v = rng.Uniform(-bound, bound);
      }
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
