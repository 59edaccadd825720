// SoftmaxWithLoss's and Accuracy's shared bodies (layers/loss_kernels.h) as CUDA kernels.
#include "engine/cuda/indexed_launch.cuh"
#include "layers/loss_kernels.h"

CORTADO_CUDA_INDEXED(cortado::kernels::SoftmaxLossRows<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::SoftmaxLossRows<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::MeanOfRows<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::MeanOfRows<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::SoftmaxLossGradRows<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::SoftmaxLossGradRows<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::AccuracyRows<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::AccuracyRows<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::AccuracyOfRows<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::AccuracyOfRows<double>)
