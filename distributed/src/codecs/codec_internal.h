// Internals of the gradient codecs (cortado/dist/codec.h), shared by the files of codecs/ and the
// tests: the format parameters, the random-word hash, which kernel set runs, and each kernel set
// callable with its ISA named, so a test can hold the portable, AVX2 and AVX-512 kernels against
// each other in one process whatever CORTADO_CODEC_ISA says.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs/codec_values.h"
#include "cortado/dist/codec.h"

// The AVX2 kernels need GCC or Clang's target attribute and an x86 CPU; elsewhere only the
// portable ones exist.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define CORTADO_CODEC_HAVE_AVX2 1
#else
#define CORTADO_CODEC_HAVE_AVX2 0
#endif
// The AVX-512 kernels also need 64-bit mask registers moved to and from general registers:
// x86-64 only.
#if CORTADO_CODEC_HAVE_AVX2 && defined(__x86_64__)
#define CORTADO_CODEC_HAVE_AVX512 1
#else
#define CORTADO_CODEC_HAVE_AVX512 0
#endif

namespace cortado::dist::codec_internal {

// Format, FormatOf, the random-word hash (HashBase, HashKey, Fmix32) and the per-value and
// per-group functions: codec_values.h, shared with the CUDA kernels.

// Whether a block of `lanes` indices from `index` reaches the end of the lower index word
// (straddling it, or ending on it): HashKey changes inside it, so a vector stream draws such a
// block the scalar way and restarts after it.
inline bool BlockReachesWrap(uint64_t index, uint32_t lanes) {
  return static_cast<uint32_t>(index) >= 0u - lanes;
}

// Kernel sets, in order: each later one needs what the earlier ones do.
enum class Isa : uint8_t { kPortable, kAvx2, kAvx512 };
const char* IsaName(Isa isa);  // "portable", "avx2", "avx512"
// Whether this CPU (and build) can run the AVX2 kernels: AVX2 and F16C.
bool CpuHasAvx2();
// Whether it can run the AVX-512 kernels: those of CpuHasAvx2 and AVX-512 F, BW, DQ, VL, VBMI
// (with the OS saving the ZMM and mask registers).
bool CpuHasAvx512();
// The best kernel set this CPU and build can run.
Isa BestIsa();
// The kernel set for a CORTADO_CODEC_ISA value (null or empty or "auto": `best`, what the CPU
// has). Throws kConfig naming the variable for an unknown value, or for a set above `best`.
Isa ResolveIsa(const char* env_value, Isa best);
// `best` capped by a CORTADO_CPU_ISA value, the cap every run-time kernel choice of the project
// follows (null or empty or "auto": `best`; "avx2", "avx512": at most that set, and what the
// CPU has below it). Throws kConfig naming the variable for an unknown value.
Isa CapIsa(const char* cpu_isa_value, Isa best);
// ResolveIsa of this process's environment (CORTADO_CODEC_ISA, under the CORTADO_CPU_ISA cap)
// and CPU, decided once.
Isa ActiveIsa();

// The public entry points with the kernel set chosen by the caller (arguments already checked;
// Isa::kAvx2 only where CpuHasAvx2(), Isa::kAvx512 only where CpuHasAvx512()).
void EncodeWith(Isa isa, CodecKind kind, const float* src, size_t count, void* dst,
                const EncodeOptions& options, float* residual);
void DecodeWith(Isa isa, CodecKind kind, const void* src, size_t count, float* dst,
                bool accumulate);

// The kernel sets, by ISA: any count, src at any alignment, dst at any byte offset. The AVX-512
// set runs its vector loops over whole blocks and hands the rest to the AVX2 set, which does the
// same with the portable set (codec_dispatch.h): so both must accept a start in the middle of a
// stream, their (src, dst, first_index) being the caller's advanced by a multiple of 8 values
// (dst starts at a group boundary). Defined for kAvx2 only where CORTADO_CODEC_HAVE_AVX2, for
// kAvx512 only where CORTADO_CODEC_HAVE_AVX512.
template <Isa I>
void EncodeSet(CodecKind kind, const float* src, size_t count, uint8_t* dst,
               const EncodeOptions& options, float* residual);
template <Isa I>
void DecodeSet(CodecKind kind, const uint8_t* src, size_t count, float* dst, bool accumulate);

}  // namespace cortado::dist::codec_internal
