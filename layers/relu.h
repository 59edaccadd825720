// ReLU: y = x for x > 0, negative_slope * x otherwise (leaky when negative_slope != 0).
//
// Settings: negative_slope (0.0).
// Shapes: any; top has bottom's shape and memory format. Backward passes the gradient where x > 0
// (PyTorch's rule for slope 0: the gradient at exactly 0 is 0), read from the output's sign when
// the slope is not negative (y > 0 exactly where x > 0), so the layer can run in place: the net
// lets the output overwrite the input (Layer::CanRunInPlace) where nothing else needs it.
// Threads: ParallelFor over contiguous element ranges.
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class ReluLayer : public TypedLayer<ReluLayer, WideFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool CanRunInPlace() const override { return negative_slope_ >= 0; }
  bool TakesChannelsLast() const override { return true; }  // element-wise
  double negative_slope() const { return negative_slope_; }
  // The gradient's mask comes from y where the slope is not negative (y > 0 iff x > 0).
  bool BackwardReadsInputs() const override { return negative_slope_ < 0; }

 protected:
  // bf16 and f16 with slope 0 on the 16-bit codes (no conversion); a leaky ReLU computes in f32.
  void ForwardBF16(const Blobs& bottom, const Blobs& top) override {
    Forward16(bottom, top, kBF16Inf);
  }
  void ForwardF16(const Blobs& bottom, const Blobs& top) override {
    Forward16(bottom, top, kF16Inf);
  }
  void BackwardBF16(const Blobs& top, const std::vector<bool>& propagate_down,
                    const Blobs& bottom) override {
    Backward16(top, propagate_down, bottom, kBF16Inf);
  }
  void BackwardF16(const Blobs& top, const std::vector<bool>& propagate_down,
                   const Blobs& bottom) override {
    Backward16(top, propagate_down, bottom, kF16Inf);
  }
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  // On a device: f32 and f64 through the shared bodies of engine/tensor/device_kernels.h, bf16
  // and f16 through layers/eltwise_kernels.h (widened, compared in f32, rounded once); no CPU
  // kernel.
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  static constexpr uint16_t kBF16Inf = 0x7f80, kF16Inf = 0x7c00;  // codes of +inf
  void Forward16(const Blobs& bottom, const Blobs& top, uint16_t inf);
  void Backward16(const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom,
                  uint16_t inf);
  CORTADO_TYPED_LAYER_KERNELS();
  double negative_slope_ = 0.0;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<ReluLayer, WideFloatTypes>;

}  // namespace cortado
