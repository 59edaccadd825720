// Pooling: max or average over 2-d windows (nn.MaxPool2d / nn.AvgPool2d), or over the whole
// plane (global pooling, nn.AdaptiveAvgPool2d(1) / AdaptiveMaxPool2d(1)).
//
// Settings: pool (max | ave; "avg" is accepted too), kernel (n or [h, w]; required unless
// global), stride (default: kernel), pad (0; at most half the kernel, as PyTorch requires),
// global (false), ceil_mode (false), count_include_pad (true, PyTorch's AvgPool2d default).
// Shapes: bottom (N, C, H, W); top (N, C, H_out, W_out) with PyTorch's rule
//   H_out = floor_or_ceil((H + 2 pad - kernel) / stride) + 1, and in ceil mode the last window
//   must start inside the input or the left padding (else H_out is reduced by one).
// Average: windows are clipped to the padded input, and the divisor is the clipped window
// size counting padding (count_include_pad) or only the input elements it covers.
// Max: ties go to the first element in the window (row-major), a NaN always wins, as in
// PyTorch; backward routes the gradient to that element (indices kept from forward).
// Channels-last (NHWC) inputs run kernels of their own that visit each window in the same order
// (so ties, NaN and sums come out as in NCHW) with the channels innermost, vectorized; the
// argmax then holds, per output element, the plane index h * W + w of its input.
// On a device (every dtype, both formats): the shared bodies of layers/pooling_kernels.h, one
// index per output forward and per input element backward (a gather, no atomics), bit for bit
// the CPU kernels (bf16 and f16 computed in f32 and rounded once, as the CPU does).
// Threads: ParallelFor over the N * C planes (NHWC: over output rows forward, images backward).
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {
namespace kernels {
struct PoolShape;
}  // namespace kernels

class PoolingLayer : public TypedLayer<PoolingLayer, AllFloatTypes, KernelArgs::kOneInput> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsInputs() const override { return false; }  // by the saved argmax, or evenly
  bool TakesChannelsLast() const override { return true; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  // The device paths for stored type E (layers/element_codes.h).
  template <class E>
  void ForwardDevice(const Tensor& x, Tensor& y);
  template <class E>
  void BackwardDevice(const Tensor& dy, Tensor& dx);
  // The current geometry for the bodies (global pooling: the whole plane as one window).
  kernels::PoolShape BodyShape(bool channels_last) const;
  // bf16 and f16: each plane widened, pooled by the f32 kernel, rounded back.
  CORTADO_TYPED_LAYER_ONE_INPUT_KERNELS();
  template <typename T>
  void ForwardPlane(const T* xp, T* yp, int32_t* argp) const;
  template <typename T>
  void BackwardPlane(const T* dyp, T* dxp, const int32_t* argp, std::vector<T>& g) const;
  // Channels-last: output row oh of one image (x: (H, W, C), y and arg: (W_out, C) of that row);
  // backward of one image (dy, arg: (H_out, W_out, C); dx: (H, W, C)).
  template <typename T>
  void ForwardRowNhwc(const T* x, int64_t oh, T* y, int32_t* arg) const;
  template <typename T>
  void BackwardImageNhwc(const T* dy, const int32_t* arg, T* dx) const;
  template <typename T>
  void ForwardNhwc(const Tensor& xt, Tensor& yt);
  template <typename T>
  void BackwardNhwc(const Tensor& dyt, Tensor* dxt);
  // Average pooling's divisor for output (oh, ow), the window's rows [hs_pad, he_pad) with
  // padding: the elements it covers (with count_include_pad, padding included), or 0 when it
  // covers no input element (its output is 0).
  int64_t AverageDivisor(int64_t hs_pad, int64_t he_pad, int64_t ow) const;

  bool is_max_ = true;
  bool global_ = false;
  bool ceil_mode_ = false;
  bool count_include_pad_ = true;
  int64_t kernel_h_ = 0, kernel_w_ = 0, stride_h_ = 1, stride_w_ = 1, pad_h_ = 0, pad_w_ = 0;
  // Current geometry (set by Reshape).
  int64_t planes_ = 0, height_ = 0, width_ = 0, out_h_ = 0, out_w_ = 0;
  int64_t channels_ = 0;
  int64_t kh_ = 0, kw_ = 0, sh_ = 1, sw_ = 1, ph_ = 0, pw_ = 0;
  // i32 (N, C, H_out, W_out) on the input's device: index h * W + w within the plane (max
  // only); in an inference net the net's ScratchSpace::ForwardOnly buffer, shared by every
  // pooling layer.
  Tensor argmax_;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<PoolingLayer, AllFloatTypes, KernelArgs::kOneInput>;

}  // namespace cortado
