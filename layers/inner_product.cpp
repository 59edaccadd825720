#include "layers/inner_product.h"

#include <algorithm>

#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/math.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/device_staging.h"
#include "layers/layer_util.h"

namespace cortado {

void InnerProductLayer::LayerSetUp(const std::vector<Blob*>& bottom,
                                   const std::vector<Blob*>& top) {
  num_output_ = settings().GetInt("num_output");
  has_bias_ = settings().GetBool("bias", true);
  const InitSpec init = ParseInit(*this, settings());
  if (num_output_ <= 0) Fail(Describe(), ": key 'num_output' must be positive, got ", num_output_);
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  if (x.ndim() < 2) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be at least 2-d (N, ...), got ",
         x.ToString());
  }
  num_input_ = ShapeCount(x.shape(), 1, x.ndim());
  AddParam("weight", {num_output_, num_input_}, x.dtype(), ParamKind::kWeight);
  if (has_bias_) AddParam("bias", {num_output_}, x.dtype(), ParamKind::kBias);
  Rng rng(InitSeed());
  InitWeights(init, /*fan_in=*/num_input_, /*fan_out=*/num_output_, rng, params_[0].value,
              has_bias_ ? &params_[1].value : nullptr);
}

void InnerProductLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  CheckParamDType(*this, MasterDType(x.dtype()));
  if (x.ndim() < 2 || ShapeCount(x.shape(), 1, x.ndim()) != num_input_) {
    Fail(Describe(), ": input '", bottom[0]->name, "' is ", x.ToString(),
         " but the layer was set up for (N, ", num_input_, ") inputs (", num_input_,
         " features per sample)");
  }
  batch_ = x.dim(0);
  top[0]->data.Resize({x.dim(0), num_output_}, x.dtype());
}

// T is the storage type of the activations; A = Compute<T> that of the products, parameters
// and gradients (f32 for bf16 and f16: 16-bit operands, f32 accumulation, one rounding).
Tensor& InnerProductLayer::WeightCopy() {
  ScratchSpace* shared = context().scratch;
  return shared != nullptr ? shared->LowPrecisionWeights() : own_weight_copy_;
}

template <typename T>
void InnerProductLayer::ForwardT(const Tensor& xt, Tensor& yt) {
  using A = Compute<T>;
  constexpr bool lowp = kIsLowPrecision<T>;
  const int64_t n = xt.dim(0);
  const T* x = xt.data<T>();  // bottom: (N, K)
  // weight: (O, K), read in T
  const T* w =
      lowp ? LowPrecisionCopy<T>(params_[0].value, WeightCopy()) : params_[0].value.data<T>();
  // top: (N, O); 16-bit outputs are summed in an A buffer first
  if (lowp) wide_.Resize({n, num_output_}, DTypeOf<A>::value);
  A* y = lowp ? wide_.data<A>() : reinterpret_cast<A*>(yt.data<T>());
  A beta = A(0);
  if (has_bias_) {
    const A* b = params_[1].value.data<A>();  // bias: (O)
    for (int64_t i = 0; i < n; ++i) std::copy(b, b + num_output_, y + i * num_output_);
    beta = A(1);
  }
  ParallelLayerGemm<T>(false, true, n, num_output_, num_input_, x, w, beta, y);
  if constexpr (lowp) NarrowSpan<T>(y, n * num_output_, yt.data<T>());
}

template <typename T>
void InnerProductLayer::BackwardT(const Tensor& xt, const Tensor& dyt, bool propagate,
                                  Tensor* dxt) {
  using A = Compute<T>;
  constexpr bool lowp = kIsLowPrecision<T>;
  const int64_t n = xt.dim(0);
  const T* x = xt.data<T>();    // bottom: (N, K)
  const T* dy = dyt.data<T>();  // top grad: (N, O)
  // dW (O, K) = dy^T (O, N) x (N, K)
  ParallelLayerGemm<T>(true, false, num_output_, num_input_, n, dy, x, A(0),
                       params_[0].grad.data<A>());
  if (has_bias_) {
    A* db = params_[1].grad.data<A>();  // (O)
    std::fill(db, db + num_output_, A(0));
    for (int64_t i = 0; i < n; ++i) {
      const T* row = dy + i * num_output_;
      for (int64_t o = 0; o < num_output_; ++o) db[o] += Widen(row[o]);
    }
  }
  if (propagate) {
    // dx (N, K) = dy (N, O) W (O, K)
    const T* w =
        lowp ? LowPrecisionCopy<T>(params_[0].value, WeightCopy()) : params_[0].value.data<T>();
    if (lowp) wide_.Resize({n, num_input_}, DTypeOf<A>::value);
    A* dx = lowp ? wide_.data<A>() : reinterpret_cast<A*>(dxt->data<T>());
    ParallelLayerGemm<T>(false, false, n, num_input_, num_output_, dy, w, A(0), dx);
    if constexpr (lowp) NarrowSpan<T>(dx, n * num_input_, dxt->data<T>());
  }
}

