#include "layers/conv.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine/base/log.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/math.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/batch_norm.h"
#include "layers/device_staging.h"
#include "layers/layer_util.h"
#include "layers/relu.h"

namespace cortado {
using im2col::AddKernel;  // the data-movement kernels of layers/im2col.h
using im2col::Col2Im;
using im2col::ColumnsToImage;
using im2col::Im2Col;
using im2col::ImageToColumns;
using im2col::IsStrided;
using im2col::PhaseSize;
using im2col::RowBand;

namespace {

// A GEMM this wide (output columns) runs close to the BLAS kernel's peak; narrower outputs
// (e.g. 7x7 = 49 positions) are batched over several images up to this width.
constexpr int64_t kTargetColumns = 512;
constexpr int64_t kMaxBlockImages = 32;

std::atomic<int64_t> g_column_budget{int64_t{4} << 20};

}  // namespace

int64_t ConvolutionLayer::column_budget() { return g_column_budget.load(); }
void ConvolutionLayer::SetColumnBudgetForTesting(int64_t elements) {
  g_column_budget.store(std::max<int64_t>(elements, 1));
}

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
  band_rows_ = oh;
  const int64_t rows = channels_ * kernel_h_ * kernel_w_;  // of the column matrix
  if (block_ == 1 && !is_1x1_ && !IsStrided(geo_) && rows * positions > column_budget()) {
    // At the default budget a band is thousands of columns wide (a full-width GEMM) for any
    // column matrix of fewer than 8192 rows.
    band_rows_ = std::clamp<int64_t>(column_budget() / (rows * ow), 1, oh);
  }
  top[0]->data.Resize({x.dim(0), num_output_, oh, ow}, x.dtype());
  top[0]->data.set_format(x.format());
  nhwc_ = x.channels_last();
  if (x.channels_last()) PrepareFast(x.dtype());
}

void ConvolutionLayer::PrepareFast(DType dtype) {
  const ConvShape shape{channels_,   geo_.h,      geo_.w,    num_output_,
                        geo_.oh,     geo_.ow,     kernel_h_, kernel_w_,
                        stride_h_,   stride_w_,   pad_h_,    pad_w_,
                        dilation_h_, dilation_w_, groups_,   has_bias_ || folded_bn_ != nullptr};
  if (fast_tried_ && shape == fast_shape_ && dtype == fast_dtype_) return;
  fast_tried_ = true;
  fast_shape_ = shape;
  fast_dtype_ = dtype;
  if (!fast_) fast_ = std::make_unique<ChannelsLastConv>();
  const bool train = !context().inference;
  const int64_t images = (batch_ + NumThreads() - 1) / NumThreads();
  fast_ready_ =
      fast_->Prepare(shape, dtype, images, train, relu_post_, /*keep_weights=*/!train, &fast_why_);
  if (fast_ready_) return;
  // f64 is the gradient checks' reference dtype: expected there, not news.
  const std::string line = StrCat(Describe(),
                                  ": channels-last input runs the im2col path on "
                                  "NCHW copies (",
                                  fast_why_, ")");
  if (dtype == DType::kF64) {
    LogDebug(line);
  } else {
    LogInfo(line);
  }
}

bool ConvolutionLayer::AbsorbNext(Layer& next) {
  if (!context().inference || !fast_ready_ || relu_post_) return false;
  if (auto* bn = dynamic_cast<BatchNormLayer*>(&next)) {
    if (folded_bn_ != nullptr || !bn->UsesRunningStatistics()) return false;
    folded_bn_ = bn;
    relu_post_ = bn->fused_relu();
  } else if (auto* relu = dynamic_cast<ReluLayer*>(&next)) {
    if (relu->negative_slope() != 0) return false;
    relu_post_ = true;
  } else {
    return false;
  }
  fast_tried_ = false;  // again, with the bias and the ReLU post-op
  PrepareFast(fast_dtype_);
  if (!fast_ready_) Fail(Describe(), ": could not fold the layer after it: ", fast_why_);
  return true;
}

std::string ConvolutionLayer::Note() const {
  std::string note;
  if (folded_bn_ != nullptr) note += StrCat("+", folded_bn_->name());
  if (relu_post_) note += "+ReLU";
  return note;
}

