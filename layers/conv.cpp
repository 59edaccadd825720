#include "layers/conv.h"

#include <algorithm>
#include <cstring>

#include "engine/math.h"
#include "engine/random.h"
#include "engine/thread_pool.h"
#include "layers/layer_util.h"

namespace cortado {
namespace {

// A GEMM this wide (output columns) runs close to the BLAS kernel's peak; narrower outputs
// (e.g. 7x7 = 49 positions) are batched over several images up to this width.
constexpr int64_t kTargetColumns = 512;
constexpr int64_t kMaxBlockImages = 32;

// Output positions o in [0, out) whose input coordinate o + offset lies in [0, size): the
// half-open range [*lo, *hi).
inline void ValidRange(int64_t offset, int64_t size, int64_t out, int64_t* lo, int64_t* hi) {
  const int64_t l = std::clamp<int64_t>(-offset, 0, out);
  *lo = l;
  *hi = std::clamp<int64_t>(size - offset, l, out);
}

// Strided convolutions run on phase planes: the input split by the remainders of its
// coordinates modulo the stride, x (C, H, W) -> xq (C, sh, sw, Hq, Wq) with
// xq[c][rh][rw][i][j] = x[c][i sh + rh][j sw + rw] (zero past the edge), Hq = ceil(H / sh).
// Each tap reads a single phase plane at stride 1, so im2col copies contiguous runs of the
// small split input instead of gathering every element of the 9x larger column matrix one by
// one. With stride 1 there is one phase and it is the input itself (no copy).
inline int64_t PhaseRows(const ConvGeometry& g) { return (g.h + g.sh - 1) / g.sh; }
inline int64_t PhaseCols(const ConvGeometry& g) { return (g.w + g.sw - 1) / g.sw; }
inline bool IsStrided(const ConvGeometry& g) { return g.sh > 1 || g.sw > 1; }

// Tap k (dilation dil, padding pad) reads input coordinate o stride + k dil - pad =
// (o + q) stride + r: phase r at offset q (floor division, so 0 <= r < stride).
inline void TapPhase(int64_t k, int64_t dil, int64_t pad, int64_t stride, int64_t* q, int64_t* r) {
  const int64_t e = k * dil - pad;
  *q = e >= 0 ? e / stride : -((-e + stride - 1) / stride);
  *r = e - *q * stride;
}

// dst[j] = src[j stride] for j in [0, n). Stride 2 (the common case) gets a loop the compiler
// can vectorize with its constant stride.
template <typename T>
void GatherStrided(const T* __restrict src, int64_t stride, T* __restrict dst, int64_t n) {
  if (stride == 2) {
    for (int64_t j = 0; j < n; ++j) dst[j] = src[2 * j];
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = src[j * stride];
  }
}

// dst[j stride] = src[j] for j in [0, n) (the inverse of GatherStrided).
template <typename T>
void ScatterStrided(const T* __restrict src, int64_t stride, T* __restrict dst, int64_t n) {
  if (stride == 2) {
    for (int64_t j = 0; j < n; ++j) dst[2 * j] = src[j];
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j * stride] = src[j];
  }
}

// Whether some tap of a kernel of size k reads phase r.
inline bool PhaseUsed(int64_t k, int64_t dil, int64_t pad, int64_t stride, int64_t r) {
  for (int64_t i = 0; i < k; ++i) {
    int64_t q, ri;
    TapPhase(i, dil, pad, stride, &q, &ri);
    if (ri == r) return true;
  }
  return false;
}

// x: (C, H, W) -> xq: (C, sh, sw, Hq, Wq). Phases that no tap reads (3 of 4 for a 1x1 kernel
// at stride 2) are left unwritten.
template <typename T>
void SplitPhases(const T* x, const ConvGeometry& g, T* xq) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g);
  for (int64_t rh = 0; rh < g.sh; ++rh) {
    if (!PhaseUsed(g.kh, g.dh, g.ph, g.sh, rh)) continue;
    for (int64_t rw = 0; rw < g.sw; ++rw) {
      if (!PhaseUsed(g.kw, g.dw, g.pw, g.sw, rw)) continue;
      const int64_t jn = rw < g.w ? (g.w - rw + g.sw - 1) / g.sw : 0;  // columns inside
      for (int64_t c = 0; c < g.c; ++c) {
        T* dst = xq + ((c * g.sh + rh) * g.sw + rw) * hq * wq;
        for (int64_t i = 0; i < hq; ++i) {
          T* d = dst + i * wq;
          const int64_t ih = i * g.sh + rh;
          if (ih >= g.h) {
            std::fill(d, d + wq, T(0));
            continue;
          }
          GatherStrided(x + (c * g.h + ih) * g.w + rw, g.sw, d, jn);
          std::fill(d + jn, d + wq, T(0));
        }
      }
    }
  }
}

