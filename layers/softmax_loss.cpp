#include "layers/softmax_loss.h"

#include <algorithm>
#include <cmath>

#include "engine/base/thread_pool.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/device_staging.h"
#include "layers/layer_util.h"
#include "layers/loss_kernels.h"

namespace cortado {

void SoftmaxWithLossLayer::LayerSetUp(const std::vector<Blob*>& bottom,
                                      const std::vector<Blob*>& top) {
  label_smoothing_ = settings().GetFloat("label_smoothing", 0.0);
  if (!(label_smoothing_ >= 0.0 && label_smoothing_ < 1.0)) {
    Fail(Describe(), ": key 'label_smoothing' must be in [0, 1), got ", label_smoothing_);
  }
}

// Checks logits (N, C, 1, ...) and label (N) or (N, 1); returns through num/classes.
static void CheckLogitsAndLabel(const Layer& layer, const std::vector<Blob*>& bottom, int64_t* num,
                                int64_t* classes) {
  const Tensor& x = bottom[0]->data;
  const Tensor& label = bottom[1]->data;
  CheckFloatInput(layer, x, "logits (input 0)");
  bool ok = x.ndim() >= 2;
  for (int d = 2; ok && d < x.ndim(); ++d) ok = x.dim(d) == 1;
  if (!ok) {
    Fail(layer.Describe(), ": logits '", bottom[0]->name, "' must be (N, C), got ", x.ToString());
  }
  if (label.dtype() != DType::kI32) {
    Fail(layer.Describe(), ": label '", bottom[1]->name, "' must be i32, got ", label.ToString());
  }
  const bool label_ok = (label.ndim() == 1 && label.dim(0) == x.dim(0)) ||
                        (label.ndim() == 2 && label.dim(0) == x.dim(0) && label.dim(1) == 1);
  if (!label_ok) {
    Fail(layer.Describe(), ": label '", bottom[1]->name, "' must be (", x.dim(0),
         ") to match logits ", x.ToString(), ", got ", label.ToString());
  }
  *num = x.dim(0);
  *classes = x.dim(1);
}

void SoftmaxWithLossLayer::Reshape(const std::vector<Blob*>& bottom,
                                   const std::vector<Blob*>& top) {
  CheckLogitsAndLabel(*this, bottom, &num_, &classes_);
  if (classes_ < 1) Fail(Describe(), ": logits need at least one class");
  // The loss and the probabilities stay f32 in a bf16/f16 net (softmax and loss are computed
  // in f32 there).
  top[0]->data.Resize({}, MasterDType(bottom[0]->data.dtype()));
  prob_.Resize({num_, classes_}, MasterDType(bottom[0]->data.dtype()));
  row_loss_.Resize({num_}, DType::kF64);
  sample_loss_.resize(num_);
}

void SoftmaxWithLossLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  const Tensor& logits = bottom[0]->data;
  // bf16/f16: the logits widened on the device, as the CPU's ForwardInF32 widens them; the
  // probabilities and the loss are f32 there.
  const Tensor& x = IsLowPrecision(logits.dtype()) ? WidenedF32(logits, wide_) : logits;
  KeepOn(prob_, x.device());
  KeepOn(row_loss_, x.device());
  const Tensor& label = bottom[1]->data;
  Tensor& loss = top[0]->data;
  const std::string what = Describe() + " forward";
  DispatchFloat(x.dtype(), what, [&](auto zero) {
    using T = decltype(zero);
    RunIndexed(what.c_str(), {x, label, prob_, row_loss_}, num_,
               kernels::SoftmaxLossRows<T>{x.device_data<T>(), label.device_data<int32_t>(),
                                           prob_.device_data<T>(), row_loss_.device_data<double>(),
                                           classes_, label_smoothing_},
               16);
    RunIndexed(
        what.c_str(), {row_loss_, loss}, 1,
        kernels::MeanOfRows<T>{row_loss_.device_data<double>(), loss.device_data<T>(), num_});
  });
}

