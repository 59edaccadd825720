// Gradient codecs: names and sizes, the scalar reference of one value (EncodeValue,
// DecodeValue, StochasticBits: the specification), the choice of kernel set, and the portable
// kernels. The portable kernels work on blocks of kBlock values in stack buffers: codes are
// computed by branch-free per-value functions (so loops over them vectorize where the compiler
// may), then packed; they are written independently of the reference and tested against it.
#include "cortado/dist/codec.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "codecs/codec_internal.h"
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

const char* CodecName(CodecKind kind) {
  switch (kind) {
    case CodecKind::kF32:
      return "f32";
    case CodecKind::kF16:
      return "f16";
    case CodecKind::kBF16:
      return "bf16";
    case CodecKind::kEpgc11:
      return "epgc11";
    case CodecKind::kEpgc9:
      return "epgc9";
    case CodecKind::kEpgc8:
      return "epgc8";
  }
  return "?";
}

CodecKind ParseCodec(const std::string& name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "none")
    return CodecKind::kF32;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half")
    return CodecKind::kF16;
  if (name == "bf16" || name == "bfloat16") return CodecKind::kBF16;
  if (name == "epgc11") return CodecKind::kEpgc11;
  if (name == "epgc9") return CodecKind::kEpgc9;
  if (name == "epgc8") return CodecKind::kEpgc8;
  Fail(ErrorKind::kInvalidArgument, "unknown codec '", name,
       "' (known: f32, f16, bf16, epgc11, epgc9, epgc8)");
}

const char* RoundingName(Rounding rounding) {
  switch (rounding) {
    case Rounding::kNearest:
      return "nearest";
    case Rounding::kTruncate:
      return "truncate";
    case Rounding::kStochastic:
      return "stochastic";
  }
  return "?";
}

Rounding ParseRounding(const std::string& name) {
  if (name == "nearest") return Rounding::kNearest;
  if (name == "truncate") return Rounding::kTruncate;
  if (name == "stochastic") return Rounding::kStochastic;
  Fail(ErrorKind::kInvalidArgument, "unknown rounding '", name,
       "' (known: nearest, truncate, stochastic)");
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
  return Fmix32((static_cast<uint32_t>(index) * kHashLo + static_cast<uint32_t>(seed)) ^
                HashKey(seed, index));
}

// ---- Choice of kernels ----------------------------------------------------------------------

namespace codec_internal {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

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
           CORTADO_CODEC_HAVE_AVX2 ? "this CPU lacks AVX2 or F16C"
                                   : "this build has no AVX2 kernels (not x86)");
    }
    return Isa::kAvx2;
  }
  if (value == "avx512") {
    if (best < Isa::kAvx512) {
      Fail(ErrorKind::kConfig, "CORTADO_CODEC_ISA=avx512, but ",
           CORTADO_CODEC_HAVE_AVX512
               ? "this CPU lacks one of AVX-512 F, BW, DQ, VL, VBMI, or AVX2 and F16C"
               : "this build has no AVX-512 kernels (not x86-64)");
    }
    return Isa::kAvx512;
  }
  Fail(ErrorKind::kConfig, "CORTADO_CODEC_ISA='", value,
       "': expected portable, avx2, avx512 or auto");
}

Isa ActiveIsa() {
  // Decided once; a malformed value throws on every call (the static stays uninitialized).
  static const Isa isa = ResolveIsa(std::getenv("CORTADO_CODEC_ISA"), BestIsa());
  return isa;
}

}  // namespace codec_internal

const char* CodecIsa() { return codec_internal::IsaName(codec_internal::ActiveIsa()); }

// ---- Portable kernels ---------------------------------------------------------------------