// The adjoint of SplitPhases: dxq (C, sh, sw, Hq, Wq) -> dx (C, H, W). Every input position
// lies in exactly one phase, so dx is overwritten, not accumulated; positions in phases that
// no tap reads get zero.
template <typename T>
void MergePhases(const T* dxq, const ConvGeometry& g, T* dx) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g);
  bool all_used = true;
  for (int64_t rh = 0; rh < g.sh; ++rh) all_used &= PhaseUsed(g.kh, g.dh, g.ph, g.sh, rh);
  for (int64_t rw = 0; rw < g.sw; ++rw) all_used &= PhaseUsed(g.kw, g.dw, g.pw, g.sw, rw);
  if (!all_used) std::fill(dx, dx + g.c * g.h * g.w, T(0));
  for (int64_t rh = 0; rh < g.sh; ++rh) {
    if (!PhaseUsed(g.kh, g.dh, g.ph, g.sh, rh)) continue;
    for (int64_t rw = 0; rw < g.sw; ++rw) {
      if (!PhaseUsed(g.kw, g.dw, g.pw, g.sw, rw)) continue;
      const int64_t jn = rw < g.w ? (g.w - rw + g.sw - 1) / g.sw : 0;
      for (int64_t c = 0; c < g.c; ++c) {
        const T* src = dxq + ((c * g.sh + rh) * g.sw + rw) * hq * wq;
        for (int64_t i = 0; i < hq && i * g.sh + rh < g.h; ++i) {
          ScatterStrided(src + i * wq, g.sw, dx + (c * g.h + i * g.sh + rh) * g.w + rw, jn);
        }
      }
    }
  }
}

// Zeroes columns [0, ow_lo) and [ow_hi, ow_n) of rows [oh_lo, oh_hi) of a (rows, ow_n) block.
// Column-major on purpose: the runs are only `pad` long, and a row-wise loop would be turned
// into one memset call per row.
template <typename T>
void ZeroColumns(T* block, int64_t ow_n, int64_t oh_lo, int64_t oh_hi, int64_t ow_lo,
                 int64_t ow_hi) {
  for (int64_t ow = 0; ow < ow_lo; ++ow) {
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) block[oh * ow_n + ow] = T(0);
  }
  for (int64_t ow = ow_hi; ow < ow_n; ++ow) {
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) block[oh * ow_n + ow] = T(0);
  }
}

