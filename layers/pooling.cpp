#include "layers/pooling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/base/thread_pool.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/layer_util.h"
#include "layers/pooling_kernels.h"

namespace cortado {
namespace {

// PyTorch's pooling_output_shape (dilation 1).
int64_t PooledSize(int64_t in, int64_t kernel, int64_t pad, int64_t stride, bool ceil_mode) {
  const int64_t num = in + 2 * pad - kernel + (ceil_mode ? stride - 1 : 0);
  // Floor division that is correct for a negative numerator.
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace

void PoolingLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const std::string pool = settings().GetString("pool", "max");
  if (pool == "max") {
    is_max_ = true;
  } else if (pool == "ave" || pool == "avg") {
    is_max_ = false;
  } else {
    Fail(Describe(), ": key 'pool' expects max or ave, got '", pool, "'");
  }
  global_ = settings().GetBool("global", false);
  ceil_mode_ = settings().GetBool("ceil_mode", false);
  count_include_pad_ = settings().GetBool("count_include_pad", true);
  const bool has_kernel = settings().Has("kernel");
  const std::vector<int64_t> kernel = settings().GetPair("kernel", 0);
  const std::vector<int64_t> stride = settings().GetPair("stride", 0);
  const std::vector<int64_t> pad = settings().GetPair("pad", 0);
  if (global_) {
    if (has_kernel || settings().Has("stride") || settings().Has("pad")) {
      Fail(Describe(), ": global pooling takes no kernel, stride or pad");
    }
    return;
  }
  if (!has_kernel) Fail(Describe(), ": missing required key 'kernel' (or set global: true)");
  kernel_h_ = kernel[0], kernel_w_ = kernel[1];
  stride_h_ = settings().Has("stride") ? stride[0] : kernel_h_;
  stride_w_ = settings().Has("stride") ? stride[1] : kernel_w_;
  pad_h_ = pad[0], pad_w_ = pad[1];
  if (kernel_h_ <= 0 || kernel_w_ <= 0) Fail(Describe(), ": key 'kernel' must be positive");
  if (stride_h_ <= 0 || stride_w_ <= 0) Fail(Describe(), ": key 'stride' must be positive");
  if (pad_h_ < 0 || pad_w_ < 0 || pad_h_ > kernel_h_ / 2 || pad_w_ > kernel_w_ / 2) {
    Fail(Describe(), ": key 'pad' must be between 0 and half the kernel, got ", pad_h_, "x", pad_w_,
         " for kernel ", kernel_h_, "x", kernel_w_);
  }
}

void PoolingLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  if (x.ndim() != 4) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be 4-d (N, C, H, W), got ",
         x.ToString());
  }
  planes_ = x.dim(0) * x.dim(1);
  channels_ = x.dim(1);
  height_ = x.dim(2);
  width_ = x.dim(3);
  if (global_) {
    kh_ = height_, kw_ = width_, sh_ = 1, sw_ = 1, ph_ = 0, pw_ = 0;
    out_h_ = out_w_ = 1;
  } else {
    kh_ = kernel_h_, kw_ = kernel_w_, sh_ = stride_h_, sw_ = stride_w_, ph_ = pad_h_, pw_ = pad_w_;
    out_h_ = PooledSize(height_, kh_, ph_, sh_, ceil_mode_);
    out_w_ = PooledSize(width_, kw_, pw_, sw_, ceil_mode_);
    if (out_h_ <= 0 || out_w_ <= 0) {
      Fail(Describe(), ": input ", x.ToString(), " is too small for kernel ", kh_, "x", kw_,
           " with padding ", ph_, "x", pw_, " (the output would be ", out_h_, "x", out_w_, ")");
    }
  }
  top[0]->data.Resize({x.dim(0), x.dim(1), out_h_, out_w_}, x.dtype());
  top[0]->data.set_format(x.format());
  if (!is_max_) return;
  // The argmax lives on the input's device, where the forward kernel writes it.
  const Device device = x.device();
  if (context().inference && context().scratch != nullptr) {
    // Nothing reads the argmax after this forward: every pooling layer of the net uses one.
    Tensor& shared = context().scratch->ForwardOnly();
    argmax_ = Tensor();  // drops this layer's hold on a smaller buffer before the shared grows
    if (shared.device() != device) shared = Tensor({0}, DType::kI32, AllocatorFor(device));
    shared.Resize(top[0]->data.shape(), DType::kI32);
    argmax_ = shared;
  } else {
    if (argmax_.device() != device) argmax_ = Tensor({0}, DType::kI32, AllocatorFor(device));
    argmax_.Resize(top[0]->data.shape(), DType::kI32);
  }
}

