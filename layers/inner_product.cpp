#include "layers/inner_product.h"

#include <algorithm>

#include "engine/math.h"
#include "engine/random.h"
#include "engine/thread_pool.h"
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

template <typename T>
void InnerProductLayer::ForwardT(const Tensor& xt, Tensor& yt) {
  const int64_t n = xt.dim(0);
  const T* x = xt.data<T>();                // bottom: (N, K)
  const T* w = params_[0].value.data<T>();  // weight: (O, K)
  T* y = yt.data<T>();                      // top: (N, O)
  T beta = T(0);
  if (has_bias_) {
    const T* b = params_[1].value.data<T>();  // bias: (O)
    for (int64_t i = 0; i < n; ++i) std::copy(b, b + num_output_, y + i * num_output_);
    beta = T(1);
  }
  ParallelGemm<T>(false, true, n, num_output_, num_input_, T(1), x, w, beta, y);
}

template <typename T>
void InnerProductLayer::BackwardT(const Tensor& xt, const Tensor& dyt, bool propagate,
                                  Tensor* dxt) {
  const int64_t n = xt.dim(0);
  const T* x = xt.data<T>();    // bottom: (N, K)
  const T* dy = dyt.data<T>();  // top grad: (N, O)
  const T* w = params_[0].value.data<T>();
  // dW (O, K) = dy^T (O, N) x (N, K)
  ParallelGemm<T>(true, false, num_output_, num_input_, n, T(1), dy, x, T(0),
                  params_[0].grad.data<T>());
  if (has_bias_) {
    T* db = params_[1].grad.data<T>();  // (O)
    std::fill(db, db + num_output_, T(0));
    for (int64_t i = 0; i < n; ++i) {
      const T* row = dy + i * num_output_;
      for (int64_t o = 0; o < num_output_; ++o) db[o] += row[o];
    }
  }
  if (propagate) {
    // dx (N, K) = dy (N, O) W (O, K)
    ParallelGemm<T>(false, false, n, num_input_, num_output_, T(1), dy, w, T(0), dxt->data<T>());
  }
}

void InnerProductLayer::ForwardF32(const Blobs& bottom, const Blobs& top) {
  ForwardT<float>(bottom[0]->data, top[0]->data);
}
void InnerProductLayer::ForwardF64(const Blobs& bottom, const Blobs& top) {
  ForwardT<double>(bottom[0]->data, top[0]->data);
}
void InnerProductLayer::BackwardF32(const Blobs& top, const std::vector<bool>& propagate_down,
                                    const Blobs& bottom) {
  BackwardT<float>(bottom[0]->data, top[0]->grad, propagate_down[0], &bottom[0]->grad);
}
void InnerProductLayer::BackwardF64(const Blobs& top, const std::vector<bool>& propagate_down,
                                    const Blobs& bottom) {
  BackwardT<double>(bottom[0]->data, top[0]->grad, propagate_down[0], &bottom[0]->grad);
}

CORTADO_REGISTER_LAYER(InnerProduct, InnerProductLayer);

}  // namespace cortado
