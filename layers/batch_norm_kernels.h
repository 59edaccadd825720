// Batch norm's kernel bodies, shared by the host and the device (engine/tensor/indexed_launch.h):
// the CPU kernels (layers/batch_norm.cpp) reduce through the same helpers, so the statistics a
// device computes in f64 are the CPU's bit for bit. The order of every sum is fixed here, never
// left to a vectorizer:
//  - NCHW: per plane, kBnLanes interleaved partial sums added in a fixed tree (BnLaneSums); per
//    channel, the planes' sums added in batch order.
//  - NHWC: per block of kBnRowBlock rows, rows added four at a time ((r0 + r1) + (r2 + r3)) from
//    0; per channel, the blocks' sums added in block order (the CPU's SumRows and GradSumRows,
//    which vectorize across channels, add each channel in this order).
// A device runs the reductions in two launches: one index per (plane or block, channel) writing
// its partial sums, then one per channel adding them. The per-channel bodies compute the
// statistics, running averages and gradient coefficients with the CPU's expressions; the
// element-wise bodies normalize (with the fused ReLU) and form the input gradient.
// Rounding alike also needs no fused multiply-adds, which a compiler forms differently in a
// vectorized loop and in a scalar body: layers/CMakeLists.txt builds batch_norm.cpp with
// -ffp-contract=off and cuda/batch_norm.cu with --fmad=false.
// Bodies hold raw pointers and scalars only. The element bodies read and write x, dy, y and dx
// through element codes E (layers/element_codes.h): f32 and f64 as they are, bf16 and f16 widened
// to f32 on load and rounded once on store, as the CPU's 16-bit kernels do (Widen, Narrow); the
// per-channel values (parameters, running statistics, coefficients) are in T = E::Acc, the
// master dtype.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE
#include "layers/element_codes.h"

namespace cortado::kernels {

inline constexpr int64_t kBnLanes = 8;       // partial sums per NCHW plane
inline constexpr int64_t kBnRowBlock = 256;  // rows per NHWC block
inline constexpr int64_t kBnRowsPerVisit = 4;

// The normalized value; the fused ReLU's backward recomputes it with this expression, so its
// mask is the forward's.
template <typename T>
CORTADO_HOST_DEVICE T BnAffine(T a, T x, T m, T b) {
  return a * (x - m) + b;
}

// Forward's terms of element j: x and x^2 in double (`load(j)` widens x[j] to the compute type).
template <class Load>
struct BnStatTerms {
  Load load;
  CORTADO_HOST_DEVICE void operator()(int64_t j, double& t1, double& t2) const {
    const double v = load(j);
    t1 = v;
    t2 = v * v;
  }
};

// g where keep, else +0 (the unfused ReLU's select, a NaN g included), as a bit mask: a CPU's
// compiler turns `keep ? g : 0` inside the reductions into a branch and stops vectorizing.
template <typename T>
CORTADO_HOST_DEVICE T BnMasked(bool keep, T g) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  U u;
  std::memcpy(&u, &g, sizeof(T));
  u &= U(0) - static_cast<U>(keep);
  std::memcpy(&g, &u, sizeof(T));
  return g;
}

// Backward's terms: g and g (x - m), g = dy masked where the fused ReLU's output is not positive
// (`positive(z)`: z as stored, positive; +0 where masked, as the unfused ReLU's select).
template <typename T, class Positive>
CORTADO_HOST_DEVICE void BnGradTerms(T xv, T gv, T a, T m, T b, bool relu, const Positive& positive,
                                     double& t1, double& t2) {
  if (relu) gv = BnMasked(positive(BnAffine(a, xv, m, b)), gv);
  const double g = gv;
  t1 = g;
  t2 = g * static_cast<double>(xv - m);
}

// Sums of terms(j) over j in [0, s): lane k adds the j with j % kBnLanes == k in order, and the
// lanes are added in a fixed tree (a CPU vectorizes the lanes; a device runs them as one thread).
template <class Terms>
CORTADO_HOST_DEVICE void BnLaneSums(int64_t s, const Terms& terms, double& out1, double& out2) {
  double l1[kBnLanes] = {}, l2[kBnLanes] = {};
  int64_t j = 0;
  for (; j + kBnLanes <= s; j += kBnLanes) {
    for (int64_t k = 0; k < kBnLanes; ++k) {
      double t1, t2;
      terms(j + k, t1, t2);
      l1[k] += t1;
      l2[k] += t2;
    }
  }
  for (int64_t k = 0; j + k < s; ++k) {
    double t1, t2;
    terms(j + k, t1, t2);
    l1[k] += t1;
    l2[k] += t2;
  }
  out1 = ((l1[0] + l1[1]) + (l1[2] + l1[3])) + ((l1[4] + l1[5]) + (l1[6] + l1[7]));
  out2 = ((l2[0] + l2[1]) + (l2[2] + l2[3])) + ((l2[4] + l2[5]) + (l2[6] + l2[7]));
}

