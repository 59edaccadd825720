// Gradient codecs: the low-precision formats gradients travel in, and the kernels that convert
// fp32 to and from them. Usable on their own (no communicator needed); the compressed
// all-reduce (Communicator::AllReduceCompressed) is built on them.
//
//   codec    bits  layout of one value                         largest finite   smallest > 0
//   f32       32   IEEE binary32 (no compression)              3.4e38           1.4e-45
//   f16       16   IEEE binary16: sign, 5 exponent, 10 mantissa 65504            2^-24
//   bf16      16   sign, 8 exponent, 7 mantissa (top of fp32)  3.4e38           fp32's (kept)
//   epgc11    11   sign, 5 exponent, 5 mantissa (f16 >> 5)     64512            2^-19
//   epgc9      9   sign, 8 exponent (signed powers of two)     2^127            2^-126
//   epgc8      8   sign, 5 exponent, 2 mantissa (FP8 E5M2)     57344            2^-16
//
// Rounding (fp32 -> format), identical on every code path:
//   kNearest     round to nearest, ties to even (IEEE): to the even significand, so epgc9,
//                whose significand is its implicit bit, rounds a tie 1.5 * 2^e up to 2^(e+1);
//   kTruncate    toward zero (drop the bits);
//   kStochastic  away from zero with probability |x - t| / gap (t: x truncated), toward zero
//                otherwise, drawn as StochasticBits(seed, index) < that fraction * 2^32:
//                exactly unbiased while the gap is at most 2^32 units of x's last place, i.e.
//                everywhere but for E5 values below 2^-9 of the smallest subnormal (2^-33 in
//                f16): there the fraction is cut to 32 bits, and below 2^-17 of it the shift is
//                capped at 40 bits, so such a value rounds up with probability up to 2^-16
//                whatever its size. The random bits come from (seed, element index), so a
//                result depends on neither chunking nor thread count and a run is reproducible.
// Special values: NaN stays NaN (epgc9 has no mantissa to mark a NaN: it becomes an infinity of
// the same sign, still non-finite). Infinities stay infinities. A finite value beyond the
// format's largest finite value becomes an infinity in every rounding mode: an overflow must be
// seen after the reduction (a loss scaler skips that step), not hidden by saturation. Values
// below the smallest subnormal round as the mode says (to zero or the smallest subnormal); the
// E5 formats (f16, epgc11, epgc8) have subnormals below 2^-14, epgc9 has none (fp32 subnormal
// inputs round by their bit pattern to 0 or 2^-126), bf16 keeps fp32's. -0 stays -0.
//
// Packing. f32, f16 and bf16 are arrays of little-endian 4- and 2-byte words; epgc8 one byte
// per value (the top byte of the f16 encoding). epgc11 and epgc9 are bit-packed, exactly 11 and
// 9 bits per value: values go in groups of 8 (the last group holds count % 8 if nonzero); a
// group of k values is k bytes of "high parts" followed by the "low parts" as a string of L*k
// bits (L = 3 for epgc11, 1 for epgc9), bit p*k + j of the string being bit p of value j's low
// part (bit-plane order, least significant bit of a byte first). epgc11: high part = sign,
// exponent and the top 2 mantissa bits (the epgc8 byte), low part = the other 3 mantissa bits.
// epgc9: high part = the 8 exponent bits, low part = the sign. So a full group is 11 or 9
// bytes and EncodedBytes(n) = ceil(n * bits / 8) for every n.
//
// Kernels, detected at run time, best first: AVX-512 (F, BW, DQ, VL and VBMI, with AVX2 and
// F16C), AVX2 with F16C, else a portable path; all give bitwise identical bytes, residuals and
// values (tested), whichever set runs. The vector sets are built with per-function target
// attributes, whatever -march says, and run only where the CPU has what they need.
// CORTADO_CODEC_ISA=portable forces the portable path, =avx2 or =avx512 insists on that set (an
// error naming the variable where the CPU lacks it; avx2 on an AVX-512 CPU runs the AVX2 kernels),
// =auto or unset detects (for tests and benchmarks; another value is an error naming the variable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cortado::dist {

enum class CodecKind : uint8_t { kF32 = 0, kF16, kBF16, kEpgc11, kEpgc9, kEpgc8 };
enum class Rounding : uint8_t { kNearest = 0, kTruncate, kStochastic };

const char* CodecName(CodecKind kind);            // "f32", "f16", "bf16", "epgc11", ...
CodecKind ParseCodec(const std::string& name);    // also "fp32", "fp16", "none"; throws
const char* RoundingName(Rounding rounding);      // "nearest", "truncate", "stochastic"
Rounding ParseRounding(const std::string& name);  // throws kInvalidArgument naming the text
int CodecBits(CodecKind kind);                    // 32, 16, 16, 11, 9, 8
// Bytes that count values take encoded: ceil(count * bits / 8).
size_t EncodedBytes(CodecKind kind, size_t count);
// The largest finite value the format holds (what overflows beyond it).
float CodecMaxFinite(CodecKind kind);

// Which kernels run: "avx512", "avx2" or "portable" (after CPU detection and CORTADO_CODEC_ISA).
const char* CodecIsa();

struct EncodeOptions {
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;         // kStochastic: the random stream
  uint64_t first_index = 0;  // kStochastic: index of src[0] in the stream (for chunked calls)
};

// dst receives EncodedBytes(kind, count) bytes (src may be at any alignment, dst at any byte).
// If residual is not null, residual[i] = residual[i] + (src[i] - decode(encode(src[i]))) in
// fp32 (what the encoding lost; where src[i] or its decoded value is not finite, + 0) in the
// same pass. f32 loses nothing and leaves the residual untouched.
void Encode(CodecKind kind, const float* src, size_t count, void* dst,
            const EncodeOptions& options = {}, float* residual = nullptr);
// dst[i] = decode(value i).
void Decode(CodecKind kind, const void* src, size_t count, float* dst);
// acc[i] += decode(value i), in fp32.
void DecodeAccumulate(CodecKind kind, const void* src, size_t count, float* acc);

// Scalar reference of one value (the specification the kernels are tested against): the code
// (right-aligned in the low CodecBits(kind) bits) of x, with the random word r used by
// kStochastic, and the value of a code (bits above CodecBits(kind) are ignored; the E5 formats
// decode as the f16 code << (10 - mantissa bits), NaN payloads included).
uint32_t EncodeValue(CodecKind kind, float x, Rounding rounding, uint32_t r = 0);
float DecodeValue(CodecKind kind, uint32_t code);
// The random word of element `index` of stream `seed` (what kStochastic draws): a counter-based
// hash, cheap in 32-bit vector lanes. With lo/hi the 32-bit halves, arithmetic mod 2^32:
//   h = (lo(index) * 0x9E3779B1 + lo(seed)) ^ hi(index) * 0x85EBCA77 ^ hi(seed) * 0xC2B2AE3D
// then murmur3's finalizer: h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35;
// h ^= h >> 16. Not cryptographic; consecutive indices give independent-looking words.
uint32_t StochasticBits(uint64_t seed, uint64_t index);

}  // namespace cortado::dist