std::string ConvolutionLayer::KernelInfo() const {
  const Device device = params_.empty() ? Device::CPU() : params_[0].value.device();
  if (device.type == DeviceType::kCUDA) return "cuDNN";
  if (device.type == DeviceType::kTest) return "reference bodies (the test device has no cuDNN)";
  if (!fast_tried_) return "im2col";
  return fast_ready_ ? StrCat("oneDNN ", fast_->Describe())
                     : StrCat("im2col on NCHW copies (", fast_why_, ")");
}

ConvScratch ConvolutionLayer::FastScratch() {
  std::vector<Tensor>& weights = Workspaces(kFastWeights);
  if (weights.empty()) weights.resize(1);
  ConvScratch scratch;
  scratch.weights = &weights[0];
  scratch.partials = &Workspaces(kFastPartials);
  scratch.staging = &Workspaces(kFastStaging);
  return scratch;
}

template <typename T>
void ConvolutionLayer::ForwardChannelsLast(const Tensor& xt, Tensor& yt) {
  if (!fast_ready_) {
    // The reference path on NCHW copies (f64 gradient checks; geometries without a kernel).
    const Tensor xn = xt.Reordered(MemoryFormat::kNCHW);
    Tensor yn(yt.shape(), yt.dtype());
    ForwardT<T>(xn, yn);
    yt.ReorderFrom(yn);
    return;
  }
  if constexpr (std::is_same_v<Compute<T>, float>) {
    const float* w = params_[0].value.data<float>();  // (C_out, C_in / groups, kh, kw): the truth
    const float* bias = has_bias_ ? params_[1].value.data<float>() : nullptr;
    const float* scales = nullptr;
    const bool changed = weights_version_ != context().params_version;
    if (folded_bn_ != nullptr) {
      if (changed || fold_scale_.empty()) {
        // y = scale (conv(x) + b) + shift = conv_{w scale}(x) + (b scale + shift).
        std::vector<double> scale, shift;
        folded_bn_->InferenceAffine(&scale, &shift);
        fold_scale_.resize(num_output_);
        fold_bias_.resize(num_output_);
        for (int64_t o = 0; o < num_output_; ++o) {
          fold_scale_[o] = static_cast<float>(scale[o]);
          fold_bias_[o] =
              static_cast<float>((bias != nullptr ? bias[o] : 0.0) * scale[o] + shift[o]);
        }
      }
      scales = fold_scale_.data();
      bias = fold_bias_.data();
    }
    fast_->Forward(xt.dim(0), xt.raw_data(), w, scales, bias, yt.raw_data(), changed,
                   FastScratch());
    weights_version_ = context().params_version;
  } else {
    Fail(Describe(), ": no channels-last kernel for ", DTypeName(xt.dtype()));
  }
}

template <typename T>
void ConvolutionLayer::BackwardChannelsLast(const Tensor& xt, const Tensor& dyt, bool propagate,
                                            Tensor* dxt) {
  if (!fast_ready_) {
    const Tensor xn = xt.Reordered(MemoryFormat::kNCHW);
    const Tensor dyn = dyt.Reordered(MemoryFormat::kNCHW);
    Tensor dxn;
    if (propagate) dxn = Tensor(dxt->shape(), dxt->dtype());
    BackwardT<T>(xn, dyn, propagate, propagate ? &dxn : nullptr);
    if (propagate) dxt->ReorderFrom(dxn);
    return;
  }
  if constexpr (std::is_same_v<Compute<T>, float>) {
    const ConvScratch scratch = FastScratch();
    const int64_t n = xt.dim(0);
    fast_->BackwardWeights(n, xt.raw_data(), dyt.raw_data(), params_[0].grad.data<float>(),
                           has_bias_ ? params_[1].grad.data<float>() : nullptr, scratch);
    if (propagate) {
      fast_->BackwardData(n, dyt.raw_data(), params_[0].value.data<float>(), dxt->raw_data(),
                          scratch);
    }
  } else {
    Fail(Describe(), ": no channels-last kernel for ", DTypeName(xt.dtype()));
  }
}

std::vector<Tensor>& ConvolutionLayer::Workspaces(Scratch kind) {
  static_assert(kScratchKinds <= ScratchSpace::kKinds);
  ScratchSpace* shared = context().scratch;
  return shared != nullptr ? shared->Buffers(kind) : own_workspaces_[kind];
}

Tensor& ConvolutionLayer::WeightCopy() {
  ScratchSpace* shared = context().scratch;
  return shared != nullptr ? shared->LowPrecisionWeights() : own_weight_copy_;
}