namespace codec_internal {
namespace {

constexpr size_t kBlock = 512;  // values per pass (a multiple of 8: blocks start at groups)
static_assert(kBlock % 8 == 0);

// The code of fp32 bits u (EncodeValue), branch-free. E8 formats (bf16, epgc9) share fp32's
// exponent, so base + q of the reference is simply abs >> s; the E5 formats need a per-value s.
template <CodecKind K, Rounding R>
inline uint32_t EncodeBits(uint32_t u, uint32_t r) {
  constexpr Format f = FormatOf(K);
  constexpr uint32_t inf = ((1u << f.e) - 1) << f.m;
  constexpr uint32_t qnan = f.m > 0 ? 1u << (f.m > 0 ? f.m - 1 : 0) : 0u;
  const uint32_t abs = u & 0x7fffffffu;
  uint32_t mag;
  if constexpr (f.e == 8) {
    constexpr int s = 23 - f.m;
    if constexpr (R == Rounding::kNearest) {
      // Ties go to an even q: q's low bit is abs's bit s, except for epgc9 (q is the implicit
      // bit alone: 1 for normal x, 0 for subnormal).
      const uint32_t odd = f.m > 0 ? (abs >> s) & 1u : (abs >= 0x800000u ? 1u : 0u);
      mag = (abs + ((1u << (s - 1)) - 1) + odd) >> s;
    } else if constexpr (R == Rounding::kTruncate) {
      mag = abs >> s;
    } else {
      const uint32_t rem = abs & ((1u << s) - 1);
      mag = (abs >> s) + (r < (rem << (32 - s)) ? 1u : 0u);
    }
  } else {
    const uint32_t ef = abs >> 23;
    const uint32_t sig = (u & 0x7fffffu) | (ef != 0 ? 0x800000u : 0u);
    const int e1 = std::max(static_cast<int>(ef), 1);
    constexpr int kNormal = 127 - f.bias + 1;  // e1 from which x is normal in the target
    const uint32_t base = static_cast<uint32_t>(std::max(e1 - kNormal, 0)) << f.m;
    const int s = 23 - f.m + std::max(kNormal - e1, 0);
    if constexpr (R == Rounding::kNearest) {
      const int sn = std::min(s, 25);  // from 25 on, x is below half the smallest subnormal
      const uint32_t odd = (sig >> sn) & 1u;
      mag = base + ((sig + ((1u << (sn - 1)) - 1) + odd) >> sn);
    } else if constexpr (R == Rounding::kTruncate) {
      mag = base + (s < 32 ? sig >> s : 0u);
    } else {
      const int sc = std::min(s, 40);
      const uint32_t q = sc < 32 ? sig >> sc : 0u;
      const uint32_t rem = sc < 32 ? sig & ((1u << sc) - 1) : sig;
      const uint32_t threshold = sc <= 32 ? rem << (32 - sc) : rem >> (sc - 32);
      mag = base + q + (r < threshold ? 1u : 0u);
    }
  }
  mag = std::min(mag, inf);
  if (abs > 0x7f800000u) mag |= qnan;
  return mag | (u >> 31) << (f.e + f.m);
}

// All ones where `condition`, else 0: selects by masks keep the loops free of branches (and
// so vectorizable).
inline uint32_t Mask(bool condition) { return 0u - static_cast<uint32_t>(condition); }

// HalfToFloat on bits, branch-free (equal on all 65,536 inputs: tested).
inline uint32_t HalfBitsToFloatBits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t a = h & 0x7fffu;
  const uint32_t exp = a >> 10;
  const uint32_t normal = (a << 13) + (112u << 23);  // rebias 15 -> 127
  const uint32_t special = normal + (112u << 23);    // field 31 -> 255, payload kept
  const uint32_t sub = FloatToBits(static_cast<float>(a) * 0x1p-24f);  // a < 1024: exact
  const uint32_t is_sub = Mask(exp == 0), is_special = Mask(exp == 31);
  return sign | (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
}

// fp32 bits of a code (DecodeValue).
template <CodecKind K>
inline uint32_t DecodeBits(uint32_t code) {
  constexpr Format f = FormatOf(K);
  if constexpr (f.e == 8) {
    return code << (31 - f.e - f.m);  // sign lands on bit 31, the rest on fp32's places
  } else {
    return HalfBitsToFloatBits(code << (10 - f.m));
  }
}

// residual += x - d where both are finite, else += 0. If x or d is not finite, x - d is not
// either, and when both are, |x - d| is below one gap of the format: so testing the difference
// is the same test, and it keeps the loop free of branches.
inline float Loss(float x, float d) {
  const uint32_t diff = FloatToBits(x - d);
  return BitsToFloat(diff & ~Mask((diff & 0x7f800000u) == 0x7f800000u));
}

void RandomWords(uint64_t seed, uint64_t first, size_t n, uint32_t* r) {
  const uint32_t lo = static_cast<uint32_t>(first);
  if (lo + static_cast<uint64_t>(n) <= (uint64_t{1} << 32)) {
    // The upper index word is the same for all n: hoist it.
    const uint32_t key = HashKey(seed, first), seed_lo = static_cast<uint32_t>(seed);
    for (size_t i = 0; i < n; ++i) {
      r[i] = Fmix32(((lo + static_cast<uint32_t>(i)) * kHashLo + seed_lo) ^ key);
    }
  } else {
    for (size_t i = 0; i < n; ++i) r[i] = StochasticBits(seed, first + i);
  }
}

// Bit-packed formats: per group of k <= 8 values, k high bytes, then the L-bit low parts as
// L*k bits in bit-plane order.
template <CodecKind K>
struct Split;
template <>
struct Split<CodecKind::kEpgc11> {
  static constexpr int kLow = 3;
  static uint32_t High(uint32_t c) { return c >> 3; }
  static uint32_t Low(uint32_t c) { return c & 7u; }
  static uint32_t Join(uint32_t high, uint32_t low) { return high << 3 | low; }
};
template <>
struct Split<CodecKind::kEpgc9> {
  static constexpr int kLow = 1;
  static uint32_t High(uint32_t c) { return c & 0xffu; }
  static uint32_t Low(uint32_t c) { return c >> 8; }
  static uint32_t Join(uint32_t high, uint32_t low) { return low << 8 | high; }
};

// Whole groups in two passes: a plain loop (which vectorizes) splits the codes into a byte of
// high part and a byte of low part each; then per group the 8 high bytes are copied and the
// planes gathered by 64-bit multiplies: with the 8 low parts one per byte of w, bit p of every
// byte lands in one byte by (w >> p & 0x0101..01) * 0x0102040810204080 >> 56 (byte j's bit on
// bit 56 + j, no two partial products meeting). Back, a plane byte spread over 8 bytes keeps bit
// j in byte j by a mask, which adding 0x7f per byte moves to the byte's top bit.
constexpr uint64_t kByteLsbs = 0x0101010101010101ull;
constexpr uint64_t kGather = 0x0102040810204080ull;
constexpr uint64_t kBitOfByte = 0x8040201008040201ull;

// 8 bytes as a little-endian word and back (the bytes of value j are byte j).
inline uint64_t LoadLittleEndian64(const uint8_t* src) {
  uint64_t v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, src, 8);
  } else {
    for (int b = 0; b < 8; ++b) v |= uint64_t{src[b]} << 8 * b;
  }
  return v;
}
inline void StoreLittleEndian64(uint8_t* dst, uint64_t v) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(dst, &v, 8);
  } else {
    for (int b = 0; b < 8; ++b) dst[b] = static_cast<uint8_t>(v >> 8 * b);
  }
}

