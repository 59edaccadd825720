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

void LayerMatmul(int device, const MatmulDims& dims, DType dtype, DType out_dtype, const void* a,
                 const void* b, void* c, const void* bias, void* bias_grad) {
  RunMatmul(device, LayerMatmulCase(dims, dtype, out_dtype), {a, b, c, bias, bias_grad});
}

}  // namespace cortado::cuda

// Per element codes E (layers/element_codes.h), the parameters' gradients in E's f32 or f64 (the
// master dtype of 16-bit activations: PlainCodes<E::Acc>, which is E itself for f32 and f64).
#define CORTADO_CONV_MASTER(E) cortado::kernels::PlainCodes<E::Acc>
#define CORTADO_CONV_BODIES(E)                                                          \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvForward<E>)                                \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvBackwardData<E>)                           \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvBackwardFilter<E, CORTADO_CONV_MASTER(E)>) \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvAddBias<E>)                                \
  CORTADO_CUDA_INDEXED(cortado::kernels::ConvBiasGradient<E, CORTADO_CONV_MASTER(E)>)   \
  CORTADO_CUDA_INDEXED(cortado::kernels::Matmul<E>)                                     \
  CORTADO_CUDA_INDEXED(cortado::kernels::MatmulBiasGradient<E, CORTADO_CONV_MASTER(E)>)
CORTADO_CONV_BODIES(cortado::kernels::PlainCodes<float>)
CORTADO_CONV_BODIES(cortado::kernels::PlainCodes<double>)
CORTADO_CONV_BODIES(cortado::kernels::BF16Codes)
CORTADO_CONV_BODIES(cortado::kernels::F16Codes)
// The weight gradient of 16-bit activations, in f32.
CORTADO_CUDA_INDEXED(
    cortado::kernels::Matmul<cortado::kernels::BF16Codes, cortado::kernels::PlainCodes<float>>)
CORTADO_CUDA_INDEXED(
    cortado::kernels::Matmul<cortado::kernels::F16Codes, cortado::kernels::PlainCodes<float>>)
