// Dropout's shared bodies (layers/dropout_kernels.h) as CUDA kernels.
#include "engine/cuda/indexed_launch.cuh"
#include "layers/dropout_kernels.h"

CORTADO_CUDA_INDEXED(cortado::kernels::DropoutForward<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::DropoutForward<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::DropoutBackward<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::DropoutBackward<double>)
CORTADO_CUDA_INDEXED(cortado::kernels::CopyElements<float>)
CORTADO_CUDA_INDEXED(cortado::kernels::CopyElements<double>)