template <CodecKind K>
void PackGroups(const uint32_t* codes, size_t n, uint8_t* dst) {
  using S = Split<K>;
  uint8_t high[kBlock], low[kBlock];
  for (size_t i = 0; i < n; ++i) {
    high[i] = static_cast<uint8_t>(S::High(codes[i]));
    low[i] = static_cast<uint8_t>(S::Low(codes[i]));
  }
  size_t g = 0;
  for (; g + 8 <= n; g += 8, dst += 8 + S::kLow) {
    std::memcpy(dst, high + g, 8);
    const uint64_t w = LoadLittleEndian64(low + g);
    for (int p = 0; p < S::kLow; ++p) {
      dst[8 + p] = static_cast<uint8_t>(((w >> p) & kByteLsbs) * kGather >> 56);
    }
  }
  if (g < n) {  // the last, partial group
    const size_t k = n - g;
    uint32_t planes = 0;  // at most 3 * 7 bits
    for (size_t j = 0; j < k; ++j) {
      dst[j] = high[g + j];
      for (int p = 0; p < S::kLow; ++p) planes |= ((low[g + j] >> p) & 1u) << (p * k + j);
    }
    for (size_t b = 0; b < (S::kLow * k + 7) / 8; ++b)
      dst[k + b] = static_cast<uint8_t>(planes >> 8 * b);
  }
}

template <CodecKind K>
void UnpackGroups(const uint8_t* src, size_t n, uint32_t* codes) {
  using S = Split<K>;
  uint8_t high[kBlock], low[kBlock];
  size_t g = 0;
  for (; g + 8 <= n; g += 8, src += 8 + S::kLow) {
    std::memcpy(high + g, src, 8);
    uint64_t w = 0;
    for (int p = 0; p < S::kLow; ++p) {
      const uint64_t bits = (src[8 + p] * kByteLsbs) & kBitOfByte;  // byte j: bit j or 0
      w |= ((bits + 0x7f7f7f7f7f7f7f7full) & 0x8080808080808080ull) >> (7 - p);
    }
    StoreLittleEndian64(low + g, w);
  }
  if (g < n) {  // the last, partial group
    const size_t k = n - g;
    uint32_t planes = 0;
    for (size_t b = 0; b < (S::kLow * k + 7) / 8; ++b) planes |= uint32_t{src[k + b]} << 8 * b;
    for (size_t j = 0; j < k; ++j) {
      uint32_t bits = 0;
      for (int p = 0; p < S::kLow; ++p) bits |= ((planes >> (p * k + j)) & 1u) << p;
      high[g + j] = src[j];
      low[g + j] = static_cast<uint8_t>(bits);
    }
  }
  for (size_t i = 0; i < n; ++i) codes[i] = S::Join(high[i], low[i]);
}

