#include "layers/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "engine/base/thread_pool.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/batch_norm_kernels.h"
#include "layers/device_staging.h"
#include "layers/layer_util.h"

namespace cortado {

void BatchNormLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  eps_ = settings().GetFloat("eps", 1e-5);
  momentum_ = settings().GetFloat("momentum", 0.1);
  affine_ = settings().GetBool("affine", true);
  const bool zero_init = settings().GetBool("zero_init", false);
  has_sync_setting_ = settings().Has("sync");
  sync_setting_ = settings().GetBool("sync", false);
  has_global_setting_ = settings().Has("use_global_stats");
  use_global_stats_ = settings().GetBool("use_global_stats", false);
  relu_ = settings().GetBool("relu", false);
  if (!(eps_ > 0)) Fail(Describe(), ": key 'eps' must be positive, got ", eps_);
  if (!(momentum_ >= 0 && momentum_ <= 1)) {
    Fail(Describe(), ": key 'momentum' must be in [0, 1], got ", momentum_);
  }
  if (zero_init && !affine_) Fail(Describe(), ": zero_init needs affine: true");
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  if (x.ndim() < 2) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be (N, C, ...), got ", x.ToString());
  }
  channels_ = x.dim(1);
  if (affine_) {
    AddParam("weight", {channels_}, x.dtype(), ParamKind::kNorm).value.Fill(zero_init ? 0.0 : 1.0);
    AddParam("bias", {channels_}, x.dtype(), ParamKind::kNorm);
  }
  AddBuffer("running_mean", {channels_}, x.dtype());
  AddBuffer("running_var", {channels_}, x.dtype()).value.Fill(1.0);
  mean_.assign(channels_, 0.0);
  invstd_.assign(channels_, 1.0);
}

BatchStatsReducer* BatchNormLayer::Reducer() const {
  const bool sync = has_sync_setting_ ? sync_setting_ : context().sync_batch_norm;
  return sync ? context().batch_stats : nullptr;
}

bool BatchNormLayer::UseGlobalStats() const {
  return has_global_setting_ ? use_global_stats_ : phase() == Phase::kTest;
}

void BatchNormLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  CheckParamDType(*this, MasterDType(x.dtype()));
  if (x.ndim() < 2 || x.dim(1) != channels_) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be (N, ", channels_, ", ...), got ",
         x.ToString());
  }
  if (buffers_[0].value.dtype() != MasterDType(x.dtype())) {
    Fail(Describe(), ": running statistics are ", DTypeName(buffers_[0].value.dtype()),
         " but the input is ", x.ToString());
  }
  num_ = x.dim(0);
  spatial_ = ShapeCount(x.shape(), 2, x.ndim());
  top[0]->data.Resize(x.shape(), x.dtype());
  top[0]->data.set_format(x.format());
}