template <typename T>
T* ConvolutionLayer::Workspace(std::vector<Tensor>& pool, int thread, int64_t elements) {
  Tensor& t = pool[thread];
  if (t.dtype() != DTypeOf<T>::value || t.numel() < elements) {
    t.Resize({std::max<int64_t>(elements, 1)}, DTypeOf<T>::value);
  }
  return t.data<T>();
}

// T is the storage type of activations and columns; A = Compute<T> is that of the GEMM
// results, the parameters and their gradients (T itself for f32 and f64; f32 for bf16 and f16,
// whose products accumulate in f32 and are rounded once when the output is stored).
template <typename T>
void ConvolutionLayer::ForwardT(const Tensor& xt, Tensor& yt) {
  if (xt.channels_last()) return ForwardChannelsLast<T>(xt, yt);
  using A = Compute<T>;
  constexpr bool lowp = kIsLowPrecision<T>;
  const ConvGeometry& g = geo_;
  const int64_t n = xt.dim(0);
  const int64_t in_size = g.c * g.h * g.w;
  const int64_t p = g.oh * g.ow;
  const int64_t cout = num_output_, cog = num_output_ / groups_;
  const int64_t kg = g.c / groups_ * g.kh * g.kw;  // column rows per group
  const int64_t k = kg * groups_;
  const T* x = xt.data<T>();  // bottom: (N, C_in, H, W)
  T* y = yt.data<T>();        // top: (N, C_out, H_out, W_out)
  // weight: (C_out, C_in/g, kh, kw), read in T
  const T* w =
      lowp ? LowPrecisionCopy<T>(params_[0].value, WeightCopy()) : params_[0].value.data<T>();
  const A* bias = has_bias_ ? params_[1].value.data<A>() : nullptr;  // (C_out)
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
  const bool banded = band_rows_ < g.oh;  // one image at a time, in bands of output rows
  const int64_t gemm_cols = banded ? band_rows_ * g.ow : block * p;
  for (int t = 0; t < tasks; ++t) {
    Workspace<T>(col_ws, t, k * gemm_cols);
    if (block > 1 || lowp) Workspace<A>(out_ws, t, cout * gemm_cols);
    Workspace<T>(phase_ws, t, PhaseSize(g));
  }

  ParallelTasks(tasks, [&](int t) {
    const int64_t begin = n * t / tasks, end = n * (t + 1) / tasks;
    T* col = col_ws[t].data<T>();
    T* xq = phase_ws[t].data<T>();  // one image's phase planes: (C_in, sh, sw, Hq, Wq)
    if (banded) {
      for (int64_t n0 = begin; n0 < end; ++n0) {
        T* yn = y + n0 * cout * p;
        for (int64_t r0 = 0; r0 < g.oh; r0 += band_rows_) {
          const int64_t r1 = std::min(r0 + band_rows_, g.oh);
          const int64_t cols = (r1 - r0) * g.ow, at = r0 * g.ow;  // the band's positions
          Im2Col(x + n0 * in_size, RowBand(g, r0, r1), col, cols);
          if constexpr (!lowp) {
            // The GEMM writes the band's columns of the output in place (rows p apart).
            if (bias != nullptr) {
              for (int64_t co = 0; co < cout; ++co) {
                std::fill(yn + co * p + at, yn + co * p + at + cols, bias[co]);
              }
            }
            const T beta = bias != nullptr ? T(1) : T(0);
            for (int64_t gi = 0; gi < groups_; ++gi) {
              LayerGemm<T>(false, false, cog, cols, kg, w + gi * cog * kg, kg, col + gi * kg * cols,
                           cols, beta, yn + gi * cog * p + at, p);
            }
          } else {
            A* out = out_ws[t].data<A>();  // (C_out, cols)
            for (int64_t gi = 0; gi < groups_; ++gi) {
              LayerGemm<T>(false, false, cog, cols, kg, w + gi * cog * kg, kg, col + gi * kg * cols,
                           cols, A(0), out + gi * cog * cols, cols);
            }
            for (int64_t co = 0; co < cout; ++co) {
              A* src = out + co * cols;
              if (bias != nullptr) {
                const A bv = bias[co];
                for (int64_t i = 0; i < cols; ++i) src[i] += bv;
              }
              NarrowSpan<T>(src, cols, yn + co * p + at);
            }
          }
        }
      }
      return;
    }
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
      if constexpr (!lowp) {
        if (nb == 1) {
          // f32/f64 one image at a time: the GEMM writes the output in place.
          T* yn = y + n0 * cout * p;
          if (bias != nullptr) {
            for (int64_t co = 0; co < cout; ++co) {
              std::fill(yn + co * p, yn + (co + 1) * p, bias[co]);
            }
          }
          const T beta = bias != nullptr ? T(1) : T(0);
          for (int64_t gi = 0; gi < groups_; ++gi) {
            LayerGemm<T>(false, false, cog, p, kg, w + gi * cog * kg, kg, colp + gi * kg * p, p,
                         beta, yn + gi * cog * p, p);
          }
          continue;
        }
      }
      A* out = out_ws[t].data<A>();  // (C_out, nb * P)
      for (int64_t gi = 0; gi < groups_; ++gi) {
        LayerGemm<T>(false, false, cog, cols, kg, w + gi * cog * kg, kg, colp + gi * kg * cols,
                     cols, A(0), out + gi * cog * cols, cols);
      }
      for (int64_t b = 0; b < nb; ++b) {
        T* yn = y + (n0 + b) * cout * p;
        for (int64_t co = 0; co < cout; ++co) {
          A* src = out + co * cols + b * p;
          if (bias != nullptr) {
            const A bv = bias[co];
            for (int64_t i = 0; i < p; ++i) src[i] += bv;
          }
          NarrowSpan<T>(src, p, yn + co * p);
        }
      }
    }
  });
}

