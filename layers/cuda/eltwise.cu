// Eltwise's and ReLU's shared bodies (layers/eltwise_kernels.h) as CUDA kernels, per stored type
// (f32, f64, bf16 and f16 codes).
#include "engine/cuda/indexed_launch.cuh"
#include "layers/eltwise_kernels.h"

#define CORTADO_ELTWISE_BODIES(E)                             \
  CORTADO_CUDA_INDEXED(cortado::kernels::EltwiseForward<E>)   \
  CORTADO_CUDA_INDEXED(cortado::kernels::EltwiseBackward<E>)  \
  CORTADO_CUDA_INDEXED(cortado::kernels::ReluForwardCodes<E>) \
  CORTADO_CUDA_INDEXED(cortado::kernels::ReluBackwardCodes<E>)

CORTADO_ELTWISE_BODIES(cortado::kernels::PlainCodes<float>)
CORTADO_ELTWISE_BODIES(cortado::kernels::PlainCodes<double>)
CORTADO_ELTWISE_BODIES(cortado::kernels::BF16Codes)
CORTADO_ELTWISE_BODIES(cortado::kernels::F16Codes)