namespace {

// Rows per block of a channels-last reduction: the partial sums of each block are added in block
// order, so the statistics do not depend on the thread count (the device's order too).
constexpr int64_t kRowBlock = kernels::kBnRowBlock;

// The normalized value of the forward pass (the device's expression); the fused ReLU's backward
// recomputes it with the same expression, so its mask is the forward's.
template <typename T>
inline T Affine(T a, T x, T m, T b) {
  return kernels::BnAffine(a, x, m, b);
}
template <typename T>
inline T Relu(T v) {
  return v > T(0) ? v : T(0);
}
// Whether the fused ReLU's stored output of z is positive (the unfused ReLU's mask): z rounded to
// the storage type first, so 16-bit values that round to 0 are masked as the stored 0 is.
template <typename S, typename T>
inline bool Positive(T z) {
  return Widen(Narrow<S>(z)) > T(0);
}
// g where keep, else +0 (as the unfused ReLU's select, a NaN g included), written as a bit mask:
// GCC turns `keep ? g : 0` inside these reductions into a branch and gives up vectorizing
// (measured: the fused backward ran 3x slower than the unfused pair).
template <typename T>
inline T Masked(bool keep, T g) {
  return kernels::BnMasked(keep, g);
}

// Channels-last kernels over rows [r0, r1) of C contiguous channels, the channel loop innermost
// (contiguous; restrict pointers so it vectorizes). The sums take four rows per visit of the
// partial sums, so that their reads and writes do not outnumber the data's. (Tiles of 16
// channels with the rows innermost, accumulators in registers, measured 2-3x slower: the strided
// reads wait on memory.)
constexpr int64_t kRowsPerVisit = kernels::kBnRowsPerVisit;

template <typename S>
void SumRows(const S* __restrict x, int64_t r0, int64_t r1, int64_t c_n, double* __restrict s1,
             double* __restrict s2) {
  int64_t r = r0;
  for (; r + kRowsPerVisit <= r1; r += kRowsPerVisit) {
    const S* x0 = x + r * c_n;
#pragma omp simd
    for (int64_t c = 0; c < c_n; ++c) {
      const double v0 = Widen(x0[c]), v1 = Widen(x0[c_n + c]);
      const double v2 = Widen(x0[2 * c_n + c]), v3 = Widen(x0[3 * c_n + c]);
      s1[c] += (v0 + v1) + (v2 + v3);
      s2[c] += (v0 * v0 + v1 * v1) + (v2 * v2 + v3 * v3);
    }
  }
  for (; r < r1; ++r) {
    const S* row = x + r * c_n;
#pragma omp simd
    for (int64_t c = 0; c < c_n; ++c) {
      const double v = Widen(row[c]);
      s1[c] += v;
      s2[c] += v * v;
    }
  }
}

template <typename S, bool kRelu, typename T>
void NormalizeRows(const S* __restrict x, S* __restrict y, int64_t r0, int64_t r1, int64_t c_n,
                   const T* __restrict a, const T* __restrict m, const T* __restrict b) {
  for (int64_t r = r0; r < r1; ++r) {
    const S* xr = x + r * c_n;
    S* yr = y + r * c_n;
#pragma omp simd
    for (int64_t c = 0; c < c_n; ++c) {
      const T v = Affine(a[c], Widen(xr[c]), m[c], b[c]);
      yr[c] = Narrow<S>(kRelu ? Relu(v) : v);
    }
  }
}

template <typename S, bool kRelu, typename T>
void GradSumRows(const S* __restrict x, const S* __restrict dy, int64_t r0, int64_t r1, int64_t c_n,
                 const T* __restrict a, const T* __restrict m, const T* __restrict b,
                 double* __restrict sdy, double* __restrict sdyx) {
  // g and g (x - m) of element c of row r.
  auto terms = [&](const S* xr, const S* gr, int64_t c, double* g_out, double* gx_out) {
    const T xv = Widen(xr[c]);
    T g = Widen(gr[c]);
    if constexpr (kRelu) g = Masked(Positive<S>(Affine(a[c], xv, m[c], b[c])), g);
    *g_out = g;
    *gx_out = static_cast<double>(g) * static_cast<double>(xv - m[c]);
  };
  int64_t r = r0;
  for (; r + kRowsPerVisit <= r1; r += kRowsPerVisit) {
    const S* x0 = x + r * c_n;
    const S* g0 = dy + r * c_n;
#pragma omp simd
    for (int64_t c = 0; c < c_n; ++c) {
      double g[kRowsPerVisit], gx[kRowsPerVisit];
      for (int64_t k = 0; k < kRowsPerVisit; ++k)
        terms(x0 + k * c_n, g0 + k * c_n, c, &g[k], &gx[k]);
      sdy[c] += (g[0] + g[1]) + (g[2] + g[3]);
      sdyx[c] += (gx[0] + gx[1]) + (gx[2] + gx[3]);
    }
  }
  for (; r < r1; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < c_n; ++c) {
      double g, gx;
      terms(x + r * c_n, dy + r * c_n, c, &g, &gx);
      sdy[c] += g;
      sdyx[c] += gx;
    }
  }
}