template <typename T>
void ConvolutionLayer::BackwardT(const Tensor& xt, const Tensor& dyt, bool propagate, Tensor* dxt) {
  if (xt.channels_last()) return BackwardChannelsLast<T>(xt, dyt, propagate, dxt);
  using A = Compute<T>;
  constexpr bool lowp = kIsLowPrecision<T>;
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
  const T* w = !propagate ? nullptr
               : lowp     ? LowPrecisionCopy<T>(params_[0].value, WeightCopy())
                          : params_[0].value.data<T>();
  A* dw = params_[0].grad.data<A>();
  A* db = has_bias_ ? params_[1].grad.data<A>() : nullptr;
  if (n == 0) {
    std::fill(dw, dw + w_size, A(0));
    if (db != nullptr) std::fill(db, db + cout, A(0));
    return;
  }

  const int tasks = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  const int64_t block = block_;
  std::vector<Tensor>& col_ws = Workspaces(kColumns);
  std::vector<Tensor>& gather_ws = Workspaces(kGathered);
  std::vector<Tensor>& phase_ws = Workspaces(kPhases);
  std::vector<Tensor>& dw_ws = Workspaces(kWeightGrads);
  std::vector<Tensor>& db_ws = Workspaces(kBiasGrads);
  std::vector<Tensor>& wide_col_ws = Workspaces(kWideColumns);
  std::vector<Tensor>& wide_image_ws = Workspaces(kWideImage);
  for (auto* pool :
       {&col_ws, &gather_ws, &phase_ws, &dw_ws, &db_ws, &wide_col_ws, &wide_image_ws}) {
    if (static_cast<int>(pool->size()) < tasks) pool->resize(tasks);
  }
  const bool banded = band_rows_ < g.oh;  // one image at a time, in bands of output rows
  const int64_t gemm_cols = banded ? band_rows_ * g.ow : block * p;
  for (int t = 0; t < tasks; ++t) {
    Workspace<T>(col_ws, t, k * gemm_cols);
    if (block > 1) Workspace<T>(gather_ws, t, cout * block * p);
    Workspace<T>(phase_ws, t, PhaseSize(g));
    Workspace<A>(dw_ws, t, w_size);
    Workspace<A>(db_ws, t, cout);
    if (lowp && propagate) {
      // The input gradient is summed in A: dcol, then the phase planes and the image.
      Workspace<A>(wide_col_ws, t, k * gemm_cols);
      Workspace<A>(wide_image_ws, t, PhaseSize(g) + in_size);
    }
  }

  ParallelTasks(tasks, [&](int t) {
    const int64_t begin = n * t / tasks, end = n * (t + 1) / tasks;
    T* col = col_ws[t].data<T>();
    T* xq = phase_ws[t].data<T>();  // one image's phase planes
    A* dwt = dw_ws[t].data<A>();    // this thread's weight-gradient partial: (C_out, kg)
    A* dbt = db_ws[t].data<A>();    // (C_out)
    std::fill(dbt, dbt + cout, A(0));
    bool first = true;
    if (banded) {
      for (int64_t n0 = begin; n0 < end; ++n0) {
        const T* dyn = dy + n0 * cout * p;
        // The input gradient is the sum of every band's columns added back (in A for 16-bit
        // storage, narrowed once at the end).
        A* dx_image = !propagate ? nullptr
                      : lowp     ? wide_image_ws[t].data<A>()
                                 : reinterpret_cast<A*>(dx + n0 * in_size);
        if (propagate) std::fill(dx_image, dx_image + in_size, A(0));
        for (int64_t r0 = 0; r0 < g.oh; r0 += band_rows_) {
          const int64_t r1 = std::min(r0 + band_rows_, g.oh);
          const int64_t cols = (r1 - r0) * g.ow, at = r0 * g.ow;
          const ConvGeometry band = RowBand(g, r0, r1);
          Im2Col(x + n0 * in_size, band, col, cols);
          if (db != nullptr) {
            for (int64_t co = 0; co < cout; ++co) {
              const T* row = dyn + co * p + at;
              A s = A(0);
#pragma omp simd reduction(+ : s)
              for (int64_t i = 0; i < cols; ++i) s += Widen(row[i]);
              dbt[co] += s;
            }
          }
          // dW_g += dY_g (C_out/g, band; rows p apart) * col_g^T
          for (int64_t gi = 0; gi < groups_; ++gi) {
            LayerGemm<T>(false, true, cog, kg, cols, dyn + gi * cog * p + at, p,
                         col + gi * kg * cols, cols, first ? A(0) : A(1), dwt + gi * cog * kg, kg);
          }
          first = false;
          if (!propagate) continue;
          A* dcol = lowp ? wide_col_ws[t].data<A>() : reinterpret_cast<A*>(col);
          for (int64_t gi = 0; gi < groups_; ++gi) {
            LayerGemm<T>(true, false, kg, cols, cog, w + gi * cog * kg, kg, dyn + gi * cog * p + at,
                         p, A(0), dcol + gi * kg * cols, cols);
          }
          Col2Im(dcol, cols, band, dx_image, /*accumulate=*/true);
        }
        if constexpr (lowp) {
          if (propagate) NarrowSpan<T>(dx_image, in_size, dx + n0 * in_size);
        }
      }
      return;
    }
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
        T* gathered = gather_ws[t].data<T>();
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
          A s = A(0);
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < cols; ++i) s += Widen(row[i]);
          dbt[co] += s;
        }
      }
      // dW_g (C_out/g, kg) += dY_g (C_out/g, cols) * col_g^T (cols, kg)
      for (int64_t gi = 0; gi < groups_; ++gi) {
        LayerGemm<T>(false, true, cog, kg, cols, dyb + gi * cog * cols, cols, colp + gi * kg * cols,
                     cols, first ? A(0) : A(1), dwt + gi * cog * kg, kg);
      }
      first = false;
      if (!propagate) continue;
      A* wide_image = lowp ? wide_image_ws[t].data<A>() : nullptr;
      if (is_1x1_ && nb == 1) {
        // dX_g (kg, P) = W_g^T (kg, C_out/g) * dY_g (C_out/g, P), written in place (through
        // an A image for 16-bit storage).
        T* dxn = dx + n0 * in_size;
        A* dst = lowp ? wide_image : reinterpret_cast<A*>(dxn);
        for (int64_t gi = 0; gi < groups_; ++gi) {
          LayerGemm<T>(true, false, kg, p, cog, w + gi * cog * kg, kg, dyb + gi * cog * p, p, A(0),
                       dst + gi * kg * p, p);
        }
        if constexpr (lowp) NarrowSpan<T>(wide_image, in_size, dxn);
        continue;
      }
      // dcol in A: for f32/f64 the columns' buffer, no longer needed, is reused.
      A* dcol = lowp ? wide_col_ws[t].data<A>() : reinterpret_cast<A*>(col);
      for (int64_t gi = 0; gi < groups_; ++gi) {
        LayerGemm<T>(true, false, kg, cols, cog, w + gi * cog * kg, kg, dyb + gi * cog * cols, cols,
                     A(0), dcol + gi * kg * cols, cols);
      }
      for (int64_t b = 0; b < nb; ++b) {
        if constexpr (lowp) {
          A* dx_image = wide_image + PhaseSize(g);
          ColumnsToImage(dcol + b * p, cols, g, wide_image, dx_image);
          NarrowSpan<T>(dx_image, in_size, dx + (n0 + b) * in_size);
        } else {
          ColumnsToImage(dcol + b * p, cols, g, xq, dx + (n0 + b) * in_size);
        }
      }
    }
  });

  // Sum the per-thread partials in thread order (deterministic for a given thread count).
  const A* dw0 = dw_ws[0].data<A>();
  std::copy(dw0, dw0 + w_size, dw);
  for (int t = 1; t < tasks; ++t) AddKernel(dw_ws[t].data<A>(), dw, w_size);
  if (db != nullptr) {
    const A* db0 = db_ws[0].data<A>();
    std::copy(db0, db0 + cout, db);
    for (int t = 1; t < tasks; ++t) AddKernel(db_ws[t].data<A>(), db, cout);
  }
}

