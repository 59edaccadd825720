#include "layers/eltwise.h"

#include <algorithm>

#include "engine/base/thread_pool.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/device_staging.h"
#include "layers/layer_util.h"

namespace cortado {

constexpr int64_t kEltwiseChunk = 16384;

void EltwiseLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const std::string op = settings().GetString("operation", "sum");
  if (op == "sum") {
    op_ = Op::kSum;
  } else if (op == "prod") {
    op_ = Op::kProd;
  } else if (op == "max") {
    op_ = Op::kMax;
  } else {
    Fail(Describe(), ": key 'operation' expects sum, prod or max, got '", op, "'");
  }
  relu_ = settings().GetBool("relu", false);
  if (relu_ && op_ != Op::kSum) {
    Fail(Describe(), ": key 'relu' applies only to operation 'sum', not '", op, "'");
  }
  const bool has_coeffs = settings().Has("coeffs");
  coeffs_ = settings().GetFloats("coeffs", std::vector<double>(bottom.size(), 1.0));
  if (has_coeffs && op_ != Op::kSum) {
    Fail(Describe(), ": key 'coeffs' applies only to operation 'sum', not '", op, "'");
  }
  if (coeffs_.size() != bottom.size()) {
    Fail(Describe(), ": key 'coeffs' has ", coeffs_.size(), " value(s) but the layer has ",
         bottom.size(), " inputs; give one coefficient per input");
  }
}

void EltwiseLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  CheckFloatInput(*this, bottom[0]->data, "input 0");
  CheckSameDType(*this, bottom);
  for (size_t i = 1; i < bottom.size(); ++i) {
    if (!bottom[i]->data.SameShape(bottom[0]->data)) {
      Fail(Describe(), ": input ", i, " ('", bottom[i]->name, "') has shape ",
           ShapeString(bottom[i]->data.shape()), " but input 0 ('", bottom[0]->name, "') has ",
           ShapeString(bottom[0]->data.shape()), "; all inputs must have the same shape");
    }
    if (bottom[i]->data.format() != bottom[0]->data.format() &&
        !bottom[0]->data.IsLayoutTrivial()) {
      Fail(Describe(), ": input ", i, " ('", bottom[i]->name, "') is ", bottom[i]->data.ToString(),
           " but input 0 ('", bottom[0]->name, "') is ", bottom[0]->data.ToString(),
           "; all inputs must have the same memory format");
    }
  }
  if (in_place_) {
    top[0]->data = bottom[0]->data;  // the same storage: the sum accumulates into input 0
  } else {
    top[0]->data.Resize(bottom[0]->data.shape(), bottom[0]->data.dtype());
    top[0]->data.set_format(bottom[0]->data.format());
  }
  if (op_ == Op::kMax) argmax_.Resize(bottom[0]->data.shape(), DType::kI32);
}

namespace {

// Kernels on restrict pointers so that every loop vectorizes.
template <typename T>
void AxpbyKernel(T a, const T* __restrict x, T b, const T* __restrict z, T* __restrict y,
                 int64_t n) {  // y = a x + b z
  if (a == T(1) && b == T(1)) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] + z[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b * z[i];
  }
}

template <typename T>
void AxpyKernel(T a, const T* __restrict x, T* __restrict y, int64_t n) {  // y += a x
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

template <typename T>
void ScaleAddKernel(T a, T* __restrict y, T b, const T* __restrict x, int64_t n) {  // y = a y + b x
  for (int64_t i = 0; i < n; ++i) y[i] = a * y[i] + b * x[i];
}

template <typename T>
void ScaleKernel(T a, const T* __restrict x, T* __restrict y, int64_t n) {  // y = a x
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
}

// The fused ReLU: y = max(y, 0) as ReluLayer computes it (NaN to 0).
template <typename T>
void ReluKernel(T* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = y[i];
    y[i] = v > T(0) ? v : T(0);
  }
}

