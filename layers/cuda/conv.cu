// The convolution and inner product layers on a GPU: their passes through cuDNN and cuBLASLt
// (cases from layers/cuda/layer_cases.h), and every shared body of layers/conv_kernels.h and
// layers/matmul_kernels.h instantiated for RunIndexed (the bias bodies run here after cuDNN; the
// reference passes compile here so that they stay valid device code, though a GPU runs cuDNN).
#include "engine/cuda/indexed_launch.cuh"
#include "layers/cuda/layer_cases.h"

namespace cortado::cuda {

void LayerConvolution(int device, const ConvDims& dims, ConvPassKind pass, DType dtype, void* x,
                      void* w, void* y) {
  RunConvolution(device, LayerConvCase(dims, pass, dtype), {x, w, y});
}

void LayerMatmul(int device, const MatmulDims& dims, DType dtype, const void* a, const void* b,
                 void* c, const void* bias, void* bias_grad) {
  RunMatmul(device, LayerMatmulCase(dims, dtype), {a, b, c, bias, bias_grad});
}

}  // namespace cortado::cuda

#define CORTADO_CONV_BODIES(T)                                  \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvForward<T>)        \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvBackwardData<T>)   \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvBackwardFilter<T>) \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvAddBias<T>)        \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvBiasGradient<T>)   \
  CORTADO_CUDA_INDEXED(cortado::kernels::Matmul<T>)             \
  CORTADO_CUDA_INDEXED(cortado::kernels::MatmulBiasGradient<T>)
CORTADO_CONV_BODIES(float)
CORTADO_CONV_BODIES(double)