ConvDims ConvolutionLayer::device_dims() const {
  return {.n = batch_,
          .c = channels_,
          .h = geo_.h,
          .w = geo_.w,
          .k = num_output_,
          .kh = kernel_h_,
          .kw = kernel_w_,
          .stride_h = stride_h_,
          .stride_w = stride_w_,
          .pad_h = pad_h_,
          .pad_w = pad_w_,
          .dilation_h = dilation_h_,
          .dilation_w = dilation_w_,
          .groups = groups_,
          .oh = geo_.oh,
          .ow = geo_.ow,
          .nhwc = nhwc_,
          .ohwi = nhwc_};
}

bool ConvolutionLayer::OwnDevicePath(const Tensor& x) const {
  // A folded batch norm would need its scaled weights: not on a device yet.
  if (folded_bn_ != nullptr || relu_post_) return false;
  if (x.dtype() == DType::kF64 && x.device().type == DeviceType::kCUDA) {
    Fail(Describe(), ": f64 on ", x.device().ToString(),
         ": cuDNN has no f64 convolutions (f64 runs on the CPU and the test device)");
  }
  return true;
}

void ConvolutionLayer::ConvOnDevice(ConvPassKind pass, const Tensor& x, const Tensor& w,
                                    const Tensor& y, const Tensor* bias) {
  const ConvDims d = device_dims();
  if (x.device().type == DeviceType::kCUDA) {
#ifdef CORTADO_HAVE_CUDA
    cuda::LayerConvolution(x.device().index, d, pass, x.dtype(), x.raw_data(), w.raw_data(),
                           y.raw_data());
    if (bias == nullptr) return;
    return WithElementCodes(*this, x.dtype(), [&](auto codes) {
      using E = decltype(codes);
      using A = typename E::Acc;
      RunIndexed(
          "convolution bias", {*bias, y}, y.numel(),
          kernels::ConvAddBias<E>{d, StoredData<kernels::PlainCodes<A>>(*bias), StoredData<E>(y)});
    });
#endif
  }
  // The test device (and any other without cuDNN): the direct reference passes, 16-bit elements
  // through their codes, the gradients of the parameters in their f32 (or f64) master dtype.
  WithElementCodes(*this, x.dtype(), [&](auto codes) {
    using E = decltype(codes);
    using A = typename E::Acc;
    using Master = kernels::PlainCodes<A>;
    const char* what = "convolution on a device";
    const Tensor none;
    switch (pass) {
      case ConvPassKind::kForward:
        return RunIndexed(
            what, {x, w, y, bias != nullptr ? *bias : none}, y.numel(),
            kernels::ConvForward<E>{d, StoredData<E>(x), StoredData<E>(w), StoredData<E>(y),
                                    bias != nullptr ? StoredData<Master>(*bias) : nullptr},
            64);
      case ConvPassKind::kBackwardData:
        return RunIndexed(
            what, {x, w, y}, x.numel(),
            kernels::ConvBackwardData<E>{d, StoredData<E>(y), StoredData<E>(w), StoredData<E>(x)},
            64);
      case ConvPassKind::kBackwardFilter:
        return RunIndexed(what, {x, w, y}, w.numel(),
                          kernels::ConvBackwardFilter<E, Master>{
                              d, StoredData<E>(x), StoredData<E>(y), StoredData<Master>(w)},
                          1);
    }
  });
}

