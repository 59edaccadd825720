// Gradient codecs: names and sizes, the scalar reference of one value (EncodeValue,
// DecodeValue, StochasticBits: the specification), the choice of kernel set, and the public
// entry points. The kernel sets are codec_portable.cpp, codec_avx2.cpp and codec_avx512.cpp.
#include "cortado/dist/codec.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "codecs/codec_internal.h"
#include "common/names.h"
#include "cortado/dist/error.h"
#include "cortado/dist/types.h"

#if CORTADO_CODEC_HAVE_AVX2
#include <cpuid.h>
#endif

namespace cortado::dist {

using codec_internal::Format;
using codec_internal::FormatOf;

namespace {

void CheckKind(CodecKind kind) {
  if (static_cast<unsigned>(kind) > static_cast<unsigned>(CodecKind::kEpgc8)) {
    Fail(ErrorKind::kInvalidArgument, "unknown codec kind ", static_cast<unsigned>(kind));
  }
}

void CheckRounding(Rounding rounding) {
  if (static_cast<unsigned>(rounding) > static_cast<unsigned>(Rounding::kStochastic)) {
    Fail(ErrorKind::kInvalidArgument, "unknown rounding mode ", static_cast<unsigned>(rounding));
  }
}

}  // namespace

constexpr internal::Spelling<CodecKind> kCodecNames[] = {
    {CodecKind::kF32, "f32"},       {CodecKind::kF16, "f16"},     {CodecKind::kBF16, "bf16"},
    {CodecKind::kEpgc11, "epgc11"}, {CodecKind::kEpgc9, "epgc9"}, {CodecKind::kEpgc8, "epgc8"},
    {CodecKind::kF32, "fp32"},      {CodecKind::kF32, "float32"}, {CodecKind::kF32, "none"},
    {CodecKind::kF16, "fp16"},      {CodecKind::kF16, "float16"}, {CodecKind::kF16, "half"},
    {CodecKind::kBF16, "bfloat16"}};
constexpr internal::Spelling<Rounding> kRoundingNames[] = {{Rounding::kNearest, "nearest"},
                                                           {Rounding::kTruncate, "truncate"},
                                                           {Rounding::kStochastic, "stochastic"}};

const char* CodecName(CodecKind kind) { return internal::NameOf(kCodecNames, kind); }

CodecKind ParseCodec(const std::string& name) {
  if (auto kind = internal::FindName(kCodecNames, name)) return *kind;
  Fail(ErrorKind::kInvalidArgument, "unknown codec '", name,
       "' (known: ", internal::KnownNames(kCodecNames), ")");
}

const char* RoundingName(Rounding rounding) { return internal::NameOf(kRoundingNames, rounding); }

Rounding ParseRounding(const std::string& name) {
  if (auto rounding = internal::FindName(kRoundingNames, name)) return *rounding;
  Fail(ErrorKind::kInvalidArgument, "unknown rounding '", name,
       "' (known: ", internal::KnownNames(kRoundingNames), ")");
}

int CodecBits(CodecKind kind) {
  CheckKind(kind);
  if (kind == CodecKind::kF32) return 32;
  const Format f = FormatOf(kind);
  return 1 + f.e + f.m;
}

size_t EncodedBytes(CodecKind kind, size_t count) {
  // Whole groups of 8 take exactly `bits` bytes; split so count * bits cannot overflow.
  const size_t bits = static_cast<size_t>(CodecBits(kind));
  return count / 8 * bits + (count % 8 * bits + 7) / 8;
}

float CodecMaxFinite(CodecKind kind) {
  CheckKind(kind);
  if (kind == CodecKind::kF32) return FLT_MAX;
  const Format f = FormatOf(kind);
  // The largest exponent field below infinity's, with every mantissa bit set.
  const uint32_t code = ((1u << f.e) - 2) << f.m | ((1u << f.m) - 1);
  return DecodeValue(kind, code);
}

// ---- The scalar reference ----------------------------------------------------------------
// Written for clarity, in 64-bit arithmetic where a shift can exceed 31; the kernels compute
// the same thing in 32-bit lanes and are tested bitwise against this.

uint32_t EncodeValue(CodecKind kind, float x, Rounding rounding, uint32_t r) {
  CheckKind(kind);
  CheckRounding(rounding);
  const uint32_t u = FloatToBits(x);
  if (kind == CodecKind::kF32) return u;
  const Format f = FormatOf(kind);
  const uint32_t sign = u >> 31, ef = (u >> 23) & 255u, man = u & 0x7fffffu;
  const uint32_t emax = (1u << f.e) - 1;
  const uint32_t inf = emax << f.m;
  const uint32_t sign_code = sign << (f.e + f.m);
  if (ef == 255) {
    if (man == 0) return sign_code | inf;
    // NaN: the canonical quiet NaN (epgc9 has no mantissa bit for it: an infinity).
    return sign_code | inf | (f.m > 0 ? 1u << (f.m - 1) : 0u);
  }
  // x = sig * 2^(e1 - 150); the target's unit in the last place is 2^s units of sig.
  const uint64_t sig = man | (ef != 0 ? 1u << 23 : 0u);
  const int e1 = std::max<int>(static_cast<int>(ef), 1);
  const int te = e1 - 127 + f.bias;  // the exponent field x would have in the target
  int s;
  uint64_t base;
  if (te >= 1) {
    s = 23 - f.m;
    base = static_cast<uint64_t>(te - 1) << f.m;  // q holds the implicit bit: (te-1) + 1
  } else {
    s = std::min(23 - f.m + (1 - te), 40);  // a subnormal of the target
    base = 0;
  }
  const uint64_t q = sig >> s;
  const uint64_t rem = sig & ((uint64_t{1} << s) - 1);
  uint64_t up = 0;
  switch (rounding) {
    case Rounding::kTruncate:
      break;
    case Rounding::kNearest: {
      const uint64_t half = uint64_t{1} << (s - 1);  // s >= 13
      up = (rem > half || (rem == half && (q & 1) != 0)) ? 1 : 0;
      break;
    }
    case Rounding::kStochastic: {
      // Up with probability rem / 2^s: compare r with rem scaled to 32 bits.
      const uint64_t threshold = s <= 32 ? rem << (32 - s) : rem >> (s - 32);
      up = static_cast<uint64_t>(r) < threshold ? 1 : 0;
      break;
    }
  }
  // A carry out of the mantissa moves to the next exponent (and subnormal to normal).
  uint64_t mag = base + q + up;
  if (mag >= inf) mag = inf;  // overflow is an infinity in every mode
  return sign_code | static_cast<uint32_t>(mag);
}

float DecodeValue(CodecKind kind, uint32_t code) {
  CheckKind(kind);
  if (kind == CodecKind::kF32) return BitsToFloat(code);
  const Format f = FormatOf(kind);
  code &= (1u << (1 + f.e + f.m)) - 1;
  if (f.e == 8) {
    // fp32's exponent: the code is the top of an fp32 (epgc9's field 255 is infinity).
    const uint32_t sign = code >> (f.e + f.m);
    return BitsToFloat(sign << 31 | (code & ((1u << (f.e + f.m)) - 1)) << (23 - f.m));
  }
  return HalfToFloat(static_cast<uint16_t>(code << (10 - f.m)));  // the top of an f16
}

uint32_t StochasticBits(uint64_t seed, uint64_t index) {
  using namespace codec_internal;
  return Fmix32(HashBase(seed, index) ^ HashKey(seed, index));
}

// ---- Choice of kernels ----------------------------------------------------------------------

namespace codec_internal {

constexpr internal::Spelling<Isa> kIsaNames[] = {
    {Isa::kPortable, "portable"}, {Isa::kAvx2, "avx2"}, {Isa::kAvx512, "avx512"}};

const char* IsaName(Isa isa) { return internal::NameOf(kIsaNames, isa); }

bool CpuHasAvx2() {
#if CORTADO_CODEC_HAVE_AVX2
  // The compiler runtime's AVX2 check includes the OS saving the YMM registers; F16C is asked
  // of CPUID directly (leaf 1, ECX bit 29), as not every compiler's builtin knows it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  return __builtin_cpu_supports("avx2") && f16c;
#else
  return false;
#endif
}

bool CpuHasAvx512() {
#if CORTADO_CODEC_HAVE_AVX512
  // The compiler runtime reports AVX-512 features only where the OS saves the ZMM and mask
  // registers (XCR0).
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vbmi");
#else
  return false;
#endif
}

Isa BestIsa() { return CpuHasAvx512() ? Isa::kAvx512 : CpuHasAvx2() ? Isa::kAvx2 : Isa::kPortable; }

Isa ResolveIsa(const char* env_value, Isa best) {
  const std::string value = env_value != nullptr ? env_value : "";
  if (value.empty() || value == "auto") return best;
  if (value == "portable") return Isa::kPortable;
  if (value == "avx2") {
    if (best < Isa::kAvx2) {
      Fail(ErrorKind::kConfig, "CORTADO_CODEC_ISA=avx2, but ",
           CORTADO_CODEC_HAVE_AVX2 ? "this CPU lacks AVX2 or F16C (or CORTADO_CPU_ISA caps it)"
                                   : "this build has no AVX2 kernels (not x86)");
    }
    return Isa::kAvx2;
  }
  if (value == "avx512") {
    if (best < Isa::kAvx512) {
      Fail(ErrorKind::kConfig, "CORTADO_CODEC_ISA=avx512, but ",
           CORTADO_CODEC_HAVE_AVX512
               ? "this CPU lacks one of AVX-512 F, BW, DQ, VL, VBMI, or AVX2 and F16C (or "
                 "CORTADO_CPU_ISA caps it)"
               : "this build has no AVX-512 kernels (not x86-64)");
    }
    return Isa::kAvx512;
  }
  Fail(ErrorKind::kConfig, "CORTADO_CODEC_ISA='", value,
       "': expected portable, avx2, avx512 or auto");
}

Isa CapIsa(const char* cpu_isa_value, Isa best) {
  const std::string value = cpu_isa_value != nullptr ? cpu_isa_value : "";
  if (value.empty() || value == "auto") return best;
  if (value == "avx2") return std::min(best, Isa::kAvx2);
  if (value == "avx512") return std::min(best, Isa::kAvx512);
  Fail(ErrorKind::kConfig, "CORTADO_CPU_ISA='", value, "': expected avx2, avx512 or auto");
}

Isa ActiveIsa() {
  // Decided once; a malformed value throws on every call (the static stays uninitialized).
  static const Isa isa = ResolveIsa(std::getenv("CORTADO_CODEC_ISA"),
                                    CapIsa(std::getenv("CORTADO_CPU_ISA"), BestIsa()));
  return isa;
}

void EncodeWith(Isa isa, CodecKind kind, const float* src, size_t count, void* dst,
                const EncodeOptions& options, float* residual) {
  if (count == 0) return;
  auto* out = static_cast<uint8_t*>(dst);
#if CORTADO_CODEC_HAVE_AVX512
  if (isa == Isa::kAvx512) return EncodeSet<Isa::kAvx512>(kind, src, count, out, options, residual);
#endif
#if CORTADO_CODEC_HAVE_AVX2
  if (isa == Isa::kAvx2) return EncodeSet<Isa::kAvx2>(kind, src, count, out, options, residual);
#endif
  EncodeSet<Isa::kPortable>(kind, src, count, out, options, residual);
}

void DecodeWith(Isa isa, CodecKind kind, const void* src, size_t count, float* dst,
                bool accumulate) {
  if (count == 0) return;
  const auto* in = static_cast<const uint8_t*>(src);
#if CORTADO_CODEC_HAVE_AVX512
  if (isa == Isa::kAvx512) return DecodeSet<Isa::kAvx512>(kind, in, count, dst, accumulate);
#endif
#if CORTADO_CODEC_HAVE_AVX2
  if (isa == Isa::kAvx2) return DecodeSet<Isa::kAvx2>(kind, in, count, dst, accumulate);
#endif
  DecodeSet<Isa::kPortable>(kind, in, count, dst, accumulate);
}

}  // namespace codec_internal

const char* CodecIsa() { return codec_internal::IsaName(codec_internal::ActiveIsa()); }

// ---- Public entry points ------------------------------------------------------------------

namespace {

// Whether a call has values to convert; throws kInvalidArgument naming the call for a null
// buffer when it has.
bool HasWork(const char* call, CodecKind kind, size_t count, const void* src, const void* dst,
             const char* dst_name) {
  if (count == 0) return false;
  if (src == nullptr || dst == nullptr) {
    Fail(ErrorKind::kInvalidArgument, call, "(", CodecName(kind), "): null ",
         src == nullptr ? "src" : dst_name, " for ", count, " values");
  }
  return true;
}

}  // namespace

void Encode(CodecKind kind, const float* src, size_t count, void* dst, const EncodeOptions& options,
            float* residual) {
  CheckKind(kind);
  CheckRounding(options.rounding);
  if (!HasWork("Encode", kind, count, src, dst, "dst")) return;
  codec_internal::EncodeWith(codec_internal::ActiveIsa(), kind, src, count, dst, options, residual);
}

void Decode(CodecKind kind, const void* src, size_t count, float* dst) {
  CheckKind(kind);
  if (!HasWork("Decode", kind, count, src, dst, "dst")) return;
  codec_internal::DecodeWith(codec_internal::ActiveIsa(), kind, src, count, dst, false);
}

void DecodeAccumulate(CodecKind kind, const void* src, size_t count, float* acc) {
  CheckKind(kind);
  if (!HasWork("DecodeAccumulate", kind, count, src, acc, "acc")) return;
  codec_internal::DecodeWith(codec_internal::ActiveIsa(), kind, src, count, acc, true);
}

}  // namespace cortado::dist