template <typename S, bool kRelu, typename T>
void GradRows(const S* __restrict x, const S* __restrict dy, S* __restrict dx, int64_t r0,
              int64_t r1, int64_t c_n, const T* __restrict a, const T* __restrict m,
              const T* __restrict b, const T* __restrict ca, const T* __restrict cb,
              const T* __restrict cc) {
  for (int64_t r = r0; r < r1; ++r) {
    const S* xr = x + r * c_n;
    const S* gr = dy + r * c_n;
    S* dr = dx + r * c_n;
#pragma omp simd
    for (int64_t c = 0; c < c_n; ++c) {
      const T xv = Widen(xr[c]);
      T g = Widen(gr[c]);
      if constexpr (kRelu) g = Masked(Positive<S>(Affine(a[c], xv, m[c], b[c])), g);
      dr[c] = Narrow<S>(ca[c] * g + cb[c] * (xv - m[c]) + cc[c]);
    }
  }
}

// The same on one NCHW plane of s elements with the channel's coefficients.
template <typename S, bool kRelu, typename T>
void NormalizePlane(const S* __restrict x, S* __restrict y, int64_t s, T a, T m, T b) {
  for (int64_t j = 0; j < s; ++j) {
    const T v = Affine(a, Widen(x[j]), m, b);
    y[j] = Narrow<S>(kRelu ? Relu(v) : v);
  }
}

template <typename S, bool kRelu, typename T>
void GradPlane(const S* __restrict x, const S* __restrict dy, S* __restrict dx, int64_t s, T a, T m,
               T b, T ca, T cb, T cc) {
  for (int64_t j = 0; j < s; ++j) {
    const T xv = Widen(x[j]);
    T g = Widen(dy[j]);
    if constexpr (kRelu) g = Masked(Positive<S>(Affine(a, xv, m, b)), g);
    dx[j] = Narrow<S>(ca * g + cb * (xv - m) + cc);
  }
}

}  // namespace

std::string BatchNormLayer::Note() const {
  if (absorbed_) return " (folded into the convolution before it)";
  return relu_ ? "+ReLU" : "";
}

void BatchNormLayer::InferenceAffine(std::vector<double>* scale, std::vector<double>* shift) const {
  scale->resize(channels_);
  shift->resize(channels_);
  for (int64_t c = 0; c < channels_; ++c) {
    const double invstd = 1.0 / std::sqrt(ElementAsDouble(buffers_[1].value, c) + eps_);
    const double g = affine_ ? ElementAsDouble(params_[0].value, c) : 1.0;
    const double beta = affine_ ? ElementAsDouble(params_[1].value, c) : 0.0;
    (*scale)[c] = g * invstd;
    (*shift)[c] = beta - ElementAsDouble(buffers_[0].value, c) * g * invstd;
  }
}

template <typename T>
void BatchNormLayer::ForwardAffine(std::vector<T>& a, std::vector<T>& m, std::vector<T>& b) const {
  const T* gamma = affine_ ? params_[0].value.data<T>() : nullptr;
  const T* beta = affine_ ? params_[1].value.data<T>() : nullptr;
  a.resize(channels_);
  m.resize(channels_);
  b.resize(channels_);
  for (int64_t c = 0; c < channels_; ++c) {
    const double g = gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0;
    a[c] = static_cast<T>(g * invstd_[c]);
    m[c] = static_cast<T>(mean_[c]);
    b[c] = beta != nullptr ? beta[c] : T(0);
  }
}

