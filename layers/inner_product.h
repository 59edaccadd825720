// InnerProduct: a fully connected layer, y = x W^T + b (nn.Linear).
//
// Settings: num_output (required), bias (true), weight_init (kaiming_uniform | kaiming_normal;
// see layer_util.h).
// Shapes: bottom (N, d1, ..., dk) is read as (N, K) with K = d1 * ... * dk (flattened from
// axis 1); weight (num_output, K) as in PyTorch; bias (num_output); top (N, num_output).
// Params: <name>.weight (kWeight), <name>.bias (kBias).
// Threads: the three GEMMs go through ParallelGemm (rows or columns of the result split across
// the pool; each result element is computed by one thread, so results are deterministic).
// On a device (f32; f64 on the test device) the same three products run through MatmulOnDevice:
// cuBLASLt on a GPU (the bias added by its epilogue, the bias gradient by BGRADB in the weight
// gradient's pass), the product bodies of layers/matmul_kernels.h on the test device. Gradients
// are overwritten, as on the CPU. bf16/f16 activations take the CPU's mixed precision: the f32
// master weights rounded into a 16-bit device copy, products summed in f32 with the bias added in
// f32, y and dx rounded once, dW and db in f32 (on a GPU cuBLASLt adds a 16-bit copy of the bias).
#pragma once

#include "engine/graph/typed_layer.h"
#include "layers/matmul_kernels.h"

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
  int64_t num_input() const { return num_input_; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

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

  // The device path. Whether it runs the layer's own products for this input (else Layer's
  // default); refuses f64 on a GPU naming the layer.
  bool OwnDevicePath(const Tensor& x) const;
  // One product (a, b, c, bias, bias_grad as MatmulDims says; null where it has none): cuBLASLt
  // on a GPU, the product bodies on the test device.
  void MatmulOnDevice(const MatmulDims& dims, const Tensor& a, const Tensor& b, const Tensor& c,
                      const Tensor* bias, const Tensor* bias_grad);
  // 16-bit activations: the weights rounded to their dtype on the device (the CPU's
  // LowPrecisionCopy); f32 and f64 read the parameter itself.
  const Tensor& LowPrecisionWeights(DType dtype);
  Tensor lowp_weights_;
  Tensor lowp_bias_;  // a GPU's 16-bit bias for cuBLASLt's epilogue
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<InnerProductLayer, AllFloatTypes, KernelArgs::kOneInput>;

}  // namespace cortado