void SoftmaxWithLossLayer::BackwardOnDevice(const Blobs& top,
                                            const std::vector<bool>& propagate_down,
                                            const Blobs& bottom) {
  if (!propagate_down[0]) return;
  Tensor& grad = bottom[0]->grad;
  // bf16/f16: the f32 gradient on the device, rounded into the input's dtype after (the CPU's
  // BackwardInF32); the probabilities and the loss's gradient are f32 already.
  const bool low = IsLowPrecision(grad.dtype());
  Tensor& dx = low ? StagedF32(grad, wide_) : grad;
  const Tensor& label = bottom[1]->data;
  const Tensor& dloss = top[0]->grad;
  const std::string what = Describe() + " backward";
  DispatchFloat(dx.dtype(), what, [&](auto zero) {
    using T = decltype(zero);
    RunIndexed(what.c_str(), {prob_, label, dloss, dx}, num_,
               kernels::SoftmaxLossGradRows<T>{prob_.device_data<T>(), label.device_data<int32_t>(),
                                               dloss.device_data<T>(), dx.device_data<T>(), num_,
                                               classes_, label_smoothing_},
               16);
  });
  if (low) grad.ConvertFrom(dx);
}

template <typename T>
void SoftmaxWithLossLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  KeepOn(prob_, Device::CPU());
  const T* x = bottom[0]->data.data<T>();                  // logits: (N, C)
  const int32_t* label = bottom[1]->data.data<int32_t>();  // (N)
  T* prob = prob_.data<T>();                               // (N, C)
  const int64_t c_n = classes_;
  for (int64_t i = 0; i < num_; ++i) {
    if (label[i] < 0 || label[i] >= c_n) {
      Fail(Describe(), ": label ", label[i], " of sample ", i, " is out of range [0, ", c_n, ")");
    }
  }
  const double eps = label_smoothing_;
  ParallelFor(num_, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* xi = x + i * c_n;
      T* pi = prob + i * c_n;
      const T mx = *std::max_element(xi, xi + c_n);
      double sum = 0;
      for (int64_t c = 0; c < c_n; ++c) {
        const T e = std::exp(xi[c] - mx);
        pi[c] = e;
        sum += e;
      }
      const double log_sum = std::log(sum);
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t c = 0; c < c_n; ++c) pi[c] *= inv;
      // -log p_c = log_sum - (x_c - max)
      double l = (log_sum - (static_cast<double>(xi[label[i]]) - mx)) * (1.0 - eps);
      if (eps > 0) {
        double all = 0;
        for (int64_t c = 0; c < c_n; ++c) all += log_sum - (static_cast<double>(xi[c]) - mx);
        l += eps / static_cast<double>(c_n) * all;
      }
      sample_loss_[i] = l;
    }
  });
  double total = 0;
  for (int64_t i = 0; i < num_; ++i) total += sample_loss_[i];
  top[0]->data.data<T>()[0] = static_cast<T>(num_ > 0 ? total / static_cast<double>(num_) : 0.0);
}

template <typename T>
void SoftmaxWithLossLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                                     const Blobs& bottom) {
  if (!propagate_down[0]) return;
  // The device path's body, per sample (the CPU's statements; one code, so the host compiler
  // contracts the products the same way for the CPU and the test device).
  const kernels::SoftmaxLossGradRows<T> rows{prob_.data<T>(),
                                             bottom[1]->data.data<int32_t>(),
                                             top[0]->grad.data<T>(),
                                             bottom[0]->grad.data<T>(),
                                             num_,
                                             classes_,
                                             label_smoothing_};
  ParallelFor(num_, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) rows(i);
  });
}

template class TypedLayer<SoftmaxWithLossLayer, WideFloatTypes>;

CORTADO_REGISTER_LAYER(SoftmaxWithLoss, SoftmaxWithLossLayer);

}  // namespace cortado
