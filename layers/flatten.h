// Flatten: collapses the dimensions from `axis` to the end into one (torch.flatten(x, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: bottom (d0, ..., dk) -> top (d0, ..., d[axis-1], d[axis] * ... * dk).
// Forward shares the bottom's storage (a view, no copy); backward copies the top grad into the
// bottom grad (the net owns that buffer). Any dtype.
#pragma once

#include "engine/layer.h"

namespace cortado {

class FlattenLayer : public Layer {
 public:
  using Layer::Layer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  int SharesInputStorage(int) const override { return 0; }

 protected:
  // Moves bytes only, so one implementation serves every dtype.
  void ForwardF32(const Blobs& bottom, const Blobs& top) override { Move(bottom, top); }
  void ForwardF64(const Blobs& bottom, const Blobs& top) override { Move(bottom, top); }
  void ForwardBF16(const Blobs& bottom, const Blobs& top) override { Move(bottom, top); }
  void ForwardF16(const Blobs& bottom, const Blobs& top) override { Move(bottom, top); }
  void ForwardOtherDType(const Blobs& bottom, const Blobs& top) override { Move(bottom, top); }
  void BackwardF32(const Blobs& top, const std::vector<bool>& down, const Blobs& bottom) override {
    MoveBack(top, down, bottom);
  }
  void BackwardF64(const Blobs& top, const std::vector<bool>& down, const Blobs& bottom) override {
    MoveBack(top, down, bottom);
  }
  void BackwardBF16(const Blobs& top, const std::vector<bool>& down, const Blobs& bottom) override {
    MoveBack(top, down, bottom);
  }
  void BackwardF16(const Blobs& top, const std::vector<bool>& down, const Blobs& bottom) override {
    MoveBack(top, down, bottom);
  }
  void BackwardOtherDType(const Blobs& top, const std::vector<bool>& down,
                          const Blobs& bottom) override {
    MoveBack(top, down, bottom);
  }
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  void Move(const Blobs& bottom, const Blobs& top);
  void MoveBack(const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom);
  Shape TopShape(const Shape& bottom_shape) const;
  int64_t axis_ = 1;
};

}  // namespace cortado