namespace {

// Output columns ow in [0, out) whose input column ow * stride + offset lies in [0, size).
inline void ValidRange(int64_t offset, int64_t stride, int64_t size, int64_t out, int64_t* lo,
                       int64_t* hi) {
  int64_t l = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  int64_t h = size - 1 - offset >= 0 ? (size - 1 - offset) / stride + 1 : 0;
  l = std::min(l, out);
  *lo = l;
  *hi = std::max(std::min(h, out), l);
}

// One window element (a fixed row and kernel column) for every output column in [lo, hi):
// the running max and its index. kStride 0 means `stride` is read at run time; 1 and 2 are
// compile-time so the loads vectorize. NaN wins and stays, as in PyTorch.
template <typename T, int kStride>
void MaxStep(const T* __restrict row, int64_t offset, int64_t stride, int64_t lo, int64_t hi,
             int32_t row_base, T* __restrict best, int32_t* __restrict arg) {
  const int64_t s = kStride > 0 ? kStride : stride;
  for (int64_t ow = lo; ow < hi; ++ow) {
    const int64_t iw = ow * s + offset;
    const T v = row[iw];
    const T cur = best[ow];
    const bool take = v > cur || v != v;
    best[ow] = take ? v : cur;
    arg[ow] = take ? row_base + static_cast<int32_t>(iw) : arg[ow];
  }
}

template <typename T, int kStride>
void SumStep(const T* __restrict row, int64_t offset, int64_t stride, int64_t lo, int64_t hi,
             T* __restrict acc) {
  const int64_t s = kStride > 0 ? kStride : stride;
  for (int64_t ow = lo; ow < hi; ++ow) acc[ow] += row[ow * s + offset];
}

template <typename T>
void DispatchMaxStep(const T* row, int64_t offset, int64_t stride, int64_t lo, int64_t hi,
                     int32_t row_base, T* best, int32_t* arg) {
  if (stride == 1) return MaxStep<T, 1>(row, offset, 1, lo, hi, row_base, best, arg);
  if (stride == 2) return MaxStep<T, 2>(row, offset, 2, lo, hi, row_base, best, arg);
  MaxStep<T, 0>(row, offset, stride, lo, hi, row_base, best, arg);
}

template <typename T>
void DispatchSumStep(const T* row, int64_t offset, int64_t stride, int64_t lo, int64_t hi, T* acc) {
  if (stride == 1) return SumStep<T, 1>(row, offset, 1, lo, hi, acc);
  if (stride == 2) return SumStep<T, 2>(row, offset, 2, lo, hi, acc);
  SumStep<T, 0>(row, offset, stride, lo, hi, acc);
}

// One output row of 2x2 / stride-2 max pooling from input rows r0 and r1 (LeNet's pooling);
// `base` is the plane index of r0[0]. With plain comparisons the selects compile branch-free
// (random data would mispredict every other branch); a NaN among the inputs is noted, and
// the caller then redoes the row with MaxStep's exact NaN rule. Visiting order (and so the
// first-maximum tie rule) is MaxStep's.
template <typename T>
bool MaxPool2x2Row(const T* __restrict r0, const T* __restrict r1, int32_t n, int32_t base,
                   int32_t w, T* __restrict y, int32_t* __restrict arg) {
  int32_t nan = 0;
  for (int32_t ow = 0; ow < n; ++ow) {
    const T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
    nan |= static_cast<int32_t>(a != a) | static_cast<int32_t>(b != b) |
           static_cast<int32_t>(c != c) | static_cast<int32_t>(d != d);
    // Selects as integer masks and max as max(), so that no branch is emitted.
    int32_t take = -static_cast<int32_t>(b > a);  // all ones when b wins
    T best = std::max(a, b);
    int32_t off = take & 1;
    take = -static_cast<int32_t>(c > best);
    best = std::max(best, c);
    off = (take & w) | (~take & off);
    take = -static_cast<int32_t>(d > best);
    best = std::max(best, d);
    off = (take & (w + 1)) | (~take & off);
    y[ow] = best;
    arg[ow] = base + 2 * ow + off;
  }
  return nan != 0;
}

}  // namespace

