// Which CPU kernel sets run-time dispatch may choose, and a one-line description of the CPU
// for logs and benchmarks.
//
// Kernels picked at run time take the widest set this CPU has: oneDNN's GEMMs (f32, and bf16
// where the CPU has AVX512_BF16) and the gradient codecs (distributed/). CORTADO_CPU_ISA caps
// all of them at once, so one machine can run what another computes:
//   auto    (default) whatever this CPU has;
//   avx2    as on a CPU with AVX2, FMA and F16C and no AVX-512: oneDNN's AVX2 kernels, bf16
//           products widened to f32, the codecs' AVX2 kernels;
//   avx512  as on a CPU with AVX-512 (F, BW, DQ, VL) and no AVX512_BF16 or AMX.
// A cap above what the CPU has is an error naming the missing extension. What the compiler
// vectorized follows the build's -march instead (CORTADO_MARCH: the layers' `omp simd`
// reductions sum in its vector width), so scripts/test.sh's forced-AVX2 stage builds with
// CORTADO_MARCH=x86-64-v3 and runs with CORTADO_CPU_ISA=avx2 (and OPENBLAS_CORETYPE=Haswell,
// which OpenBLAS reads when it loads, for the f64 products).
//
// Thread-safe; the cap is applied to oneDNN once, before its first use, by the engine itself
// (ApplyCpuIsaCap is called on every path into oneDNN), so callers need not call it.
#pragma once

#include <string>

namespace cortado {

// The value of CORTADO_CPU_ISA ("auto" when unset); throws for a value it does not take.
std::string CpuIsaCap();
// Applies the cap to oneDNN (once per process; later calls return at once). Throws where the
// cap is above this CPU, naming the variable and the missing extension.
void ApplyCpuIsaCap();
// "<model name> (AVX2 FMA F16C AVX-512 AVX512_BF16 AMX; kernels: oneDNN avx512_core_bf16,
// codecs avx512)": the CPU as /proc/cpuinfo names it, the extensions that matter here, and the
// sets in use after the cap.
std::string CpuDescription();

}  // namespace cortado
