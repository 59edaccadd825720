// InnerProduct: a fully connected layer, y = x W^T + b (nn.Linear).
//
// Settings: num_output (required), bias (true), weight_init (kaiming_uniform | kaiming_normal;
// see layer_util.h).
// Shapes: bottom (N, d1, ..., dk) is read as (N, K) with K = d1 * ... * dk (flattened from
// axis 1); weight (num_output, K) as in PyTorch; bias (num_output); top (N, num_output).
// Params: <name>.weight (kWeight), <name>.bias (kBias).
// Threads: the three GEMMs go through ParallelGemm (rows or columns of the result split across
// the pool; each result element is computed by one thread, so results are deterministic).
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class InnerProductLayer
    : public TypedLayer<InnerProductLayer, AllFloatTypes, KernelArgs::kOneInput> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsOutputs() const override { return false; }
  double ForwardFlops() const override {
    return 2.0 * static_cast<double>(batch_) * static_cast<double>(num_input_) *
           static_cast<double>(num_output_);
  }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  // bf16 and f16: 16-bit operands, products accumulated in f32 (engine/graph/gemm_lowp.h).
  CORTADO_TYPED_LAYER_ONE_INPUT_KERNELS();

  int64_t num_output_ = 0;
  int64_t num_input_ = 0;  // K
  int64_t batch_ = 0;      // rows at the current shape
  bool has_bias_ = true;
  // The 16-bit copy of the weight the bf16/f16 kernels read: the net's shared one, else own.
  Tensor& WeightCopy();
  Tensor own_weight_copy_;
  Tensor wide_;  // 16-bit kernels: the f32 output or input gradient before rounding
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<InnerProductLayer, AllFloatTypes, KernelArgs::kOneInput>;

}  // namespace cortado
