// Split: hands one blob to several consumers. The net inserts it where a blob feeds more than
// one layer, so that each consumer writes its own gradient and Split sums them.
//
// Settings: none. Inputs: 1. Outputs: any number (>= 1).
// Forward: every top shares the bottom's storage (no copy); consumers never write their inputs.
// Backward: bottom grad = sum of the top grads, added in top order (deterministic).
// Threads: ParallelFor over contiguous element ranges.
#pragma once

#include "engine/layer.h"

namespace cortado {

class SplitLayer : public Layer {
 public:
  using Layer::Layer;
  int NumOutputs() const override { return -1; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsInputs() const override { return false; }  // the sum of the top gradients
  int SharesInputStorage(int) const override { return 0; }

 protected:
  // Forward shares storage, so one implementation serves every dtype.
  void ForwardF32(const Blobs& bottom, const Blobs& top) override { Share(bottom, top); }
  void ForwardF64(const Blobs& bottom, const Blobs& top) override { Share(bottom, top); }
  void ForwardBF16(const Blobs& bottom, const Blobs& top) override { Share(bottom, top); }
  void ForwardF16(const Blobs& bottom, const Blobs& top) override { Share(bottom, top); }
  void ForwardOtherDType(const Blobs& bottom, const Blobs& top) override { Share(bottom, top); }
  void BackwardF32(const Blobs& top, const std::vector<bool>& propagate_down,
                   const Blobs& bottom) override;
  void BackwardF64(const Blobs& top, const std::vector<bool>& propagate_down,
                   const Blobs& bottom) override;
  void BackwardBF16(const Blobs& top, const std::vector<bool>& propagate_down,
                    const Blobs& bottom) override;
  void BackwardF16(const Blobs& top, const std::vector<bool>& propagate_down,
                   const Blobs& bottom) override;
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  void Share(const Blobs& bottom, const Blobs& top);
  template <typename T>
  void BackwardCpu(const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom);
};

}  // namespace cortado