// One (N, C) plane; T is the compute type (f32 or f64).
int64_t PoolingLayer::AverageDivisor(int64_t hs_pad, int64_t he_pad, int64_t ow) const {
  const int64_t hs = std::max<int64_t>(hs_pad, 0), he = std::min(he_pad, height_);
  const int64_t ws_pad = ow * sw_ - pw_;
  const int64_t we_pad = std::min(ws_pad + kw_, width_ + pw_);
  const int64_t ws = std::max<int64_t>(ws_pad, 0), we = std::min(we_pad, width_);
  if (hs >= he || ws >= we) return 0;  // the window lies wholly in the padding
  return count_include_pad_ ? (he_pad - hs_pad) * (we_pad - ws_pad) : (he - hs) * (we - ws);
}

template <typename T>
void PoolingLayer::ForwardPlane(const T* xp, T* yp, int32_t* argp) const {
  const int64_t h = height_, w = width_, oh_n = out_h_, ow_n = out_w_;
  const int64_t in_plane = h * w;
  const bool fast_2x2 = is_max_ && !global_ && kh_ == 2 && kw_ == 2 && sh_ == 2 && sw_ == 2 &&
                        ph_ == 0 && pw_ == 0 && 2 * oh_n <= h && 2 * ow_n <= w;
  if (global_ && !is_max_) {
    // In order (no vector partial sums): NHWC's sum, and the device body's, bit for bit.
    T s = T(0);
    for (int64_t i = 0; i < in_plane; ++i) s += xp[i];
    yp[0] = s / static_cast<T>(in_plane);
    return;
  }
  if (fast_2x2) {
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      const T* r0 = xp + 2 * oh * w;
      T* yrow = yp + oh * ow_n;
      int32_t* arow = argp + oh * ow_n;
      if (!MaxPool2x2Row(r0, r0 + w, static_cast<int32_t>(ow_n), static_cast<int32_t>(2 * oh * w),
                         static_cast<int32_t>(w), yrow, arow)) {
        continue;
      }
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        yrow[ow] = -std::numeric_limits<T>::infinity();
        arow[ow] = static_cast<int32_t>(2 * oh * w + 2 * ow);
      }
      for (int64_t ih = 2 * oh; ih < 2 * oh + 2; ++ih) {
        for (int64_t kj = 0; kj < 2; ++kj) {
          MaxStep<T, 2>(xp + ih * w, kj, 2, 0, ow_n, static_cast<int32_t>(ih * w), yrow, arow);
        }
      }
    }
    return;
  }
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    const int64_t hs_pad = oh * sh_ - ph_;
    const int64_t he_pad = std::min(hs_pad + kh_, h + ph_);
    const int64_t hs = std::max<int64_t>(hs_pad, 0), he = std::min(he_pad, h);
    T* yrow = yp + oh * ow_n;
    if (is_max_) {
      int32_t* arow = argp + oh * ow_n;
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        yrow[ow] = -std::numeric_limits<T>::infinity();
        arow[ow] = static_cast<int32_t>(hs * w + std::max<int64_t>(ow * sw_ - pw_, 0));
      }
      for (int64_t ih = hs; ih < he; ++ih) {
        for (int64_t kj = 0; kj < kw_; ++kj) {
          int64_t lo, hi;
          ValidRange(kj - pw_, sw_, w, ow_n, &lo, &hi);
          DispatchMaxStep(xp + ih * w, kj - pw_, sw_, lo, hi, static_cast<int32_t>(ih * w), yrow,
                          arow);
        }
      }
    } else {
      std::fill(yrow, yrow + ow_n, T(0));
      for (int64_t ih = hs; ih < he; ++ih) {
        for (int64_t kj = 0; kj < kw_; ++kj) {
          int64_t lo, hi;
          ValidRange(kj - pw_, sw_, w, ow_n, &lo, &hi);
          DispatchSumStep(xp + ih * w, kj - pw_, sw_, lo, hi, yrow);
        }
      }
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const int64_t divisor = AverageDivisor(hs_pad, he_pad, ow);
        yrow[ow] = divisor == 0 ? T(0) : yrow[ow] / static_cast<T>(divisor);
      }
    }
  }
}