// xq: phase planes (C, sh, sw, Hq, Wq) (the input itself at stride 1) -> col rows
// (C, kh, kw), each row `ld` apart holding the (oh, ow) positions.
template <typename T>
void Im2Col(const T* xq, const ConvGeometry& g, T* col, int64_t ld) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g), plane = hq * wq;
  // As many output columns as phase columns (e.g. 3x3 pad 1 at stride 1 or 2): each column
  // row is the plane shifted by one offset, so one bulk copy plus zeroing the few padded
  // columns of each output row.
  const bool shift = wq == g.ow;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      int64_t qh, rh, oh_lo, oh_hi;
      TapPhase(ki, g.dh, g.ph, g.sh, &qh, &rh);
      ValidRange(qh, hq, g.oh, &oh_lo, &oh_hi);
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* dst = col + ((c * g.kh + ki) * g.kw + kj) * ld;
        int64_t qw, rw, ow_lo, ow_hi;
        TapPhase(kj, g.dw, g.pw, g.sw, &qw, &rw);
        ValidRange(qw, wq, g.ow, &ow_lo, &ow_hi);
        const T* xc = xq + ((c * g.sh + rh) * g.sw + rw) * plane;
        std::fill(dst, dst + oh_lo * g.ow, T(0));
        std::fill(dst + oh_hi * g.ow, dst + g.oh * g.ow, T(0));
        if (oh_lo >= oh_hi) continue;
        if (shift) {
          // dst[p] = xc[p + delta] for every valid p; the copy is clipped to the plane, and
          // what it leaves or over-copies lies in padded columns, zeroed next.
          const int64_t delta = qh * wq + qw;
          const int64_t s0 = std::max<int64_t>(oh_lo * wq + delta, 0);
          const int64_t s1 = std::min<int64_t>(oh_hi * wq + delta, plane);
          if (s1 > s0) std::memcpy(dst + s0 - delta, xc + s0, sizeof(T) * (s1 - s0));
          ZeroColumns(dst, g.ow, oh_lo, oh_hi, ow_lo, ow_hi);
          continue;
        }
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* d = dst + oh * g.ow;
          const T* s = xc + (oh + qh) * wq + qw;
          std::fill(d, d + ow_lo, T(0));
          std::memcpy(d + ow_lo, s + ow_lo, sizeof(T) * (ow_hi - ow_lo));
          std::fill(d + ow_hi, d + g.ow, T(0));
        }
      }
    }
  }
}

template <typename T>
void AddKernel(const T* __restrict src, T* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// The adjoint of Im2Col: adds every column entry back to the phase-plane position it came
// from. dxq: (C, sh, sw, Hq, Wq), zeroed here first. In the shift case the entries of padded
// positions in `col` are overwritten with zeros (the caller's scratch buffer), so that each
// column row is added back in one pass.
template <typename T>
void Col2Im(T* col, int64_t ld, const ConvGeometry& g, T* dxq) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g), plane = hq * wq;
  const bool shift = wq == g.ow;
  std::fill(dxq, dxq + g.c * g.sh * g.sw * plane, T(0));
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      int64_t qh, rh, oh_lo, oh_hi;
      TapPhase(ki, g.dh, g.ph, g.sh, &qh, &rh);
      ValidRange(qh, hq, g.oh, &oh_lo, &oh_hi);
      if (oh_lo >= oh_hi) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* src = col + ((c * g.kh + ki) * g.kw + kj) * ld;
        int64_t qw, rw, ow_lo, ow_hi;
        TapPhase(kj, g.dw, g.pw, g.sw, &qw, &rw);
        ValidRange(qw, wq, g.ow, &ow_lo, &ow_hi);
        T* xc = dxq + ((c * g.sh + rh) * g.sw + rw) * plane;
        if (shift) {
          ZeroColumns(src, g.ow, oh_lo, oh_hi, ow_lo, ow_hi);
          const int64_t delta = qh * wq + qw;
          const int64_t s0 = std::max<int64_t>(oh_lo * wq + delta, 0);
          const int64_t s1 = std::min<int64_t>(oh_hi * wq + delta, plane);
          if (s1 > s0) AddKernel(src + s0 - delta, xc + s0, s1 - s0);
          continue;
        }
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          AddKernel(src + oh * g.ow + ow_lo, xc + (oh + qh) * wq + qw + ow_lo, ow_hi - ow_lo);
        }
      }
    }
  }
}

// Im2Col of one image x (C, H, W); a strided convolution splits it into xq first.
template <typename T>
void ImageToColumns(const T* x, const ConvGeometry& g, T* xq, T* col, int64_t ld) {
  if (IsStrided(g)) {
    SplitPhases(x, g, xq);
    x = xq;
  }
  Im2Col(x, g, col, ld);
}

// Col2Im into one image's gradient dx (C, H, W), through the phase buffer dxq when strided.
template <typename T>
void ColumnsToImage(T* col, int64_t ld, const ConvGeometry& g, T* dxq, T* dx) {
  if (!IsStrided(g)) return Col2Im(col, ld, g, dx);
  Col2Im(col, ld, g, dxq);
  MergePhases(dxq, g, dx);
}

