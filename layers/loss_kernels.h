// The shared kernel bodies of SoftmaxWithLoss and Accuracy (engine/tensor/indexed_launch.h):
// CORTADO_HOST_DEVICE functors of raw pointers and scalars, launched with RunIndexed on the test
// device and on a GPU (instantiated for CUDA in layers/cuda/loss.cu). Each is the CPU kernel's
// arithmetic in the CPU's order (layers/softmax_loss.cpp, layers/accuracy.cpp): per row, then one
// index that sums the rows in row order, so on the host (the test device) the results are the
// CPU's bit for bit. On a GPU exp and log are CUDA's (within their few ulps of the host's).
//
// The CPU throws on a label outside [0, C); a device kernel cannot, and the host may not read
// the labels, so there such a row makes the loss (or the accuracy) NaN, and no gradient element
// is subtracted for it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE

namespace cortado::kernels {

CORTADO_HOST_DEVICE float ExpOf(float v) {
#ifdef __CUDA_ARCH__
  return ::expf(v);
#else
  return std::exp(v);
#endif
}
CORTADO_HOST_DEVICE double ExpOf(double v) {
#ifdef __CUDA_ARCH__
  return ::exp(v);
#else
  return std::exp(v);
#endif
}
CORTADO_HOST_DEVICE double LogOf(double v) {
#ifdef __CUDA_ARCH__
  return ::log(v);
#else
  return std::log(v);
#endif
}
CORTADO_HOST_DEVICE double QuietNaN() {
  const uint64_t bits = 0x7ff8000000000000ull;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// Row i of the forward: prob (N, C) = softmax(x), row_loss[i] = the smoothed cross-entropy
// (1 - eps) (-log p[label]) + eps / C * sum_c (-log p_c), in f64 from the max-subtracted logits.
template <typename T>
struct SoftmaxLossRows {
  const T* x;
  const int32_t* label;
  T* prob;
  double* row_loss;
  int64_t classes;
  double eps;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const T* xi = x + i * classes;
    T* pi = prob + i * classes;
    T mx = xi[0];  // the first maximum, as std::max_element finds it
    for (int64_t c = 1; c < classes; ++c) {
      if (mx < xi[c]) mx = xi[c];
    }
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) {
      const T e = ExpOf(static_cast<T>(xi[c] - mx));
      pi[c] = e;
      sum += e;
    }
    const double log_sum = LogOf(sum);
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t c = 0; c < classes; ++c) pi[c] *= inv;
    const int32_t y = label[i];
    if (y < 0 || y >= classes) {
      row_loss[i] = QuietNaN();
      return;
    }
    // -log p_c = log_sum - (x_c - max)
    double l = (log_sum - (static_cast<double>(xi[y]) - mx)) * (1.0 - eps);
    if (eps > 0) {
      double all = 0;
      for (int64_t c = 0; c < classes; ++c) all += log_sum - (static_cast<double>(xi[c]) - mx);
      l += eps / static_cast<double>(classes) * all;
    }
    row_loss[i] = l;
  }
};

// One index: loss[0] = the mean of the rows' losses, summed in row order (0 for no rows).
template <typename T>
struct MeanOfRows {
  const double* row_loss;
  T* loss;
  int64_t rows;
  CORTADO_HOST_DEVICE void operator()(int64_t) const {
    double total = 0;
    for (int64_t i = 0; i < rows; ++i) total += row_loss[i];
    loss[0] = static_cast<T>(rows > 0 ? total / static_cast<double>(rows) : 0.0);
  }
};

// Row i of dx (N, C): (dloss / N) (p - target), with the target's smoothing, computed as the
// CPU does: s p - off for every class, then - hit at the label (per row, in the CPU's statements,
// so the host compiler contracts them as it does the CPU's); dloss is read here (it stays on the
// device).
template <typename T>
struct SoftmaxLossGradRows {
  const T* prob;
  const int32_t* label;
  const T* dloss;
  T* dx;
  int64_t rows, classes;
  double eps;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const double scale = static_cast<double>(dloss[0]) / rows;
    const T s = static_cast<T>(scale);
    const T off = static_cast<T>(scale * eps / static_cast<double>(classes));
    const T hit = static_cast<T>(scale * (1.0 - eps));
    const T* pi = prob + i * classes;
    T* di = dx + i * classes;
    for (int64_t c = 0; c < classes; ++c) di[c] = s * pi[c] - off;
    const int32_t y = label[i];
    if (y >= 0 && y < classes) di[y] -= hit;
  }
};

// Row i of Accuracy: hit[i] = 1 when fewer than top_k other classes score >= the label's score
// (Caffe's rule, pessimistic on ties; a NaN label score is no hit), -1 for a label outside [0, C).
template <typename T>
struct AccuracyRows {
  const T* x;
  const int32_t* label;
  int32_t* hit;
  int64_t classes, top_k;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const int32_t y = label[i];
    if (y < 0 || y >= classes) {
      hit[i] = -1;
      return;
    }
    const T* xi = x + i * classes;
    const T target = xi[y];
    if (target != target) {  // NaN
      hit[i] = 0;
      return;
    }
    int64_t better = 0;  // other classes scoring >= the label's score
    for (int64_t c = 0; c < classes; ++c) better += (c != y && xi[c] >= target) ? 1 : 0;
    hit[i] = better < top_k ? 1 : 0;
  }
};

// One index: accuracy[0] = hits / N (0 for no rows; NaN when a row's label was out of range).
template <typename T>
struct AccuracyOfRows {
  const int32_t* hit;
  T* accuracy;
  int64_t rows;
  CORTADO_HOST_DEVICE void operator()(int64_t) const {
    int64_t correct = 0;
    bool bad = false;
    for (int64_t i = 0; i < rows; ++i) {
      bad = bad || hit[i] < 0;
      correct += hit[i] > 0 ? 1 : 0;
    }
    accuracy[0] = static_cast<T>(
        bad ? QuietNaN()
            : (rows > 0 ? static_cast<double>(correct) / static_cast<double>(rows) : 0.0));
  }
};

}  // namespace cortado::kernels