template <typename T>
void PoolingLayer::ForwardRowNhwc(const T* x, int64_t oh, T* y, int32_t* arg) const {
  const int64_t w = width_, c_n = channels_, ow_n = out_w_;
  const int64_t hs_pad = oh * sh_ - ph_;
  const int64_t he_pad = std::min(hs_pad + kh_, height_ + ph_);
  const int64_t hs = std::max<int64_t>(hs_pad, 0), he = std::min(he_pad, height_);
  for (int64_t ow = 0; ow < ow_n; ++ow) {
    const int64_t ws_pad = ow * sw_ - pw_;
    const int64_t ws = std::max<int64_t>(ws_pad, 0), we = std::min(ws_pad + kw_, w);
    T* __restrict yo = y + ow * c_n;
    if (is_max_) {
      // NCHW's visiting order (rows, then columns of the window), its tie and NaN rules.
      int32_t* __restrict ao = arg + ow * c_n;
      const int32_t first = static_cast<int32_t>(hs * w + ws);
      for (int64_t c = 0; c < c_n; ++c) {
        yo[c] = -std::numeric_limits<T>::infinity();
        ao[c] = first;
      }
      for (int64_t ih = hs; ih < he; ++ih) {
        for (int64_t iw = ws; iw < we; ++iw) {
          const T* __restrict xi = x + (ih * w + iw) * c_n;
          const int32_t at = static_cast<int32_t>(ih * w + iw);
          for (int64_t c = 0; c < c_n; ++c) {
            const T v = xi[c];
            const T cur = yo[c];
            const bool take = v > cur || v != v;
            yo[c] = take ? v : cur;
            ao[c] = take ? at : ao[c];
          }
        }
      }
    } else {
      for (int64_t c = 0; c < c_n; ++c) yo[c] = T(0);
      for (int64_t ih = hs; ih < he; ++ih) {
        for (int64_t iw = ws; iw < we; ++iw) {
          const T* __restrict xi = x + (ih * w + iw) * c_n;
          for (int64_t c = 0; c < c_n; ++c) yo[c] += xi[c];
        }
      }
      const int64_t divisor = AverageDivisor(hs_pad, he_pad, ow);
      for (int64_t c = 0; c < c_n; ++c) {
        yo[c] = divisor == 0 ? T(0) : yo[c] / static_cast<T>(divisor);
      }
    }
  }
}

template <typename T>
void PoolingLayer::BackwardImageNhwc(const T* dy, const int32_t* arg, T* dx) const {
  const int64_t c_n = channels_, in_plane = height_ * width_, ow_n = out_w_;
  const int64_t out_plane = out_h_ * ow_n;
  std::fill(dx, dx + in_plane * c_n, T(0));
  if (is_max_) {
    for (int64_t o = 0; o < out_plane; ++o) {
      const T* g = dy + o * c_n;
      const int32_t* a = arg + o * c_n;
      for (int64_t c = 0; c < c_n; ++c) dx[a[c] * c_n + c] += g[c];
    }
    return;
  }
  // NCHW's order of additions (rows of the window, its columns, then the outputs), so every
  // input element sums the same terms in the same order.
  std::vector<T> share(ow_n * c_n);  // one output row's gradients, divided among their windows
  for (int64_t oh = 0; oh < out_h_; ++oh) {
    const int64_t hs_pad = oh * sh_ - ph_;
    const int64_t he_pad = std::min(hs_pad + kh_, height_ + ph_);
    const int64_t hs = std::max<int64_t>(hs_pad, 0), he = std::min(he_pad, height_);
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const int64_t divisor = AverageDivisor(hs_pad, he_pad, ow);
      const T* g = dy + (oh * ow_n + ow) * c_n;
      for (int64_t c = 0; c < c_n; ++c) {
        share[ow * c_n + c] = divisor == 0 ? T(0) : g[c] / static_cast<T>(divisor);
      }
    }
    for (int64_t ih = hs; ih < he; ++ih) {
      for (int64_t kj = 0; kj < kw_; ++kj) {
        int64_t lo, hi;
        ValidRange(kj - pw_, sw_, width_, ow_n, &lo, &hi);
        for (int64_t ow = lo; ow < hi; ++ow) {
          T* __restrict d = dx + (ih * width_ + ow * sw_ + kj - pw_) * c_n;
          const T* __restrict sh = share.data() + ow * c_n;
          for (int64_t c = 0; c < c_n; ++c) d[c] += sh[c];
        }
      }
    }
  }
}