// Elements of one image's phase planes (none are needed at stride 1).
inline int64_t PhaseSize(const ConvGeometry& g) {
  return IsStrided(g) ? g.c * g.sh * g.sw * PhaseRows(g) * PhaseCols(g) : 0;
}

}  // namespace

void ConvolutionLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  num_output_ = settings().GetInt("num_output");
  if (!settings().Has("kernel")) Fail(Describe(), ": missing required key 'kernel'");
  const std::vector<int64_t> kernel = settings().GetPair("kernel", 0);
  const std::vector<int64_t> stride = settings().GetPair("stride", 1);
  const std::vector<int64_t> pad = settings().GetPair("pad", 0);
  const std::vector<int64_t> dilation = settings().GetPair("dilation", 1);
  groups_ = settings().GetInt("groups", 1);
  has_bias_ = settings().GetBool("bias", true);
  const InitSpec init = ParseInit(*this, settings());
  kernel_h_ = kernel[0], kernel_w_ = kernel[1];
  stride_h_ = stride[0], stride_w_ = stride[1];
  pad_h_ = pad[0], pad_w_ = pad[1];
  dilation_h_ = dilation[0], dilation_w_ = dilation[1];
  if (num_output_ <= 0) Fail(Describe(), ": key 'num_output' must be positive, got ", num_output_);
  if (kernel_h_ <= 0 || kernel_w_ <= 0) Fail(Describe(), ": key 'kernel' must be positive");
  if (stride_h_ <= 0 || stride_w_ <= 0) Fail(Describe(), ": key 'stride' must be positive");
  if (pad_h_ < 0 || pad_w_ < 0) Fail(Describe(), ": key 'pad' must not be negative");
  if (dilation_h_ <= 0 || dilation_w_ <= 0) Fail(Describe(), ": key 'dilation' must be positive");
  if (groups_ <= 0) Fail(Describe(), ": key 'groups' must be positive, got ", groups_);

  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  if (x.ndim() != 4) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be 4-d (N, C, H, W), got ",
         x.ToString());
  }
  channels_ = x.dim(1);
  if (channels_ % groups_ != 0 || num_output_ % groups_ != 0) {
    Fail(Describe(), ": groups (", groups_, ") must divide both the input channels (", channels_,
         ") and num_output (", num_output_, ")");
  }
  is_1x1_ = kernel_h_ == 1 && kernel_w_ == 1 && stride_h_ == 1 && stride_w_ == 1 && pad_h_ == 0 &&
            pad_w_ == 0;
  AddParam("weight", {num_output_, channels_ / groups_, kernel_h_, kernel_w_}, x.dtype(),
           ParamKind::kWeight);
  if (has_bias_) AddParam("bias", {num_output_}, x.dtype(), ParamKind::kBias);
  const int64_t receptive = kernel_h_ * kernel_w_;
  Rng rng(InitSeed());
  InitWeights(init, /*fan_in=*/channels_ / groups_ * receptive,
              /*fan_out=*/num_output_ * receptive, rng, params_[0].value,
              has_bias_ ? &params_[1].value : nullptr);
}

double ConvolutionLayer::ForwardFlops() const {
  return 2.0 * static_cast<double>(batch_) * static_cast<double>(num_output_) *
         static_cast<double>(channels_ / groups_) * static_cast<double>(kernel_h_ * kernel_w_) *
         static_cast<double>(geo_.oh * geo_.ow);
}

void ConvolutionLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  CheckParamDType(*this, MasterDType(x.dtype()));
  if (x.ndim() != 4 || x.dim(1) != channels_) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be (N, ", channels_, ", H, W), got ",
         x.ToString());
  }
  const int64_t h = x.dim(2), w = x.dim(3);
  batch_ = x.dim(0);
  const int64_t oh = (h + 2 * pad_h_ - dilation_h_ * (kernel_h_ - 1) - 1) / stride_h_ + 1;
  const int64_t ow = (w + 2 * pad_w_ - dilation_w_ * (kernel_w_ - 1) - 1) / stride_w_ + 1;
  if (h + 2 * pad_h_ < dilation_h_ * (kernel_h_ - 1) + 1 ||
      w + 2 * pad_w_ < dilation_w_ * (kernel_w_ - 1) + 1) {
    Fail(Describe(), ": input ", x.ToString(), " is smaller than the (dilated) kernel ", kernel_h_,
         "x", kernel_w_, " plus padding; the output would be empty");
  }
  geo_ = ConvGeometry{channels_, h,         w,      oh,     ow,          kernel_h_,  kernel_w_,
                      stride_h_, stride_w_, pad_h_, pad_w_, dilation_h_, dilation_w_};
  const int64_t positions = oh * ow;
  block_ = std::clamp<int64_t>((kTargetColumns + positions - 1) / positions, 1, kMaxBlockImages);
  top[0]->data.Resize({x.dim(0), num_output_, oh, ow}, x.dtype());
}

std::vector<Tensor>& ConvolutionLayer::Workspaces(Scratch kind) {
  static_assert(kScratchKinds <= ScratchSpace::kKinds);
  ScratchSpace* shared = context().scratch;
  return shared != nullptr ? shared->Buffers(kind) : own_workspaces_[kind];
}

template <typename T>
T* ConvolutionLayer::Workspace(std::vector<Tensor>& pool, int thread, int64_t elements) {
  Tensor& t = pool[thread];
  if (t.dtype() != DTypeOf<T>::value || t.numel() < elements) {
    t.Resize({std::max<int64_t>(elements, 1)}, DTypeOf<T>::value);
  }
  return t.data<T>();
}

template <typename T>
void ConvolutionLayer::ForwardT(const Tensor& xt, Tensor& yt) {
  const ConvGeometry& g = geo_;
  const int64_t n = xt.dim(0);
  const int64_t in_size = g.c * g.h * g.w;
  const int64_t p = g.oh * g.ow;
  const int64_t cout = num_output_, cog = num_output_ / groups_;
  const int64_t kg = g.c / groups_ * g.kh * g.kw;  // column rows per group
  const int64_t k = kg * groups_;
  const T* x = xt.data<T>();                // bottom: (N, C_in, H, W)
  T* y = yt.data<T>();                      // top: (N, C_out, H_out, W_out)
  const T* w = params_[0].value.data<T>();  // weight: (C_out, C_in/g, kh, kw)
  const T* bias = has_bias_ ? params_[1].value.data<T>() : nullptr;  // (C_out)
  if (n == 0) return;

  const int tasks = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  const int64_t block = block_;
  // Size every thread's workspace here, outside the parallel region (a no-op after the first
  // call at a given shape).
  std::vector<Tensor>& col_ws = Workspaces(kColumns);
  std::vector<Tensor>& out_ws = Workspaces(kOutputs);
  std::vector<Tensor>& phase_ws = Workspaces(kPhases);
  for (auto* pool : {&col_ws, &out_ws, &phase_ws}) {
    if (static_cast<int>(pool->size()) < tasks) pool->resize(tasks);
  }
  for (int t = 0; t < tasks; ++t) {
    Workspace<T>(col_ws, t, k * block * p);
    if (block > 1) Workspace<T>(out_ws, t, cout * block * p);
    Workspace<T>(phase_ws, t, PhaseSize(g));
  }

  ParallelTasks(tasks, [&](int t) {
    const int64_t begin = n * t / tasks, end = n * (t + 1) / tasks;
    T* col = col_ws[t].data<T>();
    T* xq = phase_ws[t].data<T>();  // one image's phase planes: (C_in, sh, sw, Hq, Wq)
    for (int64_t n0 = begin; n0 < end; n0 += block) {
      const int64_t nb = std::min(block, end - n0);
      const int64_t cols = nb * p;
      const T* colp = col;
      if (is_1x1_ && nb == 1) {
        colp = x + n0 * in_size;  // the input is its own column matrix
      } else {
        for (int64_t b = 0; b < nb; ++b) {
          ImageToColumns(x + (n0 + b) * in_size, g, xq, col + b * p, cols);
        }
      }
      if (nb == 1) {
        T* yn = y + n0 * cout * p;
        if (bias != nullptr) {
          for (int64_t co = 0; co < cout; ++co) std::fill(yn + co * p, yn + (co + 1) * p, bias[co]);
        }
        const T beta = bias != nullptr ? T(1) : T(0);
        for (int64_t gi = 0; gi < groups_; ++gi) {
          GemmLd<T>(false, false, cog, p, kg, T(1), w + gi * cog * kg, kg, colp + gi * kg * p, p,
                    beta, yn + gi * cog * p, p);
        }
      } else {
        T* out = out_ws[t].data<T>();  // (C_out, nb * P)
        for (int64_t gi = 0; gi < groups_; ++gi) {
          GemmLd<T>(false, false, cog, cols, kg, T(1), w + gi * cog * kg, kg, colp + gi * kg * cols,
                    cols, T(0), out + gi * cog * cols, cols);
        }
        for (int64_t b = 0; b < nb; ++b) {
          T* yn = y + (n0 + b) * cout * p;
          for (int64_t co = 0; co < cout; ++co) {
            const T* src = out + co * cols + b * p;
            T* dst = yn + co * p;
            if (bias != nullptr) {
              const T bv = bias[co];
              for (int64_t i = 0; i < p; ++i) dst[i] = src[i] + bv;
            } else {
              std::memcpy(dst, src, sizeof(T) * p);
            }
          }
        }
      }
    }
  });
}