template <CodecKind K>
void Pack(const uint32_t* codes, size_t n, uint8_t* dst) {
  if constexpr (K == CodecKind::kF16 || K == CodecKind::kBF16) {
    for (size_t i = 0; i < n; ++i) {  // little-endian 16-bit words
      dst[2 * i] = static_cast<uint8_t>(codes[i]);
      dst[2 * i + 1] = static_cast<uint8_t>(codes[i] >> 8);
    }
  } else if constexpr (K == CodecKind::kEpgc8) {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(codes[i]);
  } else {
    PackGroups<K>(codes, n, dst);
  }
}

template <CodecKind K>
void Unpack(const uint8_t* src, size_t n, uint32_t* codes) {
  if constexpr (K == CodecKind::kF16 || K == CodecKind::kBF16) {
    for (size_t i = 0; i < n; ++i) codes[i] = uint32_t{src[2 * i]} | uint32_t{src[2 * i + 1]} << 8;
  } else if constexpr (K == CodecKind::kEpgc8) {
    for (size_t i = 0; i < n; ++i) codes[i] = src[i];
  } else {
    UnpackGroups<K>(src, n, codes);
  }
}

template <CodecKind K, Rounding R>
void EncodeBlocks(const float* src, size_t count, uint8_t* dst, const EncodeOptions& options,
                  float* residual) {
  uint32_t in[kBlock], codes[kBlock], rnd[kBlock];
  const auto* bytes = reinterpret_cast<const uint8_t*>(src);  // src may be unaligned
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    std::memcpy(in, bytes + done * 4, n * 4);
    if constexpr (R == Rounding::kStochastic) {
      RandomWords(options.seed, options.first_index + done, n, rnd);
      for (size_t i = 0; i < n; ++i) codes[i] = EncodeBits<K, R>(in[i], rnd[i]);
    } else {
      for (size_t i = 0; i < n; ++i) codes[i] = EncodeBits<K, R>(in[i], 0);
    }
    if (residual != nullptr) {
      float* res = residual + done;
      for (size_t i = 0; i < n; ++i) {
        res[i] = res[i] + Loss(BitsToFloat(in[i]), BitsToFloat(DecodeBits<K>(codes[i])));
      }
    }
    Pack<K>(codes, n, dst + EncodedBytes(K, done));
  }
}

template <CodecKind K, bool kAccumulate>
void DecodeBlocks(const uint8_t* src, size_t count, float* dst) {
  uint32_t codes[kBlock];
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    float* out = dst + done;
    if constexpr (K == CodecKind::kF32) {
      const uint8_t* in = src + done * 4;  // any alignment: read each float by memcpy
      for (size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, in + 4 * i, 4);
        out[i] = out[i] + v;  // accumulate only: a plain decode is a memcpy
      }
    } else {
      Unpack<K>(src + EncodedBytes(K, done), n, codes);
      for (size_t i = 0; i < n; ++i) {
        const float d = BitsToFloat(DecodeBits<K>(codes[i]));
        out[i] = kAccumulate ? out[i] + d : d;
      }
    }
  }
}

template <CodecKind K>
void EncodeKind(const float* src, size_t count, uint8_t* dst, const EncodeOptions& options,
                float* residual) {
  switch (options.rounding) {
    case Rounding::kNearest:
      return EncodeBlocks<K, Rounding::kNearest>(src, count, dst, options, residual);
    case Rounding::kTruncate:
      return EncodeBlocks<K, Rounding::kTruncate>(src, count, dst, options, residual);
    case Rounding::kStochastic:
      return EncodeBlocks<K, Rounding::kStochastic>(src, count, dst, options, residual);
  }
}

template <CodecKind K>
void DecodeKind(const uint8_t* src, size_t count, float* dst, bool accumulate) {
  if (accumulate) {
    DecodeBlocks<K, true>(src, count, dst);
  } else {
    DecodeBlocks<K, false>(src, count, dst);
  }
}

}  // namespace