template <typename S>
void BatchNormLayer::ForwardSums(const S* x, bool nhwc, std::vector<double>& s1,
                                 std::vector<double>& s2) {
  const int64_t c_n = channels_, n = num_, s = spatial_;
  if (!nhwc) {
    // Per channel, over its N planes (sequentially, so the sums do not depend on threads), each
    // plane in the lanes of kernels::BnLaneSums (the device's order).
    ParallelFor(c_n, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double a1 = 0, a2 = 0;
        for (int64_t i = 0; i < n; ++i) {
          const S* plane = x + (i * c_n + c) * s;
          auto load = [plane](int64_t j) { return Widen(plane[j]); };
          double p1, p2;
          kernels::BnLaneSums(s, kernels::BnStatTerms<decltype(load)>{load}, p1, p2);
          a1 += p1;
          a2 += p2;
        }
        s1[c] = a1;
        s2[c] = a2;
      }
    });
    return;
  }
  const int64_t rows = n * s, blocks = (rows + kRowBlock - 1) / kRowBlock;
  partials_.assign(static_cast<size_t>(blocks * 2 * c_n), 0.0);
  ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t k = b0; k < b1; ++k) {
      double* p = partials_.data() + k * 2 * c_n;
      SumRows(x, k * kRowBlock, std::min(rows, (k + 1) * kRowBlock), c_n, p, p + c_n);
    }
  });
  std::fill(s1.begin(), s1.end(), 0.0);
  std::fill(s2.begin(), s2.end(), 0.0);
  for (int64_t k = 0; k < blocks; ++k) {
    const double* p = partials_.data() + k * 2 * c_n;
    for (int64_t c = 0; c < c_n; ++c) {
      s1[c] += p[c];
      s2[c] += p[c_n + c];
    }
  }
}

template <typename S, bool kRelu>
void BatchNormLayer::Normalize(const S* x, bool nhwc, const std::vector<Compute<S>>& a,
                               const std::vector<Compute<S>>& m, const std::vector<Compute<S>>& b,
                               S* y) {
  const int64_t c_n = channels_, n = num_, s = spatial_;
  if (nhwc) {
    ParallelFor(n * s, std::max<int64_t>(1, 8192 / c_n), [&](int64_t r0, int64_t r1) {
      NormalizeRows<S, kRelu>(x, y, r0, r1, c_n, a.data(), m.data(), b.data());
    });
    return;
  }
  ParallelFor(n * c_n, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t plane = p0; plane < p1; ++plane) {
      const int64_t c = plane % c_n;
      NormalizePlane<S, kRelu>(x + plane * s, y + plane * s, s, a[c], m[c], b[c]);
    }
  });
}

template <typename S, bool kRelu>
void BatchNormLayer::BackwardSums(const S* x, const S* dy, bool nhwc, std::vector<double>& sdy,
                                  std::vector<double>& sdyx) {
  using T = Compute<S>;
  const int64_t c_n = channels_, n = num_, s = spatial_;
  std::vector<T> a, m, b;
  ForwardAffine(a, m, b);
  if (!nhwc) {
    ParallelFor(c_n, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const T mean = m[c], ac = a[c], bc = b[c];
        double a1 = 0, a2 = 0;
        for (int64_t i = 0; i < n; ++i) {
          const S* xp = x + (i * c_n + c) * s;
          const S* gp = dy + (i * c_n + c) * s;
          auto terms = [=](int64_t j, double& t1, double& t2) {
            kernels::BnGradTerms<T>(
                Widen(xp[j]), Widen(gp[j]), ac, mean, bc, kRelu, [](T z) { return Positive<S>(z); },
                t1, t2);
          };
          double p1, p2;
          kernels::BnLaneSums(s, terms, p1, p2);
          a1 += p1;
          a2 += p2;
        }
        sdy[c] = a1;
        sdyx[c] = a2;
      }
    });
    return;
  }
  const int64_t rows = n * s, blocks = (rows + kRowBlock - 1) / kRowBlock;
  partials_.assign(static_cast<size_t>(blocks * 2 * c_n), 0.0);
  ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t k = b0; k < b1; ++k) {
      double* p = partials_.data() + k * 2 * c_n;
      GradSumRows<S, kRelu>(x, dy, k * kRowBlock, std::min(rows, (k + 1) * kRowBlock), c_n,
                            a.data(), m.data(), b.data(), p, p + c_n);
    }
  });
  std::fill(sdy.begin(), sdy.end(), 0.0);
  std::fill(sdyx.begin(), sdyx.end(), 0.0);
  for (int64_t k = 0; k < blocks; ++k) {
    const double* p = partials_.data() + k * 2 * c_n;
    for (int64_t c = 0; c < c_n; ++c) {
      sdy[c] += p[c];
      sdyx[c] += p[c_n + c];
    }
  }
}