template <typename T>
void PoolingLayer::ForwardNhwc(const Tensor& xt, Tensor& yt) {
  using A = Compute<T>;
  const T* x = xt.data<T>();  // bottom: (N, H, W, C) in memory
  T* y = yt.data<T>();        // top: (N, H_out, W_out, C)
  const int64_t c_n = channels_, n = xt.dim(0);
  const int64_t in_image = height_ * width_ * c_n, out_row = out_w_ * c_n;
  int32_t* arg = is_max_ ? argmax_.data<int32_t>() : nullptr;
  if (global_ && !is_max_) {
    // Global average: one running sum per channel over the image's positions.
    ParallelFor(n, 1, [&](int64_t i0, int64_t i1) {
      std::vector<A> acc(c_n);
      for (int64_t i = i0; i < i1; ++i) {
        std::fill(acc.begin(), acc.end(), A(0));
        const T* xi = x + i * in_image;
        for (int64_t p = 0; p < height_ * width_; ++p) {
          for (int64_t c = 0; c < c_n; ++c) acc[c] += Widen(xi[p * c_n + c]);
        }
        for (int64_t c = 0; c < c_n; ++c) acc[c] /= static_cast<A>(height_ * width_);
        NarrowSpan<T>(acc.data(), c_n, y + i * c_n);
      }
    });
    return;
  }
  ParallelFor(n * out_h_, 1, [&](int64_t r0, int64_t r1) {
    // 16-bit storage: each image widened once per task, pooled in f32, each row rounded back.
    std::vector<A> wide_x(kIsLowPrecision<T> ? in_image : 0);
    std::vector<A> wide_y(kIsLowPrecision<T> ? out_row : 0);
    int64_t widened = -1;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r / out_h_, oh = r % out_h_;
      int32_t* argr = arg != nullptr ? arg + r * out_row : nullptr;
      if constexpr (kIsLowPrecision<T>) {
        if (widened != i) {
          WidenSpan<T>(x + i * in_image, in_image, wide_x.data());
          widened = i;
        }
        ForwardRowNhwc<A>(wide_x.data(), oh, wide_y.data(), argr);
        NarrowSpan<T>(wide_y.data(), out_row, y + r * out_row);
      } else {
        ForwardRowNhwc<T>(x + i * in_image, oh, y + r * out_row, argr);
      }
    }
  });
}

template <typename T>
void PoolingLayer::BackwardNhwc(const Tensor& dyt, Tensor* dxt) {
  using A = Compute<T>;
  const T* dy = dyt.data<T>();  // top grad: (N, H_out, W_out, C) in memory
  T* dx = dxt->data<T>();       // bottom grad: (N, H, W, C)
  const int64_t c_n = channels_, n = dyt.dim(0);
  const int64_t in_image = height_ * width_ * c_n, out_image = out_h_ * out_w_ * c_n;
  const int32_t* arg = is_max_ ? argmax_.data<int32_t>() : nullptr;
  ParallelFor(n, 1, [&](int64_t i0, int64_t i1) {
    std::vector<A> wide_dy(kIsLowPrecision<T> ? out_image : 0);
    std::vector<A> wide_dx(kIsLowPrecision<T> ? in_image : 0);
    for (int64_t i = i0; i < i1; ++i) {
      const int32_t* argi = arg != nullptr ? arg + i * out_image : nullptr;
      if (global_ && !is_max_) {
        // dx = dy / (H W) at every position of the channel (NCHW's value, rounded once).
        std::vector<A> g(c_n);
        std::vector<T> row(c_n);
        for (int64_t c = 0; c < c_n; ++c) {
          g[c] = Widen(dy[i * c_n + c]) / static_cast<A>(height_ * width_);
        }
        NarrowSpan<T>(g.data(), c_n, row.data());
        T* dxi = dx + i * in_image;
        for (int64_t p = 0; p < height_ * width_; ++p) {
          std::copy(row.begin(), row.end(), dxi + p * c_n);
        }
        continue;
      }
      if constexpr (kIsLowPrecision<T>) {
        WidenSpan<T>(dy + i * out_image, out_image, wide_dy.data());
        BackwardImageNhwc<A>(wide_dy.data(), argi, wide_dx.data());
        NarrowSpan<T>(wide_dx.data(), in_image, dx + i * in_image);
      } else {
        BackwardImageNhwc<T>(dy + i * out_image, argi, dx + i * in_image);
      }
    }
  });
}