void EncodePortable(CodecKind kind, const float* src, size_t count, uint8_t* dst,
                    const EncodeOptions& options, float* residual) {
  switch (kind) {
    case CodecKind::kF32:
      std::memcpy(dst, src, count * 4);  // lossless: the residual gains nothing
      return;
    case CodecKind::kF16:
      return EncodeKind<CodecKind::kF16>(src, count, dst, options, residual);
    case CodecKind::kBF16:
      return EncodeKind<CodecKind::kBF16>(src, count, dst, options, residual);
    case CodecKind::kEpgc11:
      return EncodeKind<CodecKind::kEpgc11>(src, count, dst, options, residual);
    case CodecKind::kEpgc9:
      return EncodeKind<CodecKind::kEpgc9>(src, count, dst, options, residual);
    case CodecKind::kEpgc8:
      return EncodeKind<CodecKind::kEpgc8>(src, count, dst, options, residual);
  }
}

void DecodePortable(CodecKind kind, const uint8_t* src, size_t count, float* dst, bool accumulate) {
  switch (kind) {
    case CodecKind::kF32:
      if (!accumulate) {
        std::memcpy(dst, src, count * 4);
        return;
      }
      return DecodeKind<CodecKind::kF32>(src, count, dst, true);
    case CodecKind::kF16:
      return DecodeKind<CodecKind::kF16>(src, count, dst, accumulate);
    case CodecKind::kBF16:
      return DecodeKind<CodecKind::kBF16>(src, count, dst, accumulate);
    case CodecKind::kEpgc11:
      return DecodeKind<CodecKind::kEpgc11>(src, count, dst, accumulate);
    case CodecKind::kEpgc9:
      return DecodeKind<CodecKind::kEpgc9>(src, count, dst, accumulate);
    case CodecKind::kEpgc8:
      return DecodeKind<CodecKind::kEpgc8>(src, count, dst, accumulate);
  }
}

void EncodeWith(Isa isa, CodecKind kind, const float* src, size_t count, void* dst,
                const EncodeOptions& options, float* residual) {
  if (count == 0) return;
  auto* out = static_cast<uint8_t*>(dst);
#if CORTADO_CODEC_HAVE_AVX512
  if (isa == Isa::kAvx512) return EncodeAvx512(kind, src, count, out, options, residual);
#endif
#if CORTADO_CODEC_HAVE_AVX2
  if (isa == Isa::kAvx2) return EncodeAvx2(kind, src, count, out, options, residual);
#endif
  EncodePortable(kind, src, count, out, options, residual);
}

void DecodeWith(Isa isa, CodecKind kind, const void* src, size_t count, float* dst,
                bool accumulate) {
  if (count == 0) return;
  const auto* in = static_cast<const uint8_t*>(src);
#if CORTADO_CODEC_HAVE_AVX512
  if (isa == Isa::kAvx512) return DecodeAvx512(kind, in, count, dst, accumulate);
#endif
#if CORTADO_CODEC_HAVE_AVX2
  if (isa == Isa::kAvx2) return DecodeAvx2(kind, in, count, dst, accumulate);
#endif
  DecodePortable(kind, in, count, dst, accumulate);
}

}  // namespace codec_internal

// ---- Public entry points ------------------------------------------------------------------

void Encode(CodecKind kind, const float* src, size_t count, void* dst, const EncodeOptions& options,
            float* residual) {
  CheckKind(kind);
  CheckRounding(options.rounding);
  if (count == 0) return;
  if (src == nullptr || dst == nullptr) {
    Fail(ErrorKind::kInvalidArgument, "Encode(", CodecName(kind), "): null ",
         src == nullptr ? "src" : "dst", " for ", count, " values");
  }
  codec_internal::EncodeWith(codec_internal::ActiveIsa(), kind, src, count, dst, options, residual);
}

void Decode(CodecKind kind, const void* src, size_t count, float* dst) {
  CheckKind(kind);
  if (count == 0) return;
  if (src == nullptr || dst == nullptr) {
    Fail(ErrorKind::kInvalidArgument, "Decode(", CodecName(kind), "): null ",
         src == nullptr ? "src" : "dst", " for ", count, " values");
  }
  codec_internal::DecodeWith(codec_internal::ActiveIsa(), kind, src, count, dst, false);
}

void DecodeAccumulate(CodecKind kind, const void* src, size_t count, float* acc) {
  CheckKind(kind);
  if (count == 0) return;
  if (src == nullptr || acc == nullptr) {
    Fail(ErrorKind::kInvalidArgument, "DecodeAccumulate(", CodecName(kind), "): null ",
         src == nullptr ? "src" : "acc", " for ", count, " values");
  }
  codec_internal::DecodeWith(codec_internal::ActiveIsa(), kind, src, count, acc, true);
}

}  // namespace cortado::dist