template <typename S, bool kRelu>
void BatchNormLayer::InputGradient(const S* x, const S* dy, bool nhwc,
                                   const std::vector<double>& coef_a,
                                   const std::vector<double>& coef_b,
                                   const std::vector<double>& coef_c, S* dx) {
  using T = Compute<S>;
  const int64_t c_n = channels_, n = num_, s = spatial_;
  std::vector<T> a, m, b, ca(c_n), cb(c_n), cc(c_n);
  ForwardAffine(a, m, b);
  for (int64_t c = 0; c < c_n; ++c) {
    ca[c] = static_cast<T>(coef_a[c]);
    cb[c] = static_cast<T>(coef_b[c]);
    cc[c] = static_cast<T>(coef_c[c]);
  }
  if (nhwc) {
    ParallelFor(n * s, std::max<int64_t>(1, 8192 / c_n), [&](int64_t r0, int64_t r1) {
      GradRows<S, kRelu>(x, dy, dx, r0, r1, c_n, a.data(), m.data(), b.data(), ca.data(), cb.data(),
                         cc.data());
    });
    return;
  }
  ParallelFor(n * c_n, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t plane = p0; plane < p1; ++plane) {
      const int64_t c = plane % c_n;
      GradPlane<S, kRelu>(x + plane * s, dy + plane * s, dx + plane * s, s, a[c], m[c], b[c], ca[c],
                          cb[c], cc[c]);
    }
  });
}

template <typename S>
void BatchNormLayer::ForwardT(const Tensor& xt, Tensor& yt) {
  using T = Compute<S>;
  const int64_t c_n = channels_, n = num_, s = spatial_;
  const bool nhwc = xt.channels_last();
  const S* x = xt.data<S>();  // bottom: (N, C, S), or (N, H, W, C) channels-last
  S* y = yt.data<S>();        // top: as bottom
  T* running_mean = buffers_[0].value.data<T>();
  T* running_var = buffers_[1].value.data<T>();
  last_used_batch_stats_ = !UseGlobalStats();

  if (last_used_batch_stats_) {
    // Per channel: sum x and sum x^2, accumulated in double (as PyTorch's CPU kernels do), so
    // that var = E[x^2] - E[x]^2 does not cancel when |mean| >> std.
    std::vector<double> s1(c_n), s2(c_n);
    ForwardSums(x, nhwc, s1, s2);
    double count = static_cast<double>(n * s);
    BatchStatsReducer* reducer = Reducer();
    if (reducer != nullptr) {
      // One call for [sum x, sum x^2, count]: the count makes unequal per-rank batches weigh
      // by their size.
      reduce_buf_.resize(2 * c_n + 1);
      std::copy(s1.begin(), s1.end(), reduce_buf_.begin());
      std::copy(s2.begin(), s2.end(), reduce_buf_.begin() + c_n);
      reduce_buf_[2 * c_n] = count;
      reducer->AllReduceSum(reduce_buf_.data(), 2 * c_n + 1);
      std::copy(reduce_buf_.begin(), reduce_buf_.begin() + c_n, s1.begin());
      std::copy(reduce_buf_.begin() + c_n, reduce_buf_.begin() + 2 * c_n, s2.begin());
      count = reduce_buf_[2 * c_n];
    }
    if (count <= 1) {
      Fail(Describe(), ": training needs more than one value per channel, got input ",
           xt.ToString(), reducer != nullptr ? " (across the batch-norm group's ranks)" : "");
    }
    count_ = count;
    for (int64_t c = 0; c < c_n; ++c) {
      mean_[c] = s1[c] / count;
      const double var = std::max(0.0, s2[c] / count - mean_[c] * mean_[c]);
      invstd_[c] = 1.0 / std::sqrt(var + eps_);
      const double m = momentum_;
      running_mean[c] = static_cast<T>((1 - m) * running_mean[c] + m * mean_[c]);
      running_var[c] = static_cast<T>((1 - m) * running_var[c] + m * var * count / (count - 1));
    }
  } else {
    for (int64_t c = 0; c < c_n; ++c) {
      mean_[c] = running_mean[c];
      invstd_[c] = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps_);
    }
  }

  // y = a (x - mean) + beta per channel, with a = gamma invstd. (Subtracting the mean first
  // avoids the cancellation of a x + (beta - a mean) when |mean| >> std.)
  std::vector<T> a, m, b;
  ForwardAffine(a, m, b);
  if (relu_) {
    Normalize<S, true>(x, nhwc, a, m, b, y);
  } else {
    Normalize<S, false>(x, nhwc, a, m, b, y);
  }
}