// The fused ReLU's backward: dx = a dy where y > 0, else 0 (ReluLayer's mask, then the sum's
// scale, as the unfused pair computes it).
template <typename T>
void MaskedScaleKernel(T a, const T* __restrict y, const T* __restrict dy, T* __restrict dx,
                       int64_t n) {
  if (a == T(1)) {
    for (int64_t i = 0; i < n; ++i) {
      const T g = dy[i];
      dx[i] = y[i] > T(0) ? g : T(0);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T g = y[i] > T(0) ? dy[i] : T(0);
      dx[i] = a * g;
    }
  }
}

template <typename T>
void MulKernel(const T* __restrict x, const T* __restrict z, T* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * z[i];
}

template <typename T>
void MulInPlaceKernel(const T* __restrict x, T* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= x[i];
}

// y = max(y, x) with arg = which where x wins (strictly greater: the first input keeps ties).
template <typename T>
void MaxKernel(const T* __restrict x, int32_t which, T* __restrict y, int32_t* __restrict arg,
               int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T cur = y[i];
    const bool take = v > cur;
    y[i] = take ? v : cur;
    arg[i] = take ? which : arg[i];
  }
}

template <typename T>
void RouteKernel(const int32_t* __restrict arg, int32_t me, const T* __restrict dy,
                 T* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T g = dy[i];
    dx[i] = arg[i] == me ? g : T(0);
  }
}

}  // namespace

template <typename T>
void EltwiseLayer::ForwardChunk(const std::vector<const T*>& x, T* y, int32_t* arg,
                                int64_t n) const {
  const size_t k = x.size();
  switch (op_) {
    case Op::kSum:
      if (in_place_) {  // y is x[0]
        ScaleAddKernel(static_cast<T>(coeffs_[0]), y, static_cast<T>(coeffs_[1]), x[1], n);
      } else {
        AxpbyKernel(static_cast<T>(coeffs_[0]), x[0], static_cast<T>(coeffs_[1]), x[1], y, n);
      }
      for (size_t j = 2; j < k; ++j) AxpyKernel(static_cast<T>(coeffs_[j]), x[j], y, n);
      if (relu_) ReluKernel(y, n);
      break;
    case Op::kProd:
      MulKernel(x[0], x[1], y, n);
      for (size_t j = 2; j < k; ++j) MulInPlaceKernel(x[j], y, n);
      break;
    case Op::kMax:
      std::copy(x[0], x[0] + n, y);
      std::fill(arg, arg + n, 0);
      for (size_t j = 1; j < k; ++j) MaxKernel(x[j], static_cast<int32_t>(j), y, arg, n);
      break;
  }
}

bool EltwiseLayer::FitsDeviceBodies() const {
  return coeffs_.size() <= static_cast<size_t>(kernels::kEltwiseMaxInputs);
}

kernels::EltwiseOp EltwiseLayer::DeviceOp() const {
  switch (op_) {
    case Op::kSum:
      return kernels::EltwiseOp::kSum;
    case Op::kProd:
      return kernels::EltwiseOp::kProd;
    case Op::kMax:
      return kernels::EltwiseOp::kMax;
  }
  return kernels::EltwiseOp::kSum;
}

void EltwiseLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  if (!FitsDeviceBodies()) return Layer::ForwardOnDevice(bottom, top);
  if (in_place_) top[0]->data = bottom[0]->data;
  Tensor& y = top[0]->data;
  if (op_ == Op::kMax) KeepOn(argmax_, y.device());
  WithElementCodes(*this, y.dtype(), [&](auto codes) {
    using E = decltype(codes);
    using A = typename E::Acc;
    kernels::EltwiseForward<E> body;
    std::vector<Tensor> given{y};
    body.count = static_cast<int>(bottom.size());
    for (size_t j = 0; j < bottom.size(); ++j) {
      body.x[j] = StoredData<E>(bottom[j]->data);
      body.coeffs[j] = static_cast<A>(coeffs_[j]);
      body.unit = body.unit && coeffs_[j] == 1.0;
      given.push_back(bottom[j]->data);
    }
    body.op = DeviceOp();
    body.relu = relu_;
    body.y = StoredData<E>(y);
    if (op_ == Op::kMax) {
      body.arg = static_cast<int32_t*>(argmax_.raw_data());
      given.push_back(argmax_);
    }
    RunIndexed("eltwise forward", given, y.numel(), body, kEltwiseChunk);
  });
}

void EltwiseLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                    const Blobs& bottom) {
  if (!FitsDeviceBodies()) return Layer::BackwardOnDevice(top, propagate_down, bottom);
  const Tensor& dy = top[0]->grad;
  for (size_t j = 0; j < bottom.size(); ++j) {
    if (!propagate_down[j]) continue;
    Tensor& dx = bottom[j]->grad;
    if (op_ == Op::kSum && coeffs_[j] == 1.0 && !relu_) {
      dx.CopyFrom(dy);  // the gradient passes through, its bits as they are (as on the CPU)
      continue;
    }
    WithElementCodes(*this, dy.dtype(), [&](auto codes) {
      using E = decltype(codes);
      kernels::EltwiseBackward<E> body;
      std::vector<Tensor> given{dy, dx};
      body.dy = StoredData<E>(dy);
      body.dx = StoredData<E>(dx);
      body.op = DeviceOp();
      body.count = static_cast<int>(bottom.size());
      body.me = static_cast<int>(j);
      body.coeff = static_cast<typename E::Acc>(coeffs_[j]);
      body.relu = relu_;
      if (relu_) {
        body.y = StoredData<E>(top[0]->data);
        given.push_back(top[0]->data);
      }
      if (op_ == Op::kProd) {
        for (size_t m = 0; m < bottom.size(); ++m) {
          body.x[m] = StoredData<E>(bottom[m]->data);
          given.push_back(bottom[m]->data);
        }
      }
      if (op_ == Op::kMax) {
        body.arg = static_cast<const int32_t*>(argmax_.raw_data());
        given.push_back(argmax_);
      }
      RunIndexed("eltwise backward", given, dx.numel(), body, kEltwiseChunk);
    });
  }
}

template <typename T>
void EltwiseLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  using A = Compute<T>;
  // In place, input 0 may have been reallocated since Reshape (a larger batch); share again.
  if (in_place_) top[0]->data = bottom[0]->data;
  std::vector<const T*> x;  // bottom[i]: any shape, all equal
  for (Blob* b : bottom) x.push_back(b->data.data<T>());
  T* y = top[0]->data.data<T>();  // top: the same shape
  int32_t* arg = op_ == Op::kMax ? argmax_.data<int32_t>() : nullptr;
  ParallelFor(top[0]->data.numel(), kEltwiseChunk, [&](int64_t begin, int64_t end) {
    if constexpr (!kIsLowPrecision<T>) {
      std::vector<const T*> xb;
      for (const T* p : x) xb.push_back(p + begin);
      ForwardChunk<T>(xb, y + begin, arg != nullptr ? arg + begin : nullptr, end - begin);
    } else {
      // 16-bit storage: widen a cache-sized block of every input, run the f32 kernel, round
      // the output back (what the f32 fallback computes, without f32 copies of whole tensors).
      std::vector<std::vector<A>> wide(x.size(), std::vector<A>(kEltwiseChunk));
      std::vector<A> wide_y(kEltwiseChunk);
      std::vector<const A*> xb(x.size());
      for (int64_t b0 = begin; b0 < end; b0 += kEltwiseChunk) {
        const int64_t n = std::min(kEltwiseChunk, end - b0);
        for (size_t j = 0; j < x.size(); ++j) {
          WidenSpan<T>(x[j] + b0, n, wide[j].data());
          xb[j] = wide[j].data();
        }
        A* yb = in_place_ ? wide[0].data() : wide_y.data();
        ForwardChunk<A>(xb, yb, arg != nullptr ? arg + b0 : nullptr, n);
        NarrowSpan<T>(yb, n, y + b0);
      }
    }
  });
}