const Tensor& ConvolutionLayer::LowPrecisionFilter(const Tensor& filter, DType dtype) {
  if (!IsLowPrecision(dtype)) return filter;
  Tensor& copy = DeviceLike(lowp_filter_, filter, dtype, filter.name() + " (16-bit)");
  copy.ConvertFrom(filter);  // rounded to nearest even, as the CPU's copy
  return copy;
}

const Tensor& ConvolutionLayer::DeviceFilter(bool forward) {
  const Tensor& w = params_[0].value;
  if (!nhwc_) return w;
  bool stale = ohwi_version_ != context().params_version;
  if (!ohwi_weights_.defined() || !ohwi_weights_.SameShape(w) ||
      ohwi_weights_.dtype() != w.dtype() || ohwi_weights_.device() != w.device()) {
    ohwi_weights_ = Tensor(w.shape(), w.dtype(), AllocatorFor(w.device()));
    ohwi_weights_.set_format(MemoryFormat::kNHWC);
    ohwi_weights_.set_name(w.name() + " (OHWI)");
    stale = true;
  }
  // A training net's weights change at every step (the solver's update, on the device, which
  // does not move params_version): each forward reorders them again and the backward of the step
  // reads that copy. An inference net's change only through LoadState or ParamsChanged.
  if (forward && !context().inference) stale = true;
  if (stale) {
    ohwi_weights_.ReorderFrom(w);
    ohwi_version_ = context().params_version;
  }
  return ohwi_weights_;
}

void ConvolutionLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  const Tensor& x = bottom[0]->data;
  if (!OwnDevicePath(x)) return Layer::ForwardOnDevice(bottom, top);
  Tensor& y = top[0]->data;
  if (x.dim(0) == 0) return;
  const Tensor& w = LowPrecisionFilter(DeviceFilter(/*forward=*/true), x.dtype());
  ConvOnDevice(ConvPassKind::kForward, x, w, y, has_bias_ ? &params_[1].value : nullptr);
}

void ConvolutionLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                        const Blobs& bottom) {
  const Tensor& x = bottom[0]->data;
  if (!OwnDevicePath(x)) return Layer::BackwardOnDevice(top, propagate_down, bottom);
  const Tensor& dy = top[0]->grad;
  Tensor& dw = params_[0].grad;
  Tensor* db = has_bias_ ? &params_[1].grad : nullptr;
  if (x.dim(0) == 0) {  // no terms: zero gradients, as the CPU writes them
    dw.Zero();
    if (db != nullptr) db->Zero();
    return;
  }
  // The weight gradient, overwritten (OHWI first with channels-last activations).
  Tensor& gradient = nhwc_ ? DeviceLike(ohwi_gradient_, DeviceFilter(/*forward=*/false), dw.dtype(),
                                        dw.name() + " (OHWI)")
                           : dw;
  if (IsLowPrecision(x.dtype()) && x.device().type == DeviceType::kCUDA) {
    // cuDNN writes the pass's one dtype: a 16-bit gradient, widened into the f32 one.
    Tensor& narrow = DeviceLike(lowp_gradient_, gradient, x.dtype(), dw.name() + " (16-bit)");
    ConvOnDevice(ConvPassKind::kBackwardFilter, x, narrow, dy);
    gradient.ConvertFrom(narrow);
  } else {
    ConvOnDevice(ConvPassKind::kBackwardFilter, x, gradient, dy);
  }
  if (nhwc_) dw.ReorderFrom(gradient);
  if (db != nullptr) {
    WithElementCodes(*this, x.dtype(), [&](auto codes) {
      using E = decltype(codes);
      using Master = kernels::PlainCodes<typename E::Acc>;
      RunIndexed("convolution bias gradient", {dy, *db}, num_output_,
                 kernels::ConvBiasGradient<E, Master>{device_dims(), StoredData<E>(dy),
                                                      StoredData<Master>(*db)},
                 1);
    });
  }
  if (propagate_down[0]) {
    // The filter the forward of this step used (its copy is current).
    ConvOnDevice(ConvPassKind::kBackwardData, bottom[0]->grad,
                 LowPrecisionFilter(DeviceFilter(/*forward=*/false), x.dtype()), dy);
  }
}

template class TypedLayer<ConvolutionLayer, AllFloatTypes, KernelArgs::kOneInput>;

CORTADO_REGISTER_LAYER(Convolution, ConvolutionLayer);

}  // namespace cortado
