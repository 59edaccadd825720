// Batch norm's device kernels for CUDA: the shared bodies of layers/batch_norm_kernels.h, one
// instantiation per body and dtype that BatchNormLayer launches (layers/batch_norm.cpp).
#include "engine/cuda/indexed_launch.cuh"
#include "layers/batch_norm_kernels.h"

CORTADO_CUDA_INDEXED(cortado::kernels::BnCombineSums)
CORTADO_CUDA_INDEXED(cortado::kernels::BnPlaneSums<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnPlaneSums<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnRowBlockSums<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnRowBlockSums<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnStatistics<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnStatistics<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnNormalize<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnNormalize<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnParamGrads<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnParamGrads<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnInputCoefficients<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnInputCoefficients<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnInputGrad<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::BnInputGrad<double>)