template <class E>
struct BnPtrLoad {
  const typename E::Stored* p;
  CORTADO_HOST_DEVICE typename E::Acc operator()(int64_t j) const { return E::Load(p[j]); }
};
// Whether the fused ReLU's stored output of z is positive (the unfused ReLU's mask): z rounded
// to the stored type first, so 16-bit values that round to 0 are masked as the stored 0 is (the
// CPU's Positive<S>).
template <class E>
struct BnPositive {
  CORTADO_HOST_DEVICE bool operator()(typename E::Acc z) const {
    return E::Load(E::Store(z)) > typename E::Acc(0);
  }
};

// Backward's terms of element j of one NCHW plane (x, dy) with its channel's coefficients.
template <class E>
struct BnPlaneGradTerms {
  using T = typename E::Acc;
  const typename E::Stored* x;
  const typename E::Stored* dy;
  T a, m, b;
  bool relu;
  CORTADO_HOST_DEVICE void operator()(int64_t j, double& t1, double& t2) const {
    BnGradTerms<T>(E::Load(x[j]), E::Load(dy[j]), a, m, b, relu, BnPositive<E>{}, t1, t2);
  }
};

// Shapes and the pass a reduction is for: x (and dy, backward) of N x C x S elements, NCHW or
// NHWC; affine = [a | m | b] (3 C, the forward's gamma invstd, mean and beta in E::Acc).
template <class E>
struct BnReduceArgs {
  const typename E::Stored* x;
  const typename E::Stored* dy;   // null: forward's sums of x and x^2
  const typename E::Acc* affine;  // backward: the mask's and the centring's coefficients
  int64_t n, c, s;
  bool relu;
};

// First launch of a reduction, NCHW: index p = i C + c, plane (i, c)'s sums into
// part[i 2C + c] and part[i 2C + C + c].
template <class E>
struct BnPlaneSums {
  BnReduceArgs<E> r;
  double* part;
  CORTADO_HOST_DEVICE void operator()(int64_t p) const {
    const int64_t i = p / r.c, c = p % r.c;
    const typename E::Stored* xp = r.x + p * r.s;
    double s1, s2;
    if (r.dy == nullptr) {
      BnLaneSums(r.s, BnStatTerms<BnPtrLoad<E>>{{xp}}, s1, s2);
    } else {
      const typename E::Stored* gp = r.dy + p * r.s;
      BnLaneSums(r.s,
                 BnPlaneGradTerms<E>{xp, gp, r.affine[c], r.affine[r.c + c], r.affine[2 * r.c + c],
                                     r.relu},
                 s1, s2);
    }
    part[i * 2 * r.c + c] = s1;
    part[i * 2 * r.c + r.c + c] = s2;
  }
};

// First launch, NHWC: index k C + c, the sums of channel c over rows block k into
// part[k 2C + c] and part[k 2C + C + c] (the CPU's partials_ layout and order).
template <class E>
struct BnRowBlockSums {
  BnReduceArgs<E> r;
  double* part;
  CORTADO_HOST_DEVICE void Terms(int64_t row, int64_t c, double& t1, double& t2) const {
    const typename E::Stored* xr = r.x + row * r.c;
    if (r.dy == nullptr) {
      BnStatTerms<BnPtrLoad<E>>{{xr}}(c, t1, t2);
    } else {
      BnGradTerms<typename E::Acc>(E::Load(xr[c]), E::Load(r.dy[row * r.c + c]), r.affine[c],
                                   r.affine[r.c + c], r.affine[2 * r.c + c], r.relu,
                                   BnPositive<E>{}, t1, t2);
    }
  }
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t k = i / r.c, c = i % r.c, rows = r.n * r.s;
    const int64_t r0 = k * kBnRowBlock, r1 = r0 + kBnRowBlock < rows ? r0 + kBnRowBlock : rows;
    double s1 = 0, s2 = 0;
    int64_t row = r0;
    for (; row + kBnRowsPerVisit <= r1; row += kBnRowsPerVisit) {
      double a[kBnRowsPerVisit], b[kBnRowsPerVisit];
      for (int64_t v = 0; v < kBnRowsPerVisit; ++v) Terms(row + v, c, a[v], b[v]);
      s1 += (a[0] + a[1]) + (a[2] + a[3]);
      s2 += (b[0] + b[1]) + (b[2] + b[3]);
    }
    for (; row < r1; ++row) {
      double a, b;
      Terms(row, c, a, b);
      s1 += a;
      s2 += b;
    }
    part[k * 2 * r.c + c] = s1;
    part[k * 2 * r.c + r.c + c] = s2;
  }
};

// Second launch: index c, sums[c] and sums[C + c] = the `parts` partial sums of channel c added
// in order from 0.
struct BnCombineSums {
  const double* part;
  double* sums;
  int64_t parts, c;
  CORTADO_HOST_DEVICE void operator()(int64_t ch) const {
    double s1 = 0, s2 = 0;
    for (int64_t k = 0; k < parts; ++k) {
      s1 += part[k * 2 * c + ch];
      s2 += part[k * 2 * c + c + ch];
    }
    sums[ch] = s1;
    sums[c + ch] = s2;
  }
};

