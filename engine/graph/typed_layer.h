// TypedLayer: Layer's per-dtype overrides (ForwardF32 ... BackwardF16, and the other-dtype
// ones) written once, for layers whose kernels are one template over the element type.
//
// Why: Layer dispatches on the dtype to eight (ten with other dtypes) virtual functions so that a
// dtype a layer lacks fails naming the layer, or falls back to f32 for bf16/f16. Nearly every
// layer implemented them all as one-line calls of its own kernel template, the same code a dozen
// times. A layer now derives from TypedLayer<ItsClass, KernelTypes<...>> naming the types its
// kernels take, declares them with CORTADO_TYPED_LAYER_KERNELS() (on the blob lists) or, with
// KernelArgs::kOneInput, CORTADO_TYPED_LAYER_ONE_INPUT_KERNELS() (on bottom[0] and top[0]), and
// defines ForwardT<T> and BackwardT<T>. A dtype not in the list keeps Layer's default: f32/f64
// fail naming the layer, bf16/f16 compute in f32 (ForwardInF32), other dtypes fail. OtherDTypes
// in the list sends i32/u8 blobs to the kernels as T = OtherDTypes (layers that only move bytes).
// A layer may still override one dtype itself (ReLU's 16-bit kernels on the raw codes).
//
// The kernels are defined in the layer's .cpp, so its header declares
// `extern template class TypedLayer<...>;` and its .cpp instantiates it: the overrides are
// compiled once, where the kernels are.
#pragma once

#include <type_traits>
#include <vector>

#include "engine/graph/layer.h"

namespace cortado {

// Stands for every dtype that is not floating (i32, u8) in a KernelTypes list.
struct OtherDTypes {};

template <typename... Ts>
struct KernelTypes {
  template <typename T>
  static constexpr bool kHas = (std::is_same_v<T, Ts> || ...);
};
using AllFloatTypes = KernelTypes<float, double, BFloat16, Half>;
using WideFloatTypes = KernelTypes<float, double>;  // bf16 and f16 compute in f32
using AllDTypes = KernelTypes<float, double, BFloat16, Half, OtherDTypes>;

// Declares, inside a layer's class (private), the kernels TypedLayer calls on the blob lists,
// and lets TypedLayer call them; the layer's .cpp defines them.
#define CORTADO_TYPED_LAYER_KERNELS()                   \
  friend TypedLayer;                                    \
  template <typename T>                                 \
  void ForwardT(const Blobs& bottom, const Blobs& top); \
  template <typename T>                                 \
  void BackwardT(const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom)

// The same for KernelArgs::kOneInput: the kernels take bottom[0] and top[0] (and, backward,
// whether to compute bottom[0]'s gradient).
#define CORTADO_TYPED_LAYER_ONE_INPUT_KERNELS() \
  friend TypedLayer;                            \
  template <typename T>                         \
  void ForwardT(const Tensor& x, Tensor& y);    \
  template <typename T>                         \
  void BackwardT(const Tensor& x, const Tensor& dy, bool propagate, Tensor* dx)

// How TypedLayer calls the kernels: on the blob lists, or on bottom[0] and top[0] alone.
enum class KernelArgs { kBlobs, kOneInput };

template <typename Derived, typename Types = AllFloatTypes, KernelArgs kArgs = KernelArgs::kBlobs>
class TypedLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  void ForwardF32(const Blobs& bottom, const Blobs& top) override;
  void ForwardF64(const Blobs& bottom, const Blobs& top) override;
  void ForwardBF16(const Blobs& bottom, const Blobs& top) override;
  void ForwardF16(const Blobs& bottom, const Blobs& top) override;
  void ForwardOtherDType(const Blobs& bottom, const Blobs& top) override;
  void BackwardF32(const Blobs& top, const std::vector<bool>& propagate_down,
                   const Blobs& bottom) override;
  void BackwardF64(const Blobs& top, const std::vector<bool>& propagate_down,
                   const Blobs& bottom) override;
  void BackwardBF16(const Blobs& top, const std::vector<bool>& propagate_down,
                    const Blobs& bottom) override;
  void BackwardF16(const Blobs& top, const std::vector<bool>& propagate_down,
                   const Blobs& bottom) override;
  void BackwardOtherDType(const Blobs& top, const std::vector<bool>& propagate_down,
                          const Blobs& bottom) override;

 private:
  template <typename T>
  void Run(const Blobs& bottom, const Blobs& top) {
    Derived& layer = static_cast<Derived&>(*this);
    if constexpr (kArgs == KernelArgs::kOneInput) {
      layer.template ForwardT<T>(bottom[0]->data, top[0]->data);
    } else {
      layer.template ForwardT<T>(bottom, top);
    }
  }
  template <typename T>
  void RunBack(const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom) {
    Derived& layer = static_cast<Derived&>(*this);
    if constexpr (kArgs == KernelArgs::kOneInput) {
      layer.template BackwardT<T>(bottom[0]->data, top[0]->grad, propagate_down[0],
                                  &bottom[0]->grad);
    } else {
      layer.template BackwardT<T>(top, propagate_down, bottom);
    }
  }
};

// Each override runs the kernel when T is in Types, else Layer's default (qualified, so not
// virtual).
#define CORTADO_TYPED_FORWARD(Fn, T)                                                  \
  template <typename Derived, typename Types, KernelArgs kArgs>                       \
  void TypedLayer<Derived, Types, kArgs>::Fn(const Blobs& bottom, const Blobs& top) { \
    if constexpr (Types::template kHas<T>) {                                          \
      Run<T>(bottom, top);                                                            \
    } else {                                                                          \
      Layer::Fn(bottom, top);                                                         \
    }                                                                                 \
  }
#define CORTADO_TYPED_BACKWARD(Fn, T)                                                   \
  template <typename Derived, typename Types, KernelArgs kArgs>                         \
  void TypedLayer<Derived, Types, kArgs>::Fn(                                           \
      const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom) { \
    if constexpr (Types::template kHas<T>) {                                            \
      RunBack<T>(top, propagate_down, bottom);                                          \
    } else {                                                                            \
      Layer::Fn(top, propagate_down, bottom);                                           \
    }                                                                                   \
  }
CORTADO_TYPED_FORWARD(ForwardF32, float)
CORTADO_TYPED_FORWARD(ForwardF64, double)
CORTADO_TYPED_FORWARD(ForwardBF16, BFloat16)
CORTADO_TYPED_FORWARD(ForwardF16, Half)
CORTADO_TYPED_FORWARD(ForwardOtherDType, OtherDTypes)
CORTADO_TYPED_BACKWARD(BackwardF32, float)
CORTADO_TYPED_BACKWARD(BackwardF64, double)
CORTADO_TYPED_BACKWARD(BackwardBF16, BFloat16)
CORTADO_TYPED_BACKWARD(BackwardF16, Half)
CORTADO_TYPED_BACKWARD(BackwardOtherDType, OtherDTypes)
#undef CORTADO_TYPED_FORWARD
#undef CORTADO_TYPED_BACKWARD

}  // namespace cortado
