// Concat's and Split's shared bodies (layers/copy_kernels.h) as CUDA kernels: the slice copy per
// copy unit, the sum of tops per stored type (f32, f64, bf16 and f16 codes).
#include <cstdint>

#include "engine/cuda/indexed_launch.cuh"
#include "layers/copy_kernels.h"

CORTADO_CUDA_INDEXED(cortado::kernels::SliceCopy<uint8_t>)
CORTADO_CUDA_INDEXED(cortado::kernels::SliceCopy<uint16_t>)
CORTADO_CUDA_INDEXED(cortado::kernels::SliceCopy<uint32_t>)
CORTADO_CUDA_INDEXED(cortado::kernels::SliceCopy<uint64_t>)
CORTADO_CUDA_INDEXED(cortado::kernels::SumTops<cortado::kernels::PlainCodes<float>>)
CORTADO_CUDA_INDEXED(cortado::kernels::SumTops<cortado::kernels::PlainCodes<double>>)
CORTADO_CUDA_INDEXED(cortado::kernels::SumTops<cortado::kernels::BF16Codes>)
CORTADO_CUDA_INDEXED(cortado::kernels::SumTops<cortado::kernels::F16Codes>)