template <typename T>
void EltwiseLayer::BackwardChunk(size_t j, const T* dy, const std::vector<const T*>& x,
                                 const int32_t* arg, const T* y, T* dx, int64_t n) const {
  switch (op_) {
    case Op::kSum:
      if (relu_) {
        MaskedScaleKernel(static_cast<T>(coeffs_[j]), y, dy, dx, n);
      } else if (coeffs_[j] == 1.0) {
        std::copy(dy, dy + n, dx);
      } else {
        ScaleKernel(static_cast<T>(coeffs_[j]), dy, dx, n);
      }
      break;
    case Op::kProd: {
      // dx_j = dy * prod_{m != j} x_m, computed directly (zeros in x are fine).
      bool first = true;
      for (size_t m = 0; m < x.size(); ++m) {
        if (m == j) continue;
        if (first) {
          MulKernel(dy, x[m], dx, n);
          first = false;
        } else {
          MulInPlaceKernel(x[m], dx, n);
        }
      }
      break;
    }
    case Op::kMax:
      RouteKernel(arg, static_cast<int32_t>(j), dy, dx, n);
      break;
  }
}

template <typename T>
void EltwiseLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                             const Blobs& bottom) {
  using A = Compute<T>;
  const T* dy = top[0]->grad.data<T>();                   // top: any shape
  const T* y = relu_ ? top[0]->data.data<T>() : nullptr;  // the fused ReLU's output
  const int32_t* arg = op_ == Op::kMax ? argmax_.data<int32_t>() : nullptr;
  const size_t k = bottom.size();
  std::vector<const T*> x;
  if (op_ == Op::kProd) {
    for (Blob* b : bottom) x.push_back(b->data.data<T>());  // only prod reads the inputs
  }
  for (size_t j = 0; j < k; ++j) {
    if (!propagate_down[j]) continue;
    T* dx = bottom[j]->grad.data<T>();  // bottom[j]: top's shape
    ParallelFor(top[0]->data.numel(), kEltwiseChunk, [&](int64_t begin, int64_t end) {
      if constexpr (!kIsLowPrecision<T>) {
        std::vector<const T*> xb;
        for (const T* p : x) xb.push_back(p + begin);
        BackwardChunk<T>(j, dy + begin, xb, arg != nullptr ? arg + begin : nullptr,
                         y != nullptr ? y + begin : nullptr, dx + begin, end - begin);
      } else if (op_ == Op::kSum && coeffs_[j] == 1.0 && !relu_) {
        std::copy(dy + begin, dy + end, dx + begin);  // the gradient passes through unrounded
      } else {
        std::vector<std::vector<A>> wide(x.size(), std::vector<A>(kEltwiseChunk));
        std::vector<A> wide_dy(kEltwiseChunk), wide_dx(kEltwiseChunk);
        std::vector<A> wide_y(relu_ ? kEltwiseChunk : 0);
        std::vector<const A*> xb(x.size());
        for (int64_t b0 = begin; b0 < end; b0 += kEltwiseChunk) {
          const int64_t n = std::min(kEltwiseChunk, end - b0);
          WidenSpan<T>(dy + b0, n, wide_dy.data());
          if (relu_) WidenSpan<T>(y + b0, n, wide_y.data());
          for (size_t m = 0; m < x.size(); ++m) {
            if (m == j) continue;  // dx_j does not read x_j
            WidenSpan<T>(x[m] + b0, n, wide[m].data());
            xb[m] = wide[m].data();
          }
          BackwardChunk<A>(j, wide_dy.data(), xb, arg != nullptr ? arg + b0 : nullptr,
                           relu_ ? wide_y.data() : nullptr, wide_dx.data(), n);
          NarrowSpan<T>(wide_dx.data(), n, dx + b0);
        }
      }
    });
  }
}

template class TypedLayer<EltwiseLayer, AllFloatTypes>;

CORTADO_REGISTER_LAYER(Eltwise, EltwiseLayer);

}  // namespace cortado