template <typename T>
void PoolingLayer::ForwardT(const Tensor& xt, Tensor& yt) {
  if (xt.channels_last()) return ForwardNhwc<T>(xt, yt);
  using A = Compute<T>;
  const T* x = xt.data<T>();  // bottom: (N, C, H, W)
  T* y = yt.data<T>();        // top: (N, C, H_out, W_out)
  const int64_t in_plane = height_ * width_, out_plane = out_h_ * out_w_;
  int32_t* arg = is_max_ ? argmax_.data<int32_t>() : nullptr;
  ParallelFor(planes_, 1, [&](int64_t p0, int64_t p1) {
    // 16-bit storage: each plane widened, pooled in f32, rounded back (as the f32 fallback).
    std::vector<A> wide_x(kIsLowPrecision<T> ? in_plane : 0);
    std::vector<A> wide_y(kIsLowPrecision<T> ? out_plane : 0);
    for (int64_t pl = p0; pl < p1; ++pl) {
      int32_t* argp = arg != nullptr ? arg + pl * out_plane : nullptr;
      if constexpr (kIsLowPrecision<T>) {
        WidenSpan<T>(x + pl * in_plane, in_plane, wide_x.data());
        ForwardPlane<A>(wide_x.data(), wide_y.data(), argp);
        NarrowSpan<T>(wide_y.data(), out_plane, y + pl * out_plane);
      } else {
        ForwardPlane<T>(x + pl * in_plane, y + pl * out_plane, argp);
      }
    }
  });
}

template <typename T>
void PoolingLayer::BackwardPlane(const T* dyp, T* dxp, const int32_t* argp,
                                 std::vector<T>& g) const {
  const int64_t h = height_, w = width_, oh_n = out_h_, ow_n = out_w_;
  const int64_t in_plane = h * w, out_plane = oh_n * ow_n;
  g.resize(is_max_ || global_ ? 0 : ow_n);
  if (global_ && !is_max_) {
    const T v = dyp[0] / static_cast<T>(in_plane);
    std::fill(dxp, dxp + in_plane, v);
    return;
  }
  std::fill(dxp, dxp + in_plane, T(0));
  if (is_max_) {
    const int32_t* ap = argp;
    for (int64_t i = 0; i < out_plane; ++i) dxp[ap[i]] += dyp[i];
    return;
  }
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    const int64_t hs_pad = oh * sh_ - ph_;
    const int64_t he_pad = std::min(hs_pad + kh_, h + ph_);
    const int64_t hs = std::max<int64_t>(hs_pad, 0), he = std::min(he_pad, h);
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const int64_t divisor = AverageDivisor(hs_pad, he_pad, ow);
      g[ow] = divisor == 0 ? T(0) : dyp[oh * ow_n + ow] / static_cast<T>(divisor);
    }
    for (int64_t ih = hs; ih < he; ++ih) {
      T* row = dxp + ih * w;
      for (int64_t kj = 0; kj < kw_; ++kj) {
        int64_t lo, hi;
        ValidRange(kj - pw_, sw_, w, ow_n, &lo, &hi);
        const int64_t off = kj - pw_;
        for (int64_t ow = lo; ow < hi; ++ow) row[ow * sw_ + off] += g[ow];
      }
    }
  }
}

