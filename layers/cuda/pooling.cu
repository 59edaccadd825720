// Pooling's shared bodies (layers/pooling_kernels.h) as CUDA kernels: one instantiation of the
// grid-stride launch per body and stored type (f32, f64, bf16 and f16 codes).
#include "engine/cuda/indexed_launch.cuh"
#include "layers/pooling_kernels.h"

#define CORTADO_POOLING_BODIES(E)                                 \
  CORTADO_CUDA_INDEXED(cortado::kernels::MaxPoolForward<E>)       \
  CORTADO_CUDA_INDEXED(cortado::kernels::AvgPoolForward<E>)       \
  CORTADO_CUDA_INDEXED(cortado::kernels::GlobalAvgPoolForward<E>) \
  CORTADO_CUDA_INDEXED(cortado::kernels::MaxPoolBackward<E>)      \
  CORTADO_CUDA_INDEXED(cortado::kernels::AvgPoolBackward<E>)      \
  CORTADO_CUDA_INDEXED(cortado::kernels::GlobalAvgPoolBackward<E>)

CORTADO_POOLING_BODIES(cortado::kernels::PlainCodes<float>)
CORTADO_POOLING_BODIES(cortado::kernels::PlainCodes<double>)
CORTADO_POOLING_BODIES(cortado::kernels::BF16Codes)
CORTADO_POOLING_BODIES(cortado::kernels::F16Codes)
