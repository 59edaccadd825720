// Eltwise: element-wise combination of 2+ inputs of the same shape.
//
// Settings: operation (sum | prod | max; default sum), coeffs (list of one number per input,
// sum only; default all 1): sum gives y = sum_i coeffs[i] * x_i; relu (false, sum only): a ReLU
// fused into the sum, y = max(sum, 0) (the net's fusion rewrite sets it where a ReLU alone reads
// the sum: a residual block's join), in the same pass; backward masks dy where y is 0, reading
// the output (which the in-place sum keeps in input 0's storage), with the unfused pair's
// arithmetic, so fused and unfused results are bitwise equal.
// Shapes: every input and the top have the same shape and memory format.
// Backward: sum: dx_i = coeffs[i] * dy; prod: dx_i = dy * prod_{j != i} x_j (computed
// directly, so zeros in the inputs are fine); max: dy goes to the input that held the
// maximum, the first one on ties (Caffe's rule; torch.maximum splits ties in half).
// Threads: ParallelFor over contiguous element ranges.
#pragma once

#include "engine/graph/typed_layer.h"
#include "layers/eltwise_kernels.h"

namespace cortado {

class EltwiseLayer : public TypedLayer<EltwiseLayer, AllFloatTypes> {
 public:
  enum class Op { kSum, kProd, kMax };
  using TypedLayer::TypedLayer;
  int MinInputs() const override { return 2; }
  int MaxInputs() const override { return -1; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsOutputs() const override { return relu_; }            // the fused ReLU's mask
  bool BackwardReadsInputs() const override { return op_ == Op::kProd; }  // max: argmax
  bool TakesChannelsLast() const override { return true; }                // element-wise
  std::string Note() const override { return relu_ ? "+ReLU" : Layer::Note(); }
  // A sum needs none of its inputs in backward, so it may accumulate into input 0.
  bool CanRunInPlace() const override { return op_ == Op::kSum; }

 protected:
  // bf16 and f16: the f32 kernels on cache-sized widened blocks.
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  // On a device: the shared bodies of layers/eltwise_kernels.h, every op and floating dtype, in
  // the CPU's order of operations (bf16/f16 widened, computed in f32, rounded once).
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  // Whether the device bodies (layers/eltwise_kernels.h) take this layer (at most
  // kEltwiseMaxInputs inputs; more run the CPU kernel on the test device only).
  bool FitsDeviceBodies() const;
  kernels::EltwiseOp DeviceOp() const;
  CORTADO_TYPED_LAYER_KERNELS();
  // One block of n elements, pointers already at the block (T is the compute type).
  template <typename T>
  void ForwardChunk(const std::vector<const T*>& x, T* y, int32_t* arg, int64_t n) const;
  template <typename T>
  void BackwardChunk(size_t j, const T* dy, const std::vector<const T*>& x, const int32_t* arg,
                     const T* y, T* dx, int64_t n) const;
  Op op_ = Op::kSum;
  bool relu_ = false;
  std::vector<double> coeffs_;
  Tensor argmax_;  // i32, top's shape: which input held the max (max only)
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<EltwiseLayer, AllFloatTypes>;

}  // namespace cortado