template <typename T>
void PoolingLayer::BackwardT(const Tensor&, const Tensor& dyt, bool propagate, Tensor* dxt) {
  if (!propagate) return;
  if (dxt->channels_last()) return BackwardNhwc<T>(dyt, dxt);
  using A = Compute<T>;
  const T* dy = dyt.data<T>();  // top grad: (N, C, H_out, W_out)
  T* dx = dxt->data<T>();       // bottom grad: (N, C, H, W)
  const int64_t in_plane = height_ * width_, out_plane = out_h_ * out_w_;
  const int32_t* arg = is_max_ ? argmax_.data<int32_t>() : nullptr;
  ParallelFor(planes_, 1, [&](int64_t p0, int64_t p1) {
    std::vector<A> g;
    std::vector<A> wide_dy(kIsLowPrecision<T> ? out_plane : 0);
    std::vector<A> wide_dx(kIsLowPrecision<T> ? in_plane : 0);
    for (int64_t pl = p0; pl < p1; ++pl) {
      const int32_t* argp = arg != nullptr ? arg + pl * out_plane : nullptr;
      if constexpr (kIsLowPrecision<T>) {
        WidenSpan<T>(dy + pl * out_plane, out_plane, wide_dy.data());
        BackwardPlane<A>(wide_dy.data(), wide_dx.data(), argp, g);
        NarrowSpan<T>(wide_dx.data(), in_plane, dx + pl * in_plane);
      } else {
        BackwardPlane<T>(dy + pl * out_plane, dx + pl * in_plane, argp, g);
      }
    }
  });
}

kernels::PoolShape PoolingLayer::BodyShape(bool channels_last) const {
  kernels::PoolShape s;
  s.channels = channels_;
  s.height = height_;
  s.width = width_;
  s.out_h = out_h_;
  s.out_w = out_w_;
  s.kernel_h = kh_, s.kernel_w = kw_, s.stride_h = sh_, s.stride_w = sw_;
  s.pad_h = ph_, s.pad_w = pw_;
  s.channels_last = channels_last;
  s.count_include_pad = count_include_pad_;
  return s;
}

template <class E>
void PoolingLayer::ForwardDevice(const Tensor& x, Tensor& y) {
  const kernels::PoolShape s = BodyShape(x.channels_last());
  const auto* xp = StoredData<E>(x);
  auto* yp = StoredData<E>(y);
  const std::string what = Describe() + " forward";
  if (is_max_) {
    RunIndexed(what.c_str(), {x, y, argmax_}, y.numel(),
               kernels::MaxPoolForward<E>{s, xp, yp, argmax_.device_data<int32_t>()});
  } else if (global_) {
    RunIndexed(what.c_str(), {x, y}, y.numel(), kernels::GlobalAvgPoolForward<E>{s, xp, yp});
  } else {
    RunIndexed(what.c_str(), {x, y}, y.numel(), kernels::AvgPoolForward<E>{s, xp, yp});
  }
}

template <class E>
void PoolingLayer::BackwardDevice(const Tensor& dy, Tensor& dx) {
  const kernels::PoolShape s = BodyShape(dx.channels_last());
  const auto* dyp = StoredData<E>(dy);
  auto* dxp = StoredData<E>(dx);
  const std::string what = Describe() + " backward";
  if (is_max_) {
    RunIndexed(what.c_str(), {dy, argmax_, dx}, dx.numel(),
               kernels::MaxPoolBackward<E>{s, dyp, argmax_.device_data<int32_t>(), dxp});
  } else if (global_) {
    RunIndexed(what.c_str(), {dy, dx}, dx.numel(), kernels::GlobalAvgPoolBackward<E>{s, dyp, dxp});
  } else {
    RunIndexed(what.c_str(), {dy, dx}, dx.numel(), kernels::AvgPoolBackward<E>{s, dyp, dxp});
  }
}

void PoolingLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  WithElementCodes(*this, bottom[0]->data.dtype(), [&](auto codes) {
    ForwardDevice<decltype(codes)>(bottom[0]->data, top[0]->data);
  });
}

void PoolingLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                    const Blobs& bottom) {
  if (!propagate_down[0]) return;
  WithElementCodes(*this, bottom[0]->data.dtype(), [&](auto codes) {
    BackwardDevice<decltype(codes)>(top[0]->grad, bottom[0]->grad);
  });
}

template class TypedLayer<PoolingLayer, AllFloatTypes, KernelArgs::kOneInput>;

CORTADO_REGISTER_LAYER(Pooling, PoolingLayer);

}  // namespace cortado