// Index c: the statistics forward normalizes with, stats = [mean | invstd] (f64), and
// affine = [gamma invstd | mean | beta] in T. Batch statistics (`batch`) from sums = [sum x |
// sum x^2] over `count` values, updating the running averages; else the running statistics.
// gamma and beta null: not affine.
template <typename T>
struct BnStatistics {
  const double* sums;
  const T* gamma;
  const T* beta;
  T* running_mean;
  T* running_var;
  double* stats;
  T* affine;
  int64_t c;
  double count, eps, momentum;
  bool batch;
  CORTADO_HOST_DEVICE void operator()(int64_t ch) const {
    double mean, invstd;
    if (batch) {
      mean = sums[ch] / count;
      const double v = sums[c + ch] / count - mean * mean;
      const double var = 0.0 < v ? v : 0.0;  // std::max(0.0, v), NaN to 0 as there
      invstd = 1.0 / sqrt(var + eps);
      const double mo = momentum;
      running_mean[ch] = static_cast<T>((1 - mo) * running_mean[ch] + mo * mean);
      running_var[ch] = static_cast<T>((1 - mo) * running_var[ch] + mo * var * count / (count - 1));
    } else {
      mean = running_mean[ch];
      invstd = 1.0 / sqrt(static_cast<double>(running_var[ch]) + eps);
    }
    stats[ch] = mean;
    stats[c + ch] = invstd;
    const double g = gamma != nullptr ? static_cast<double>(gamma[ch]) : 1.0;
    affine[ch] = static_cast<T>(g * invstd);
    affine[c + ch] = static_cast<T>(mean);
    affine[2 * c + ch] = beta != nullptr ? beta[ch] : T(0);
  }
};

// Element e of y = [relu](a (x - m) + b), NCHW or NHWC, computed in E::Acc and stored once.
template <class E>
struct BnNormalize {
  using T = typename E::Acc;
  const typename E::Stored* x;
  const T* affine;
  typename E::Stored* y;
  int64_t c, s;
  bool nhwc, relu;
  CORTADO_HOST_DEVICE void operator()(int64_t e) const {
    const int64_t ch = nhwc ? e % c : (e / s) % c;
    const T v = BnAffine(affine[ch], E::Load(x[e]), affine[c + ch], affine[2 * c + ch]);
    y[e] = E::Store(relu ? (v > T(0) ? v : T(0)) : v);
  }
};

// Index c: the parameter gradients from the local sums = [sum g | sum g (x - mean)]:
// dgamma = sum g (x - mean) invstd, dbeta = sum g.
template <typename T>
struct BnParamGrads {
  const double* sums;
  const double* stats;
  T* dgamma;
  T* dbeta;
  int64_t c;
  CORTADO_HOST_DEVICE void operator()(int64_t ch) const {
    dgamma[ch] = static_cast<T>(sums[c + ch] * stats[c + ch]);
    dbeta[ch] = static_cast<T>(sums[ch]);
  }
};

// Index c: coef = [A | B | C] of dx = A g + B (x - mean) + C, from the (group's) sums over
// `count` values with batch statistics, else A = gamma invstd alone.
template <typename T>
struct BnInputCoefficients {
  const double* sums;
  const double* stats;
  const T* gamma;
  T* coef;
  int64_t c;
  double count;
  bool batch;
  CORTADO_HOST_DEVICE void operator()(int64_t ch) const {
    const double g = gamma != nullptr ? static_cast<double>(gamma[ch]) : 1.0;
    const double invstd = stats[c + ch];
    const double a = g * invstd;
    double b = 0, cc = 0;
    if (batch) {
      b = -a * invstd * invstd * sums[c + ch] / count;
      cc = -a * sums[ch] / count;
    }
    coef[ch] = static_cast<T>(a);
    coef[c + ch] = static_cast<T>(b);
    coef[2 * c + ch] = static_cast<T>(cc);
  }
};

// Element e of dx = A g + B (x - m) + C, g = dy masked by the fused ReLU (on its stored output),
// computed in E::Acc and stored once.
template <class E>
struct BnInputGrad {
  using T = typename E::Acc;
  const typename E::Stored* x;
  const typename E::Stored* dy;
  const T* affine;
  const T* coef;
  typename E::Stored* dx;
  int64_t c, s;
  bool nhwc, relu;
  CORTADO_HOST_DEVICE void operator()(int64_t e) const {
    const int64_t ch = nhwc ? e % c : (e / s) % c;
    const T xv = E::Load(x[e]), m = affine[c + ch];
    T g = E::Load(dy[e]);
    if (relu) g = BnMasked(BnPositive<E>{}(BnAffine(affine[ch], xv, m, affine[2 * c + ch])), g);
    dx[e] = E::Store(coef[ch] * g + coef[c + ch] * (xv - m) + coef[2 * c + ch]);
  }
};

}  // namespace cortado::kernels
