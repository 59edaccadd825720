// Batch norm's device kernels for CUDA: the shared bodies of layers/batch_norm_kernels.h, one
// instantiation per body and dtype that BatchNormLayer launches (layers/batch_norm.cpp).
#include "engine/cuda/indexed_launch.cuh"
#include "layers/batch_norm_kernels.h"

// Per element codes E (layers/element_codes.h); the per-channel bodies in E's master dtype.
#define CORTADO_BN_BODIES(E)                                \
  CORTADO_CUDA_INDEXED(cortado::kernels::BnPlaneSums<E>)    \
  CORTADO_CUDA_INDEXED(cortado::kernels::BnRowBlockSums<E>) \
  CORTADO_CUDA_INDEXED(cortado::kernels::BnNormalize<E>)    \
  CORTADO_CUDA_INDEXED(cortado::kernels::BnInputGrad<E>)

CORTADO_CUDA_INDEXED(cortado::kernels::BnCombineSums)
CORTADO_BN_BODIES(cortado::kernels::PlainCodes<float>)
CORTADO_BN_BODIES(cortado::kernels::PlainCodes<double>)
CORTADO_BN_BODIES(cortado::kernels::BF16Codes)
CORTADO_BN_BODIES(cortado::kernels::F16Codes)
CORTADO_CUDA_INDEXED(cortado::kernels::BnStatistics<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnStatistics<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnParamGrads<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnParamGrads<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnInputCoefficients<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnInputCoefficients<double>)
