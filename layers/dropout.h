// Dropout (inverted): in training, each element is zeroed with probability `ratio` and the
// survivors are scaled by 1 / (1 - ratio), so the test-phase pass is the identity.
//
// Settings: ratio (0.5; 0 <= ratio < 1).
// Shapes: any; top has bottom's shape.
// Randomness: counter-based. Element i is dropped when
//   KeyToUniform(HashCombine(HashCombine(HashCombine(seed, HashString(name)), iteration), g))
// is below `ratio`, with seed and iteration from the layer context and g the element's index in
// the global batch (element f of local sample j is element f of global sample
// context.sample_base + j * context.sample_stride; g = i in a single process), counting elements
// in the logical (N, C, H, W) order whatever the memory format, so a channels-last net draws
// the masks an NCHW net draws. The mask
// therefore depends only on (run seed, layer name, iteration, global element index): a resumed
// run draws the same masks as an uninterrupted one, W data-parallel ranks draw the masks one
// process draws for the combined batch, and the result does not depend on the thread count.
// Threads: ParallelFor over contiguous element ranges.
// Device (f32, f64): the shared bodies of layers/dropout_kernels.h, the same draws, so the mask
// and the outputs are the CPU's bit for bit; the mask lives on the device. bf16/f16 on a device:
// the f32 bodies on the blobs widened there, as the CPU computes them in f32.
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class DropoutLayer : public TypedLayer<DropoutLayer, WideFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsInputs() const override { return false; }  // by the saved mask
  bool TakesChannelsLast() const override { return true; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  CORTADO_TYPED_LAYER_KERNELS();
  double ratio_ = 0.5;
  bool last_forward_train_ = false;  // whether the last Forward applied a mask
  Tensor mask_;                      // u8, bottom's shape: 1 = kept
  Tensor wide_;                      // f32 on a device: a bf16/f16 input or gradient widened
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<DropoutLayer, WideFloatTypes>;

}  // namespace cortado