template <typename S>
void BatchNormLayer::BackwardT(const Tensor& xt, const Tensor& dyt, bool propagate, Tensor* dxt) {
  using T = Compute<S>;
  const int64_t c_n = channels_;
  const bool nhwc = xt.channels_last();
  const S* x = xt.data<S>();    // bottom: (N, C, S), or (N, H, W, C) channels-last
  const S* dy = dyt.data<S>();  // top grad: as bottom
  const T* gamma = affine_ ? params_[0].value.data<T>() : nullptr;

  // Per channel: sum g and sum g * (x - mean), g = dy (masked by the fused ReLU).
  std::vector<double> sdy(c_n), sdyx(c_n);
  if (relu_) {
    BackwardSums<S, true>(x, dy, nhwc, sdy, sdyx);
  } else {
    BackwardSums<S, false>(x, dy, nhwc, sdy, sdyx);
  }
  // Param grads are local: dgamma = sum g * xhat, dbeta = sum g.
  if (affine_) {
    T* dgamma = params_[0].grad.data<T>();
    T* dbeta = params_[1].grad.data<T>();
    for (int64_t c = 0; c < c_n; ++c) {
      dgamma[c] = static_cast<T>(sdyx[c] * invstd_[c]);
      dbeta[c] = static_cast<T>(sdy[c]);
    }
  }
  if (!propagate) return;

  // dx = A g + B (x - mean) + C per channel.
  std::vector<double> coef_a(c_n), coef_b(c_n), coef_c(c_n);
  if (last_used_batch_stats_) {
    // dx = gamma invstd (g - mean(g) - xhat mean(g xhat)), means over the global batch.
    double count = count_;
    if (BatchStatsReducer* reducer = Reducer()) {
      reduce_buf_.resize(2 * c_n);
      std::copy(sdy.begin(), sdy.end(), reduce_buf_.begin());
      std::copy(sdyx.begin(), sdyx.end(), reduce_buf_.begin() + c_n);  // sum g * (x - mean)
      reducer->AllReduceSum(reduce_buf_.data(), 2 * c_n);
      std::copy(reduce_buf_.begin(), reduce_buf_.begin() + c_n, sdy.begin());
      std::copy(reduce_buf_.begin() + c_n, reduce_buf_.end(), sdyx.begin());
    }
    for (int64_t c = 0; c < c_n; ++c) {
      const double g = gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0;
      const double a = g * invstd_[c];
      const double b = -a * invstd_[c] * invstd_[c] * sdyx[c] / count;
      coef_a[c] = a;
      coef_b[c] = b;
      coef_c[c] = -a * sdy[c] / count;
    }
  } else {
    for (int64_t c = 0; c < c_n; ++c) {
      const double g = gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0;
      coef_a[c] = g * invstd_[c];
      coef_b[c] = 0;
      coef_c[c] = 0;
    }
  }
  S* dx = dxt->data<S>();  // bottom grad: as bottom
  if (relu_) {
    InputGradient<S, true>(x, dy, nhwc, coef_a, coef_b, coef_c, dx);
  } else {
    InputGradient<S, false>(x, dy, nhwc, coef_a, coef_b, coef_c, dx);
  }
}

void BatchNormLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  WithElementCodes(*this, bottom[0]->data.dtype(), [&](auto codes) {
    DeviceForward<decltype(codes)>(bottom[0]->data, top[0]->data);
  });
}

void BatchNormLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                      const Blobs& bottom) {
  WithElementCodes(*this, bottom[0]->data.dtype(), [&](auto codes) {
    DeviceBackward<decltype(codes)>(bottom[0]->data, top[0]->grad, propagate_down[0],
                                    &bottom[0]->grad);
  });
}

template <class E>
void BatchNormLayer::DeviceSums(const Tensor& x, const Tensor* dy) {
  using T = typename E::Acc;
  const int64_t c_n = channels_, n = num_, s = spatial_;
  const bool nhwc = x.channels_last();
  const int64_t parts = nhwc ? (n * s + kRowBlock - 1) / kRowBlock : n;
  EnsureOnDevice(dev_part_, x.device(), {parts * 2 * c_n}, DType::kF64);
  double* part = dev_part_.device_data<double>();
  const kernels::BnReduceArgs<E> r{StoredData<E>(x),
                                   dy != nullptr ? StoredData<E>(*dy) : nullptr,
                                   dev_affine_.device_data<T>(),
                                   n,
                                   c_n,
                                   s,
                                   relu_};
  const Tensor dyt = dy != nullptr ? *dy : Tensor();
  if (nhwc) {
    RunIndexed("batch norm sums", {x, dyt, dev_affine_, dev_part_}, parts * c_n,
               kernels::BnRowBlockSums<E>{r, part}, 1);
  } else {
    RunIndexed("batch norm sums", {x, dyt, dev_affine_, dev_part_}, n * c_n,
               kernels::BnPlaneSums<E>{r, part}, 1);
  }
  RunIndexed("batch norm sums", {dev_part_, dev_sums_}, c_n,
             kernels::BnCombineSums{part, dev_sums_.device_data<double>(), parts, c_n}, 1);
}

void BatchNormLayer::AllReduceDeviceSums(BatchStatsReducer& reducer, double* count) {
  const int64_t c_n = channels_;
  if (!host_sums_.defined()) host_sums_ = Tensor({2 * c_n + 1}, DType::kF64);
  Tensor sums = host_sums_.View({2 * c_n}, 0);
  DeviceRuntime& runtime = RuntimeFor(dev_sums_.device());
  runtime.Copy(sums, dev_sums_);  // waits: the sums are on the host after it
  double* values = host_sums_.data<double>();
  if (count != nullptr) values[2 * c_n] = *count;
  reducer.AllReduceSum(values, count != nullptr ? 2 * c_n + 1 : 2 * c_n);
  if (count != nullptr) *count = values[2 * c_n];
  runtime.Copy(dev_sums_, sums);  // from pageable memory: done (queued first) when it returns
}