bool InnerProductLayer::OwnDevicePath(const Tensor& x) const {
  if (x.dtype() == DType::kF64 && x.device().type == DeviceType::kCUDA) {
    Fail(Describe(), ": f64 on ", x.device().ToString(),
         ": cuBLASLt has no f64 products (f64 runs on the CPU and the test device)");
  }
  return true;
}

void InnerProductLayer::MatmulOnDevice(const MatmulDims& d, const Tensor& a, const Tensor& b,
                                       const Tensor& c, const Tensor* bias,
                                       const Tensor* bias_grad) {
  if (c.device().type == DeviceType::kCUDA) {
#ifdef CORTADO_HAVE_CUDA
    const Tensor* b16 = bias;
    if (bias != nullptr && bias->dtype() != c.dtype()) {
      // cuBLASLt adds a bias in C's dtype: a 16-bit copy of the f32 one (rounded before the add,
      // where the CPU adds it in f32).
      b16 = &DeviceLike(lowp_bias_, *bias, c.dtype(), bias->name() + " (16-bit)");
      lowp_bias_.ConvertFrom(*bias);
    }
    return cuda::LayerMatmul(c.device().index, d, a.dtype(), c.dtype(), a.raw_data(), b.raw_data(),
                             c.raw_data(), b16 != nullptr ? b16->raw_data() : nullptr,
                             bias_grad != nullptr ? bias_grad->raw_data() : nullptr);
#endif
  }
  // The test device (and any other without cuBLASLt): the product bodies, 16-bit operands through
  // their codes, summed and the bias added in f32, C stored in its own dtype (16-bit, or the f32
  // weight gradient).
  WithElementCodes(*this, a.dtype(), [&](auto codes) {
    using E = decltype(codes);
    using Master = kernels::PlainCodes<typename E::Acc>;
    const Tensor none;
    const auto* bias_data = bias != nullptr ? StoredData<Master>(*bias) : nullptr;
    const char* what = "inner product on a device";
    if (c.dtype() == a.dtype()) {
      RunIndexed(
          what, {a, b, c, bias != nullptr ? *bias : none}, d.m * d.n,
          kernels::Matmul<E>{d, StoredData<E>(a), StoredData<E>(b), bias_data, StoredData<E>(c)},
          64);
    } else {
      RunIndexed(what, {a, b, c, bias != nullptr ? *bias : none}, d.m * d.n,
                 kernels::Matmul<E, Master>{d, StoredData<E>(a), StoredData<E>(b), bias_data,
                                            StoredData<Master>(c)},
                 64);
    }
    if (bias_grad != nullptr) {
      RunIndexed("inner product bias gradient", {a, *bias_grad}, d.m,
                 kernels::MatmulBiasGradient<E, Master>{d, StoredData<E>(a),
                                                        StoredData<Master>(*bias_grad)},
                 1);
    }
  });
}

const Tensor& InnerProductLayer::LowPrecisionWeights(DType dtype) {
  const Tensor& w = params_[0].value;
  if (!IsLowPrecision(dtype)) return w;
  DeviceLike(lowp_weights_, w, dtype, w.name() + " (16-bit)").ConvertFrom(w);  // as the CPU's copy
  return lowp_weights_;
}

void InnerProductLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  const Tensor& x = bottom[0]->data;  // (N, K), flattened from axis 1
  if (!OwnDevicePath(x)) return Layer::ForwardOnDevice(bottom, top);
  const int64_t n = x.dim(0);
  if (n == 0) return;
  MatmulOnDevice(InnerProductForward(n, num_input_, num_output_, has_bias_), x,
                 LowPrecisionWeights(x.dtype()), top[0]->data,
                 has_bias_ ? &params_[1].value : nullptr, nullptr);
}

void InnerProductLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                         const Blobs& bottom) {
  const Tensor& x = bottom[0]->data;
  if (!OwnDevicePath(x)) return Layer::BackwardOnDevice(top, propagate_down, bottom);
  const int64_t n = x.dim(0);
  const Tensor& dy = top[0]->grad;
  Tensor* db = has_bias_ ? &params_[1].grad : nullptr;
  if (n == 0) {  // no terms: zero gradients, as the CPU's GEMM and sums write them
    params_[0].grad.Zero();
    if (db != nullptr) db->Zero();
    return;
  }
  MatmulOnDevice(InnerProductWeightGradient(n, num_input_, num_output_, has_bias_), dy, x,
                 params_[0].grad, nullptr, db);
  if (propagate_down[0]) {
    MatmulOnDevice(InnerProductInputGradient(n, num_input_, num_output_), dy,
                   LowPrecisionWeights(x.dtype()), bottom[0]->grad, nullptr, nullptr);
  }
}

template class TypedLayer<InnerProductLayer, AllFloatTypes, KernelArgs::kOneInput>;

CORTADO_REGISTER_LAYER(InnerProduct, InnerProductLayer);

}  // namespace cortado