template <typename T>
void ConvolutionLayer::BackwardT(const Tensor& xt, const Tensor& dyt, bool propagate, Tensor* dxt) {
  const ConvGeometry& g = geo_;
  const int64_t n = xt.dim(0);
  const int64_t in_size = g.c * g.h * g.w;
  const int64_t p = g.oh * g.ow;
  const int64_t cout = num_output_, cog = num_output_ / groups_;
  const int64_t kg = g.c / groups_ * g.kh * g.kw;
  const int64_t k = kg * groups_;
  const int64_t w_size = cout * kg;
  const T* x = xt.data<T>();                     // bottom: (N, C_in, H, W)
  const T* dy = dyt.data<T>();                   // top grad: (N, C_out, H_out, W_out)
  T* dx = propagate ? dxt->data<T>() : nullptr;  // bottom grad: (N, C_in, H, W)
  const T* w = params_[0].value.data<T>();
  T* dw = params_[0].grad.data<T>();
  T* db = has_bias_ ? params_[1].grad.data<T>() : nullptr;
  if (n == 0) {
    std::fill(dw, dw + w_size, T(0));
    if (db != nullptr) std::fill(db, db + cout, T(0));
    return;
  }

  const int tasks = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  const int64_t block = block_;
  std::vector<Tensor>& col_ws = Workspaces(kColumns);
  std::vector<Tensor>& out_ws = Workspaces(kOutputs);
  std::vector<Tensor>& phase_ws = Workspaces(kPhases);
  std::vector<Tensor>& dw_ws = Workspaces(kWeightGrads);
  std::vector<Tensor>& db_ws = Workspaces(kBiasGrads);
  for (auto* pool : {&col_ws, &out_ws, &phase_ws, &dw_ws, &db_ws}) {
    if (static_cast<int>(pool->size()) < tasks) pool->resize(tasks);
  }
  for (int t = 0; t < tasks; ++t) {
    Workspace<T>(col_ws, t, k * block * p);
    if (block > 1) Workspace<T>(out_ws, t, cout * block * p);
    Workspace<T>(phase_ws, t, PhaseSize(g));
    Workspace<T>(dw_ws, t, w_size);
    Workspace<T>(db_ws, t, cout);
  }

  ParallelTasks(tasks, [&](int t) {
    const int64_t begin = n * t / tasks, end = n * (t + 1) / tasks;
    T* col = col_ws[t].data<T>();
    T* xq = phase_ws[t].data<T>();  // one image's phase planes (or their gradient)
    T* dwt = dw_ws[t].data<T>();    // this thread's weight-gradient partial: (C_out, kg)
    T* dbt = db_ws[t].data<T>();    // (C_out)
    std::fill(dbt, dbt + cout, T(0));
    bool first = true;
    for (int64_t n0 = begin; n0 < end; n0 += block) {
      const int64_t nb = std::min(block, end - n0);
      const int64_t cols = nb * p;
      const T* colp = col;
      if (is_1x1_ && nb == 1) {
        colp = x + n0 * in_size;
      } else {
        for (int64_t b = 0; b < nb; ++b) {
          ImageToColumns(x + (n0 + b) * in_size, g, xq, col + b * p, cols);
        }
      }
      // The top gradient of this block as a (C_out, nb * P) matrix.
      const T* dyb = dy + n0 * cout * p;
      if (nb > 1) {
        T* gathered = out_ws[t].data<T>();
        for (int64_t b = 0; b < nb; ++b) {
          for (int64_t co = 0; co < cout; ++co) {
            std::memcpy(gathered + co * cols + b * p, dy + ((n0 + b) * cout + co) * p,
                        sizeof(T) * p);
          }
        }
        dyb = gathered;
      }
      if (db != nullptr) {
        for (int64_t co = 0; co < cout; ++co) {
          const T* row = dyb + co * cols;
          T s = T(0);
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < cols; ++i) s += row[i];
          dbt[co] += s;
        }
      }
      // dW_g (C_out/g, kg) += dY_g (C_out/g, cols) * col_g^T (cols, kg)
      for (int64_t gi = 0; gi < groups_; ++gi) {
        GemmLd<T>(false, true, cog, kg, cols, T(1), dyb + gi * cog * cols, cols,
                  colp + gi * kg * cols, cols, first ? T(0) : T(1), dwt + gi * cog * kg, kg);
      }
      first = false;
      if (!propagate) continue;
      if (is_1x1_ && nb == 1) {
        // dX_g (kg, P) = W_g^T (kg, C_out/g) * dY_g (C_out/g, P), written in place.
        T* dxn = dx + n0 * in_size;
        for (int64_t gi = 0; gi < groups_; ++gi) {
          GemmLd<T>(true, false, kg, p, cog, T(1), w + gi * cog * kg, kg, dyb + gi * cog * p, p,
                    T(0), dxn + gi * kg * p, p);
        }
        continue;
      }
      // The columns are no longer needed: reuse their buffer for dcol.
      T* dcol = col;
      for (int64_t gi = 0; gi < groups_; ++gi) {
        GemmLd<T>(true, false, kg, cols, cog, T(1), w + gi * cog * kg, kg, dyb + gi * cog * cols,
                  cols, T(0), dcol + gi * kg * cols, cols);
      }
      for (int64_t b = 0; b < nb; ++b) {
        ColumnsToImage(dcol + b * p, cols, g, xq, dx + (n0 + b) * in_size);
      }
    }
  });

  // Sum the per-thread partials in thread order (deterministic for a given thread count).
  const T* dw0 = dw_ws[0].data<T>();
  std::copy(dw0, dw0 + w_size, dw);
  for (int t = 1; t < tasks; ++t) AddKernel(dw_ws[t].data<T>(), dw, w_size);
  if (db != nullptr) {
    const T* db0 = db_ws[0].data<T>();
    std::copy(db0, db0 + cout, db);
    for (int t = 1; t < tasks; ++t) AddKernel(db_ws[t].data<T>(), db, cout);
  }
}

void ConvolutionLayer::ForwardF32(const Blobs& bottom, const Blobs& top) {
  ForwardT<float>(bottom[0]->data, top[0]->data);
}
void ConvolutionLayer::ForwardF64(const Blobs& bottom, const Blobs& top) {
  ForwardT<double>(bottom[0]->data, top[0]->data);
}
void ConvolutionLayer::BackwardF32(const Blobs& top, const std::vector<bool>& propagate_down,
                                   const Blobs& bottom) {
  BackwardT<float>(bottom[0]->data, top[0]->grad, propagate_down[0], &bottom[0]->grad);
}
void ConvolutionLayer::BackwardF64(const Blobs& top, const std::vector<bool>& propagate_down,
                                   const Blobs& bottom) {
  BackwardT<double>(bottom[0]->data, top[0]->grad, propagate_down[0], &bottom[0]->grad);
}

CORTADO_REGISTER_LAYER(Convolution, ConvolutionLayer);

}  // namespace cortado
