// Eltwise's and ReLU's shared kernel bodies (RunIndexed, engine/tensor/indexed_launch.h): one index
// per element, every dtype through its element codes (layers/element_codes.h), so a 16-bit body
// widens its inputs, computes in f32 and rounds once, as the CPU's blocks do. The order of the
// operations is the CPU's (EltwiseLayer::ForwardChunk, BackwardChunk; ReluLayer's kernels): sums
// accumulate input by input, a product multiplies in input order, max keeps the first of ties.
#pragma once

#include <cstdint>

#include "layers/element_codes.h"

namespace cortado::kernels {

// The inputs one Eltwise body reads (a layer with more runs its CPU kernel on the test device).
inline constexpr int kEltwiseMaxInputs = 8;

enum class EltwiseOp : int32_t { kSum = 0, kProd = 1, kMax = 2 };

template <class E>
struct EltwiseForward {
  using S = typename E::Stored;
  using A = typename E::Acc;
  const S* x[kEltwiseMaxInputs] = {};
  A coeffs[kEltwiseMaxInputs] = {};
  int count = 0;
  EltwiseOp op = EltwiseOp::kSum;
  bool unit = true;  // every coefficient 1: the CPU adds without multiplying
  bool relu = false;
  S* y = nullptr;
  int32_t* arg = nullptr;  // max: which input won

  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    A v = A(0);
    switch (op) {
      case EltwiseOp::kSum:
        v = unit ? E::Load(x[0][i]) + E::Load(x[1][i])
                 : coeffs[0] * E::Load(x[0][i]) + coeffs[1] * E::Load(x[1][i]);
        for (int j = 2; j < count; ++j) v += coeffs[j] * E::Load(x[j][i]);
        if (relu) v = v > A(0) ? v : A(0);
        break;
      case EltwiseOp::kProd:
        v = E::Load(x[0][i]) * E::Load(x[1][i]);
        for (int j = 2; j < count; ++j) v *= E::Load(x[j][i]);
        break;
      case EltwiseOp::kMax: {
        v = E::Load(x[0][i]);
        int32_t which = 0;
        for (int j = 1; j < count; ++j) {
          const A c = E::Load(x[j][i]);
          if (c > v) {
            v = c;
            which = j;
          }
        }
        arg[i] = which;
        break;
      }
    }
    y[i] = E::Store(v);
  }
};

// The gradient of input `me`.
template <class E>
struct EltwiseBackward {
  using S = typename E::Stored;
  using A = typename E::Acc;
  const S* dy = nullptr;
  const S* y = nullptr;                // sum with the fused ReLU: its output (the mask)
  const S* x[kEltwiseMaxInputs] = {};  // product: the inputs
  const int32_t* arg = nullptr;        // max: the winners
  int count = 0;
  int me = 0;
  EltwiseOp op = EltwiseOp::kSum;
  A coeff = A(1);
  bool relu = false;
  S* dx = nullptr;

  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    A g = E::Load(dy[i]);
    switch (op) {
      case EltwiseOp::kSum:
        if (relu) {
          g = E::Load(y[i]) > A(0) ? g : A(0);
          if (coeff != A(1)) g = coeff * g;
        } else if (coeff != A(1)) {
          g = coeff * g;
        }
        break;
      case EltwiseOp::kProd:
        for (int m = 0; m < count; ++m) {
          if (m != me) g *= E::Load(x[m][i]);
        }
        break;
      case EltwiseOp::kMax:
        g = arg[i] == me ? g : A(0);
        break;
    }
    dx[i] = E::Store(g);
  }
};

// ReLU with a slope on any dtype: y = x > 0 ? x : slope * x (slope 0 gives 0, so ReLU(-inf) and
// NaN are 0 as on the CPU); backward passes dy where the mask is positive.
template <class E>
struct ReluForwardCodes {
  using S = typename E::Stored;
  using A = typename E::Acc;
  const S* x = nullptr;
  S* y = nullptr;
  A slope = A(0);
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const A v = E::Load(x[i]);
    y[i] = E::Store(v > A(0) ? v : (slope == A(0) ? A(0) : slope * v));
  }
};

template <class E>
struct ReluBackwardCodes {
  using S = typename E::Stored;
  using A = typename E::Acc;
  const S* mask = nullptr;
  const S* dy = nullptr;
  S* dx = nullptr;
  A slope = A(0);
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const A g = E::Load(dy[i]);
    dx[i] = E::Store(E::Load(mask[i]) > A(0) ? g : (slope == A(0) ? A(0) : slope * g));
  }
};

}  // namespace cortado::kernels