template <class E>
void BatchNormLayer::DeviceForward(const Tensor& xt, Tensor& yt) {
  using T = typename E::Acc;  // the parameters', running statistics' and coefficients' dtype
  const Device device = xt.device();
  const int64_t c_n = channels_;
  EnsureOnDevice(dev_sums_, device, {2 * c_n}, DType::kF64);
  EnsureOnDevice(dev_stats_, device, {2 * c_n}, DType::kF64);
  EnsureOnDevice(dev_affine_, device, {3 * c_n}, MasterDType(xt.dtype()));
  last_used_batch_stats_ = !UseGlobalStats();
  double count = static_cast<double>(num_ * spatial_);
  if (last_used_batch_stats_) {
    DeviceSums<E>(xt, nullptr);
    BatchStatsReducer* reducer = Reducer();
    if (reducer != nullptr) AllReduceDeviceSums(*reducer, &count);
    if (count <= 1) {
      Fail(Describe(), ": training needs more than one value per channel, got input ",
           xt.ToString(), reducer != nullptr ? " (across the batch-norm group's ranks)" : "");
    }
    count_ = count;
  }
  const Tensor gamma = affine_ ? params_[0].value : Tensor();
  const Tensor beta = affine_ ? params_[1].value : Tensor();
  Tensor& running_mean = buffers_[0].value;
  Tensor& running_var = buffers_[1].value;
  RunIndexed("batch norm statistics",
             {dev_sums_, gamma, beta, running_mean, running_var, dev_stats_, dev_affine_}, c_n,
             kernels::BnStatistics<T>{
                 dev_sums_.device_data<double>(), affine_ ? gamma.device_data<T>() : nullptr,
                 affine_ ? beta.device_data<T>() : nullptr, running_mean.device_data<T>(),
                 running_var.device_data<T>(), dev_stats_.device_data<double>(),
                 dev_affine_.device_data<T>(), c_n, count, eps_, momentum_, last_used_batch_stats_},
             1);
  RunIndexed("batch norm forward", {xt, dev_affine_, yt}, xt.numel(),
             kernels::BnNormalize<E>{StoredData<E>(xt), dev_affine_.device_data<T>(),
                                     StoredData<E>(yt), c_n, spatial_, xt.channels_last(), relu_});
}

template <class E>
void BatchNormLayer::DeviceBackward(const Tensor& xt, const Tensor& dyt, bool propagate,
                                    Tensor* dxt) {
  using T = typename E::Acc;
  if (!affine_ && !propagate) return;
  const int64_t c_n = channels_;
  // The forward's statistics and coefficients are on the device (dev_stats_, dev_affine_).
  DeviceSums<E>(xt, &dyt);
  if (affine_) {
    Tensor& dgamma = params_[0].grad;
    Tensor& dbeta = params_[1].grad;
    RunIndexed(
        "batch norm parameter gradients", {dev_sums_, dev_stats_, dgamma, dbeta}, c_n,
        kernels::BnParamGrads<T>{dev_sums_.device_data<double>(), dev_stats_.device_data<double>(),
                                 dgamma.device_data<T>(), dbeta.device_data<T>(), c_n},
        1);
  }
  if (!propagate) return;
  if (last_used_batch_stats_) {
    if (BatchStatsReducer* reducer = Reducer()) AllReduceDeviceSums(*reducer, nullptr);
  }
  EnsureOnDevice(dev_coef_, xt.device(), {3 * c_n}, MasterDType(xt.dtype()));
  const Tensor gamma = affine_ ? params_[0].value : Tensor();
  RunIndexed("batch norm input gradient coefficients", {dev_sums_, dev_stats_, gamma, dev_coef_},
             c_n,
             kernels::BnInputCoefficients<T>{
                 dev_sums_.device_data<double>(), dev_stats_.device_data<double>(),
                 affine_ ? gamma.device_data<T>() : nullptr, dev_coef_.device_data<T>(), c_n,
                 count_, last_used_batch_stats_},
             1);
  RunIndexed(
      "batch norm backward", {xt, dyt, dev_affine_, dev_coef_, *dxt}, xt.numel(),
      kernels::BnInputGrad<E>{StoredData<E>(xt), StoredData<E>(dyt), dev_affine_.device_data<T>(),
                              dev_coef_.device_data<T>(), StoredData<E>(*dxt), c_n, spatial_,
                              xt.channels_last(), relu_});
}

template class TypedLayer<BatchNormLayer, AllFloatTypes, KernelArgs::kOneInput>;

CORTADO_REGISTER_LAYER(BatchNorm, BatchNormLayer);

}  // namespace cortado
