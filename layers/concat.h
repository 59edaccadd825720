// Concat: joins 2+ inputs along one axis (torch.cat(inputs, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: every input agrees on all dimensions but `axis`; top's `axis` dimension is the sum.
// Backward copies each input's slice of the top grad.
// Threads: ParallelFor over the outer dimension (the product of dimensions before `axis`).
#pragma once

#include "engine/layer.h"

namespace cortado {

class ConcatLayer : public Layer {
 public:
  using Layer::Layer;
  int MinInputs() const override { return 2; }
  int MaxInputs() const override { return -1; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

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
  int64_t axis_setting_ = 1;
  int axis_ = 1;
  int64_t outer_ = 1, inner_ = 1;
};

}  // namespace cortado
