// Kernel bodies shared by the host and the device: one function per element (or per row),
// CORTADO_HOST_DEVICE, with no CUDA type in it. The CPU's own loops, the test device (which runs
// them on the host inside a kernel scope, engine/tensor/test_device.h) and the CUDA kernels
// (engine/cuda/device_kernels.cu: a grid-stride loop around the same call) all compute through
// these, so the three agree where their order of operations does (element-wise bodies: always).
// The typed routes that launch them per device and dtype are engine/tensor/device_kernels.h.
#pragma once

#include <cstdint>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE

namespace cortado::kernels {

// ReLU with slope (leaky when slope != 0); slope 0 keeps ReLU(-inf) = 0 exact.
template <typename T>
CORTADO_HOST_DEVICE void ReluForwardAt(const T* x, T* y, int64_t i, T slope) {
  const T v = x[i];
  y[i] = v > T(0) ? v : (slope == T(0) ? T(0) : slope * v);
}

// The gradient where the mask (x, or y when the slope is not negative) is positive.
template <typename T>
CORTADO_HOST_DEVICE void ReluBackwardAt(const T* mask, const T* dy, T* dx, int64_t i, T slope) {
  const T g = dy[i];
  dx[i] = mask[i] > T(0) ? g : (slope == T(0) ? T(0) : slope * g);
}

// y[i] += alpha * x[i] (eltwise sum's inputs after the first, and their gradients' scaling).
template <typename T>
CORTADO_HOST_DEVICE void AxpyAt(const T* x, T* y, int64_t i, T alpha) {
  y[i] += alpha * x[i];
}

// y[i] = alpha * x[i].
template <typename T>
CORTADO_HOST_DEVICE void ScaleAt(const T* x, T* y, int64_t i, T alpha) {
  y[i] = alpha * x[i];
}

// The fused SGD step of one element (momentum mu, weight decay wd, optional Nesterov; the
// gradient times `scale`, which unscales a scaled loss): SgdSolver::Step's arithmetic.
template <typename T>
CORTADO_HOST_DEVICE void SgdStepAt(T* w, const T* g, T* v, int64_t i, T lr, T wd, T mu,
                                   bool nesterov, T scale) {
  const T d = g[i] * scale + wd * w[i];
  const T vi = mu * v[i] + d;
  v[i] = vi;
  w[i] -= lr * (nesterov ? d + mu * vi : vi);
}

// x - x is 0 for finite x and NaN for inf and NaN.
template <typename T>
CORTADO_HOST_DEVICE bool FiniteAt(const T* x, int64_t i) {
  return x[i] - x[i] == T(0);
}

}  // namespace cortado::kernels

namespace cortado::kernels {

// The element-wise operations the typed routes launch (engine/tensor/device_kernels.h), and
// their operands: a, b, c are the tensors' device pointers in the order each op names them.
enum class ElementOp : uint8_t {
  kReluForward,   // a: x, b: y; s0: slope
  kReluBackward,  // a: mask, b: dy, c: dx; s0: slope
  kAxpy,          // a: x, b: y; s0: alpha
  kScale,         // a: x, b: y; s0: alpha
  kSgdStep,       // a: w, b: g, c: v; s0: lr, s1: weight decay, s2: momentum, s3: grad scale;
                  // flag: Nesterov
  kMarkNonFinite  // a: x, flag32: an i32 set to 1 where an element is inf or NaN
};

struct ElementArgs {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  int32_t* flag32 = nullptr;
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  bool flag = false;
};

// Element i of `op` in T: the body every route runs (the host loop, the test device, CUDA).
template <typename T>
CORTADO_HOST_DEVICE void ElementAt(ElementOp op, const ElementArgs& args, int64_t i) {
  T* a = static_cast<T*>(args.a);
  T* b = static_cast<T*>(args.b);
  T* c = static_cast<T*>(args.c);
  switch (op) {
    case ElementOp::kReluForward:
      return ReluForwardAt<T>(a, b, i, static_cast<T>(args.s0));
    case ElementOp::kReluBackward:
      return ReluBackwardAt<T>(a, b, c, i, static_cast<T>(args.s0));
    case ElementOp::kAxpy:
      return AxpyAt<T>(a, b, i, static_cast<T>(args.s0));
    case ElementOp::kScale:
      return ScaleAt<T>(a, b, i, static_cast<T>(args.s0));
    case ElementOp::kSgdStep:
      return SgdStepAt<T>(a, b, c, i, static_cast<T>(args.s0), static_cast<T>(args.s1),
                          static_cast<T>(args.s2), args.flag, static_cast<T>(args.s3));
    case ElementOp::kMarkNonFinite:
      // Every writer writes the same value, so racing threads agree.
      if (!FiniteAt<T>(a, i)) *args.flag32 = 1;
      return;
  }
}

}  // namespace cortado::kernels
