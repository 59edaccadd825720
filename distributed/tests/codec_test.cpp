// Gradient codecs (cortado/dist/codec.h): the scalar reference against brute force on every f16
// value, the portable, AVX2 and AVX-512 kernels against the reference on a dense sweep of fp32
// (bitwise, all rounding modes, residual on and off) with per-format error bounds, stochastic
// rounding's bias and reproducibility, the packed layout byte by byte, and the edges of a buffer.
#include "cortado/dist/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../src/codecs/codec_internal.h"
#include "cortado/dist/error.h"
#include "cortado/dist/types.h"

namespace cortado::dist {
namespace {

using codec_internal::FormatOf;
using codec_internal::Isa;

constexpr CodecKind kAllKinds[] = {CodecKind::kF32,    CodecKind::kF16,   CodecKind::kBF16,
                                   CodecKind::kEpgc11, CodecKind::kEpgc9, CodecKind::kEpgc8};
constexpr CodecKind kLossyKinds[] = {CodecKind::kF16, CodecKind::kBF16, CodecKind::kEpgc11,
                                     CodecKind::kEpgc9, CodecKind::kEpgc8};
constexpr Rounding kRoundings[] = {Rounding::kNearest, Rounding::kTruncate, Rounding::kStochastic};

// The kernel sets this CPU runs; the portable one always.
std::vector<Isa> Isas() {
  std::vector<Isa> isas = {Isa::kPortable};
  if (codec_internal::CpuHasAvx2()) isas.push_back(Isa::kAvx2);
  if (codec_internal::CpuHasAvx512()) isas.push_back(Isa::kAvx512);
  return isas;
}

std::string Name(CodecKind kind, Rounding rounding, Isa isa) {
  return StrCat(CodecName(kind), "/", RoundingName(rounding), "/", codec_internal::IsaName(isa));
}

std::vector<uint8_t> EncodeWith(Isa isa, CodecKind kind, const float* x, size_t n,
                                const EncodeOptions& options, float* residual = nullptr) {
  std::vector<uint8_t> out(EncodedBytes(kind, n));
  codec_internal::EncodeWith(isa, kind, x, n, out.data(), options, residual);
  return out;
}

std::vector<float> DecodeWith(Isa isa, CodecKind kind, const std::vector<uint8_t>& bytes,
                              size_t n) {
  std::vector<float> out(n);
  codec_internal::DecodeWith(isa, kind, bytes.data(), n, out.data(), false);
  return out;
}

bool SameBits(float a, float b) { return FloatToBits(a) == FloatToBits(b); }

// The first index where two arrays differ bitwise, -1 if none (sizes must match).
template <class T>
long FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  if (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0) return -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<long>(i);
  }
  return -1;
}

uint32_t Random(uint64_t seed, size_t i, Rounding rounding) {
  return rounding == Rounding::kStochastic ? StochasticBits(seed, i) : 0;
}

// The packed layout as the header describes it, one bit at a time (independent of the
// kernels' packing).
std::vector<uint8_t> PackReference(CodecKind kind, const std::vector<uint32_t>& codes) {
  std::vector<uint8_t> out;
  const int bits = CodecBits(kind);
  if (kind != CodecKind::kEpgc11 && kind != CodecKind::kEpgc9) {
    for (uint32_t c : codes) {
      for (int b = 0; b < bits / 8; ++b) out.push_back(static_cast<uint8_t>(c >> 8 * b));
    }
    return out;
  }
  const int low_bits = kind == CodecKind::kEpgc11 ? 3 : 1;
  for (size_t g = 0; g < codes.size(); g += 8) {
    const size_t k = std::min<size_t>(8, codes.size() - g);
    std::vector<int> string(low_bits * k);
    for (size_t j = 0; j < k; ++j) {
      const uint32_t c = codes[g + j];
      const uint32_t high = kind == CodecKind::kEpgc11 ? c >> 3 : c & 0xff;
      const uint32_t low = kind == CodecKind::kEpgc11 ? c & 7 : c >> 8;
      out.push_back(static_cast<uint8_t>(high));
      for (int p = 0; p < low_bits; ++p) string[p * k + j] = (low >> p) & 1;
    }
    for (size_t b = 0; b * 8 < string.size(); ++b) {
      uint8_t byte = 0;
      for (size_t t = 0; t < 8 && b * 8 + t < string.size(); ++t) byte |= string[b * 8 + t] << t;
      out.push_back(byte);
    }
  }
  return out;
}

// 2^e as a double, built from its bits (ldexp dominates the sweep otherwise).
double Pow2(int e) {
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

// Format limits in double: the largest finite value, the gap below the next power of two at
// the top, the smallest normal's exponent.
struct Limits {
  CodecKind kind;
  double max;
  double top_gap;
  int min_exp;
  int m;
  bool subnormals;
};
Limits LimitsOf(CodecKind kind) {
  const auto f = FormatOf(kind);
  const int max_exp = (1 << f.e) - 2 - f.bias;
  return {kind, (2.0 - Pow2(-f.m)) * Pow2(max_exp), Pow2(max_exp - f.m), 1 - f.bias, f.m, f.m > 0};
}
// The spacing of the format's values around finite x (in the binade of x).
double UlpAt(const Limits& l, float x) {
  const int e = static_cast<int>((FloatToBits(x) >> 23) & 255) - 127;  // fp32 subnormals: -127
  if (e < l.min_exp) return l.subnormals ? Pow2(l.min_exp - l.m) : Pow2(l.min_exp);
  return Pow2(e - l.m);
}

// Checks the decoded d (code `code`) of x against the format's error bounds; null when fine.
// `down` is x's code truncated (used for kStochastic).
const char* CheckBounds(const Limits& l, Rounding rounding, float x, float d, uint32_t code,
                        uint32_t down) {
  const CodecKind kind = l.kind;
  if (std::signbit(x) != std::signbit(d)) return "sign lost";
  if (std::isnan(x)) {
    if (kind == CodecKind::kEpgc9 ? !std::isinf(d) : !std::isnan(d)) return "NaN not kept";
    return nullptr;
  }
  if (std::isinf(x)) return d == x ? nullptr : "infinity not kept";
  const double ax = std::fabs(static_cast<double>(x)), ad = std::fabs(static_cast<double>(d));
  const double beyond = l.max + l.top_gap;  // the next power of two: infinity's place
  if (rounding == Rounding::kNearest) {
    const bool overflow = ax >= l.max + l.top_gap / 2;
    if (overflow != std::isinf(d)) return overflow ? "overflow not infinite" : "spurious infinity";
    if (overflow) return nullptr;
    if (std::fabs(ad - ax) > UlpAt(l, x) / 2) return "error above half an ulp";
    return nullptr;
  }
  const bool overflow = ax >= beyond;
  if (overflow && !std::isinf(d)) return "overflow not infinite";
  if (std::isinf(d)) {
    if (overflow) return nullptr;
    if (rounding == Rounding::kStochastic && ax > l.max) return nullptr;  // rounded up past the top
    return "spurious infinity";
  }
  if (rounding == Rounding::kTruncate) {
    if (std::fabs(ad - ax) >= UlpAt(l, x)) return "error of an ulp or more";
    if (ad > ax) return "truncation grew the magnitude";
    return nullptr;
  }
  // Stochastic: the truncated value (bounded above) or the next code away from zero; exact
  // values stay. (Checked on codes: in double, tiny x below a subnormal would round away.)
  if (code != down && (code != down + 1 || DecodeValue(kind, down) == x)) {
    return "not a neighbour of x";
  }
  return nullptr;
}

// ---- Names, sizes, selection ----------------------------------------------------------------

std::string ErrorOf(const std::function<void()>& fn, ErrorKind* kind = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (kind != nullptr) *kind = e.kind();
    return e.what();
  }
  return "";
}

TEST(CodecNames, ParseAndName) {
  for (CodecKind kind : kAllKinds) EXPECT_EQ(ParseCodec(CodecName(kind)), kind);
  EXPECT_EQ(ParseCodec("fp32"), CodecKind::kF32);
  EXPECT_EQ(ParseCodec("none"), CodecKind::kF32);
  EXPECT_EQ(ParseCodec("fp16"), CodecKind::kF16);
  for (Rounding r : kRoundings) EXPECT_EQ(ParseRounding(RoundingName(r)), r);
  ErrorKind kind{};
  EXPECT_NE(ErrorOf([] { ParseCodec("epgc7"); }, &kind).find("'epgc7'"), std::string::npos);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(ErrorOf([] { ParseRounding("up"); }, &kind).find("'up'"), std::string::npos);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
}

TEST(CodecNames, BitsSizesAndLimits) {
  const int bits[] = {32, 16, 16, 11, 9, 8};
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(CodecBits(kAllKinds[k]), bits[k]);
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 1000003}) {
      EXPECT_EQ(EncodedBytes(kAllKinds[k], n), (n * bits[k] + 7) / 8) << CodecName(kAllKinds[k]);
    }
  }
  EXPECT_EQ(CodecMaxFinite(CodecKind::kF32), 3.4028234663852886e38f);
  EXPECT_EQ(CodecMaxFinite(CodecKind::kF16), 65504.0f);
  EXPECT_EQ(CodecMaxFinite(CodecKind::kBF16), BitsToFloat(0x7f7f0000u));
  EXPECT_EQ(CodecMaxFinite(CodecKind::kEpgc11), 64512.0f);
  EXPECT_EQ(CodecMaxFinite(CodecKind::kEpgc9), std::ldexp(1.0f, 127));
  EXPECT_EQ(CodecMaxFinite(CodecKind::kEpgc8), 57344.0f);
  // The value beyond the largest finite one overflows; the largest does not.
  for (CodecKind kind : kLossyKinds) {
    const float max = CodecMaxFinite(kind);
    EXPECT_TRUE(std::isfinite(DecodeValue(kind, EncodeValue(kind, max, Rounding::kNearest))));
    EXPECT_TRUE(
        std::isinf(DecodeValue(kind, EncodeValue(kind, std::ldexp(max, 1), Rounding::kTruncate))));
  }
}

TEST(CodecIsa, ResolvesTheEnvironment) {
  using codec_internal::ResolveIsa;
  EXPECT_EQ(ResolveIsa(nullptr, Isa::kAvx512), Isa::kAvx512);
  EXPECT_EQ(ResolveIsa(nullptr, Isa::kAvx2), Isa::kAvx2);
  EXPECT_EQ(ResolveIsa(nullptr, Isa::kPortable), Isa::kPortable);
  EXPECT_EQ(ResolveIsa("", Isa::kAvx2), Isa::kAvx2);
  EXPECT_EQ(ResolveIsa("auto", Isa::kPortable), Isa::kPortable);
  EXPECT_EQ(ResolveIsa("portable", Isa::kAvx512), Isa::kPortable);
  EXPECT_EQ(ResolveIsa("avx2", Isa::kAvx2), Isa::kAvx2);
  EXPECT_EQ(ResolveIsa("avx2", Isa::kAvx512), Isa::kAvx2);
  EXPECT_EQ(ResolveIsa("avx512", Isa::kAvx512), Isa::kAvx512);
  for (const std::pair<const char*, Isa>& lacking :
       {std::pair{"avx2", Isa::kPortable}, std::pair{"avx512", Isa::kAvx2},
        std::pair{"avx512", Isa::kPortable}}) {
    const char* value = lacking.first;
    ErrorKind kind{};
    const std::string e = ErrorOf([&] { ResolveIsa(value, lacking.second); }, &kind);
    EXPECT_NE(e.find(StrCat("CORTADO_CODEC_ISA=", value)), std::string::npos) << e;
    EXPECT_EQ(kind, ErrorKind::kConfig);
  }
  const std::string e = ErrorOf([] { ResolveIsa("sse9", Isa::kAvx512); });
  EXPECT_NE(e.find("CORTADO_CODEC_ISA"), std::string::npos) << e;
  EXPECT_NE(e.find("sse9"), std::string::npos) << e;
  EXPECT_NE(e.find("avx512"), std::string::npos) << e;  // the known values
  const std::string active = CodecIsa();
  EXPECT_TRUE(active == "avx512" || active == "avx2" || active == "portable") << active;
  EXPECT_EQ(codec_internal::BestIsa(), codec_internal::CpuHasAvx512() ? Isa::kAvx512
                                       : codec_internal::CpuHasAvx2() ? Isa::kAvx2
                                                                      : Isa::kPortable);
}

// CORTADO_CPU_ISA caps the codecs with the rest of the project's kernels, and never asks for
// more than the CPU has (an AVX-512 CPU without VBMI keeps the AVX2 codecs under avx512).
TEST(CodecIsa, FollowsTheProjectWideCap) {
  using codec_internal::CapIsa;
  EXPECT_EQ(CapIsa(nullptr, Isa::kAvx512), Isa::kAvx512);
  EXPECT_EQ(CapIsa("", Isa::kAvx512), Isa::kAvx512);
  EXPECT_EQ(CapIsa("auto", Isa::kAvx2), Isa::kAvx2);
  EXPECT_EQ(CapIsa("avx2", Isa::kAvx512), Isa::kAvx2);
  EXPECT_EQ(CapIsa("avx2", Isa::kPortable), Isa::kPortable);
  EXPECT_EQ(CapIsa("avx512", Isa::kAvx512), Isa::kAvx512);
  EXPECT_EQ(CapIsa("avx512", Isa::kAvx2), Isa::kAvx2);
  ErrorKind kind{};
  const std::string e = ErrorOf([] { CapIsa("sse2", Isa::kAvx512); }, &kind);
  EXPECT_NE(e.find("CORTADO_CPU_ISA='sse2'"), std::string::npos) << e;
  EXPECT_EQ(kind, ErrorKind::kConfig);
  // A codec set above the cap is refused as one above the CPU is.
  const std::string above =
      ErrorOf([] { codec_internal::ResolveIsa("avx512", CapIsa("avx2", Isa::kAvx512)); });
  EXPECT_NE(above.find("CORTADO_CODEC_ISA=avx512"), std::string::npos) << above;
}

TEST(CodecIsa, RejectsBadArguments) {
  float x = 1;
  uint8_t b[4];
  EXPECT_NE(ErrorOf([&] { Encode(CodecKind::kF16, nullptr, 1, b); }).find("src"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Decode(CodecKind::kF16, b, 1, nullptr); }).find("dst"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Encode(static_cast<CodecKind>(17), &x, 1, b); }), "");
  EncodeOptions bad;
  bad.rounding = static_cast<Rounding>(9);
  EXPECT_NE(ErrorOf([&] { Encode(CodecKind::kF16, &x, 1, b, bad); }), "");
  Encode(CodecKind::kF16, nullptr, 0, nullptr);  // nothing to do is fine
}

// ---- Every f16 value -------------------------------------------------------------------------

std::vector<float> AllHalfValues() {
  std::vector<float> x(65536);
  for (uint32_t h = 0; h < 65536; ++h) x[h] = HalfToFloat(static_cast<uint16_t>(h));
  return x;
}

TEST(CodecExhaustiveF16, EveryHalfRoundTrips) {
  const std::vector<float> x = AllHalfValues();
  std::vector<uint32_t> want(65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool nan = (h & 0x7fff) > 0x7c00;
    want[h] = nan ? (h & 0x8000) | 0x7e00 : h;
    EXPECT_TRUE(SameBits(DecodeValue(CodecKind::kF16, h), x[h])) << h;
    for (Rounding r : kRoundings) {
      ASSERT_EQ(EncodeValue(CodecKind::kF16, x[h], r, 0x9e3779b9u * h), want[h]) << h;
    }
  }
  const std::vector<uint8_t> want_bytes = PackReference(CodecKind::kF16, want);
  std::vector<uint32_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = h;
  const std::vector<uint8_t> all_bytes = PackReference(CodecKind::kF16, all);
  for (Isa isa : Isas()) {
    for (Rounding r : kRoundings) {
      EncodeOptions o;
      o.rounding = r;
      EXPECT_EQ(EncodeWith(isa, CodecKind::kF16, x.data(), x.size(), o), want_bytes)
          << Name(CodecKind::kF16, r, isa);
    }
    // Every pattern decodes as HalfToFloat, signalling NaN payloads included.
    const std::vector<float> d = DecodeWith(isa, CodecKind::kF16, all_bytes, 65536);
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_TRUE(SameBits(d[h], x[h])) << h << " " << codec_internal::IsaName(isa);
    }
  }
}

// epgc11 and epgc8 against brute force over their codes: every code's value encodes back to
// it, and every f16 value (finer than both) rounds to the nearest code, ties to the even one,
// or truncates to the largest code not above it.
TEST(CodecExhaustiveF16, SmallFormatsAgainstBruteForce) {
  const std::vector<float> x = AllHalfValues();
  for (CodecKind kind : {CodecKind::kEpgc11, CodecKind::kEpgc8}) {
    SCOPED_TRACE(CodecName(kind));
    const auto f = FormatOf(kind);
    const uint32_t sign = 1u << (f.e + f.m), inf = 31u << f.m;
    std::vector<double> value(inf + 1);
    for (uint32_t c = 0; c <= inf; ++c) {
      const float v = DecodeValue(kind, c);
      EXPECT_TRUE(SameBits(v, HalfToFloat(static_cast<uint16_t>(c << (10 - f.m))))) << c;
      if (c < inf) {
        for (Rounding r : kRoundings) {
          EXPECT_EQ(EncodeValue(kind, v, r, 12345u * c), c) << c;
          EXPECT_EQ(EncodeValue(kind, -v, r, 777u * c), c | sign) << c;
        }
      }
      value[c] = c < inf ? v : 65536.0;  // infinity sits where the next binade would start
    }
    std::vector<uint32_t> nearest(65536), truncated(65536);
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint32_t s = h & 0x8000 ? sign : 0;
      if ((h & 0x7fff) >= 0x7c00) {  // infinity, NaN
        nearest[h] = truncated[h] = s | inf | ((h & 0x7fff) > 0x7c00 ? 1u << (f.m - 1) : 0u);
        continue;
      }
      const double ax = std::fabs(static_cast<double>(x[h]));
      uint32_t best = 0, floor = 0;
      for (uint32_t c = 0; c <= inf; ++c) {
        const double dist = std::fabs(value[c] - ax), best_dist = std::fabs(value[best] - ax);
        if (dist < best_dist || (dist == best_dist && c % 2 == 0)) best = c;
        if (value[c] <= ax) floor = c;
      }
      nearest[h] = s | best;
      truncated[h] = s | floor;
      ASSERT_EQ(EncodeValue(kind, x[h], Rounding::kNearest), nearest[h]) << h;
      ASSERT_EQ(EncodeValue(kind, x[h], Rounding::kTruncate), truncated[h]) << h;
    }
    // The kernels give the same, and decode every code as the reference does.
    std::vector<uint32_t> codes(2u * sign);
    for (uint32_t c = 0; c < codes.size(); ++c) codes[c] = c;
    for (Isa isa : Isas()) {
      EncodeOptions o;
      EXPECT_EQ(EncodeWith(isa, kind, x.data(), x.size(), o), PackReference(kind, nearest));
      o.rounding = Rounding::kTruncate;
      EXPECT_EQ(EncodeWith(isa, kind, x.data(), x.size(), o), PackReference(kind, truncated));
      const std::vector<float> d = DecodeWith(isa, kind, PackReference(kind, codes), codes.size());
      for (uint32_t c = 0; c < codes.size(); ++c) {
        ASSERT_TRUE(SameBits(d[c], DecodeValue(kind, c))) << c << codec_internal::IsaName(isa);
      }
    }
  }
}

TEST(CodecExhaustiveF16, Epgc9AndBf16DecodeEveryCode) {
  for (CodecKind kind : {CodecKind::kEpgc9, CodecKind::kBF16}) {
    std::vector<uint32_t> codes(1u << CodecBits(kind));
    for (uint32_t c = 0; c < codes.size(); ++c) codes[c] = c;
    const std::vector<uint8_t> bytes = PackReference(kind, codes);
    for (Isa isa : Isas()) {
      const std::vector<float> d = DecodeWith(isa, kind, bytes, codes.size());
      for (uint32_t c = 0; c < codes.size(); ++c) {
        ASSERT_TRUE(SameBits(d[c], DecodeValue(kind, c))) << CodecName(kind) << " " << c;
        // The E8 formats are the top bits of an fp32.
        const uint32_t top = kind == CodecKind::kBF16 ? c << 16 : (c >> 8) << 31 | (c & 255) << 23;
        ASSERT_EQ(FloatToBits(d[c]), top) << c;
      }
    }
  }
}

// ---- Dense sweep of fp32 ----------------------------------------------------------------------

// Bit patterns on both sides of every place a format rounds differently: multiples of its ulp
// (2^s units of the mantissa) and the halfway points, in every exponent, both signs.
std::vector<uint32_t> BoundaryPatterns() {
  std::vector<uint32_t> out;
  for (uint32_t ef = 0; ef < 256; ++ef) {
    for (int s = 12; s <= 24; ++s) {
      const uint32_t step = 1u << std::min(s, 23), half = step / 2;
      for (uint32_t k : {0u, 1u, 2u, 3u, (1u << 23) / step - 2, (1u << 23) / step - 1}) {
        for (int64_t off : {-1, 0, 1}) {
          for (int64_t at : {int64_t{0}, int64_t{half}}) {
            const int64_t m = int64_t{k} * step + at + off;
            if (m < 0 || m >= (1 << 23)) continue;
            for (uint32_t sign : {0u, 0x80000000u}) {
              out.push_back(sign | ef << 23 | static_cast<uint32_t>(m));
            }
          }
        }
      }
    }
  }
  for (uint32_t special :
       {0x7f800000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fffffffu, 0x477fe000u, 0x477fefffu,
        0x477ff000u, 0x477fffffu, 0x47800000u, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu}) {
    out.push_back(special);
    out.push_back(special | 0x80000000u);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// One chunk of inputs through every kernel set, rounding mode and format, with and without
// residual: kernels bitwise equal to EncodeValue (through the decoded values, which determine
// the code), residual = r0 + (x - d), and d within the format's error bounds.
struct SweepBuffers {  // reused from chunk to chunk: fresh large vectors cost page faults
  std::vector<float> r0, want, res, d, res2, d2;
  std::vector<uint32_t> code, truncated;
  std::vector<uint8_t> bytes, plain, bytes2, plain2;
};

void SweepChunk(const std::vector<float>& x, uint64_t first_index, SweepBuffers& b, int* failures) {
  const size_t n = x.size();
  std::mt19937 gen(static_cast<uint32_t>(first_index));
  std::uniform_real_distribution<float> small(-1e-3f, 1e-3f);
  b.r0.resize(n);
  for (float& r : b.r0) r = small(gen);
  const uint64_t seed = 0x5eed0000u + first_index;
  for (CodecKind kind : kLossyKinds) {
    for (Rounding rounding : kRoundings) {
      EncodeOptions o;
      o.rounding = rounding;
      o.seed = seed;
      o.first_index = first_index;
      b.want.resize(n);
      b.code.resize(n);
      for (size_t i = 0; i < n; ++i) {
        b.code[i] = EncodeValue(kind, x[i], rounding, Random(seed, first_index + i, rounding));
        b.want[i] = DecodeValue(kind, b.code[i]);
      }
      if (rounding == Rounding::kTruncate) b.truncated = b.code;  // kRoundings: before stochastic
      if (rounding == Rounding::kNearest) b.truncated.assign(n, 0);  // unused until then
      const Limits limits = LimitsOf(kind);
      // Encode with and without residual, and decode, with one kernel set into the buffers.
      const size_t bytes = EncodedBytes(kind, n);
      const auto run = [&](Isa isa, std::vector<uint8_t>& with, std::vector<uint8_t>& without,
                           std::vector<float>& res, std::vector<float>& d) {
        with.resize(bytes);
        without.resize(bytes);
        res = b.r0;
        d.resize(n);
        codec_internal::EncodeWith(isa, kind, x.data(), n, with.data(), o, res.data());
        codec_internal::EncodeWith(isa, kind, x.data(), n, without.data(), o, nullptr);
        codec_internal::DecodeWith(isa, kind, with.data(), n, d.data(), false);
      };
      // The portable kernels against the reference and the bounds, value by value.
      const std::string name = Name(kind, rounding, Isa::kPortable);
      run(Isa::kPortable, b.bytes, b.plain, b.res, b.d);
      EXPECT_EQ(FirstDifference(b.plain, b.bytes), -1)
          << name << ": the residual changed the bytes";
      for (size_t i = 0; i < n && *failures < 20; ++i) {
        const float x_i = x[i], d_i = b.d[i], want = b.want[i];
        const float loss = std::isfinite(x_i) && std::isfinite(want) ? x_i - want : 0.0f;
        const bool decoded_ok = SameBits(d_i, want);
        const bool residual_ok = SameBits(b.res[i], b.r0[i] + loss);
        const char* bad = decoded_ok && residual_ok
                              ? CheckBounds(limits, rounding, x_i, d_i, b.code[i], b.truncated[i])
                              : nullptr;
        if (decoded_ok && residual_ok && bad == nullptr) continue;
        const std::string problem = !decoded_ok ? StrCat("decodes to ", d_i, ", reference ", want)
                                    : !residual_ok
                                        ? StrCat("residual ", b.res[i], ", want ", b.r0[i] + loss)
                                        : std::string(bad);
        ++*failures;
        ADD_FAILURE() << name << ": x = " << x_i << " (bits 0x" << std::hex << FloatToBits(x_i)
                      << std::dec << ", index " << first_index + i << ", decoded " << d_i
                      << "): " << problem;
      }
      // The other kernel sets: the same bytes, residual and decoded values, bit for bit.
      for (Isa isa : Isas()) {
        if (isa == Isa::kPortable) continue;
        run(isa, b.bytes2, b.plain2, b.res2, b.d2);
        const long bad_byte = FirstDifference(b.bytes2, b.bytes);
        const long bad_plain = FirstDifference(b.plain2, b.bytes);
        const long bad_res = FirstDifference(b.res2, b.res);
        const long bad_dec = FirstDifference(b.d2, b.d);
        if (bad_byte >= 0 || bad_plain >= 0 || bad_res >= 0 || bad_dec >= 0) {
          ++*failures;
          const size_t at = static_cast<size_t>(std::max({bad_res, bad_dec, 0L}));
          ADD_FAILURE() << Name(kind, rounding, isa) << " differs from the portable kernels (byte "
                        << bad_byte << ", without residual " << bad_plain << ", residual "
                        << bad_res << ", decoded " << bad_dec << "); x there = " << x[at];
        }
      }
    }
  }
}

TEST(CodecSweep, KernelsMatchReferenceAndBounds) {
  int failures = 0;
  constexpr uint64_t kStride = 251;  // prime: the patterns hit every exponent and low-bit mix
  constexpr size_t kChunk = 1 << 16;
  const uint64_t total = (uint64_t{1} << 32) / kStride + 1;
  std::vector<float> x;
  SweepBuffers buffers;
  for (uint64_t start = 0; start < total && failures < 20; start += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, total - start));
    x.resize(n);
    for (size_t i = 0; i < n; ++i) x[i] = BitsToFloat(static_cast<uint32_t>((start + i) * kStride));
    SweepChunk(x, start, buffers, &failures);
  }
  const std::vector<uint32_t> boundary = BoundaryPatterns();
  for (size_t start = 0; start < boundary.size() && failures < 20; start += kChunk) {
    const size_t n = std::min(kChunk, boundary.size() - start);
    x.resize(n);
    for (size_t i = 0; i < n; ++i) x[i] = BitsToFloat(boundary[start + i]);
    SweepChunk(x, (uint64_t{1} << 40) + start, buffers, &failures);
  }
}

TEST(CodecSweep, SpecialValues) {
  const float inf = INFINITY, nan = NAN;
  for (CodecKind kind : kLossyKinds) {
    for (Rounding r : kRoundings) {
      SCOPED_TRACE(StrCat(CodecName(kind), "/", RoundingName(r)));
      const auto code = [&](float x) { return EncodeValue(kind, x, r, 0xdeadbeefu); };
      EXPECT_TRUE(std::signbit(DecodeValue(kind, code(-0.0f))));
      EXPECT_EQ(DecodeValue(kind, code(-0.0f)), 0.0f);
      EXPECT_EQ(DecodeValue(kind, code(inf)), inf);
      EXPECT_EQ(DecodeValue(kind, code(-inf)), -inf);
      const float dn = DecodeValue(kind, code(-nan));
      EXPECT_TRUE(kind == CodecKind::kEpgc9 ? dn == -inf : std::isnan(dn) && std::signbit(dn));
      EXPECT_EQ(DecodeValue(kind, code(std::ldexp(CodecMaxFinite(kind), 1))), inf);
    }
  }
  // Ties: to the even mantissa; epgc9's significand is its implicit bit, so 1.5 goes up to 2.
  EXPECT_EQ(DecodeValue(CodecKind::kF16,
                        EncodeValue(CodecKind::kF16, 1.0f + 0x1p-11f, Rounding::kNearest)),
            1.0f);
  EXPECT_EQ(DecodeValue(CodecKind::kF16,
                        EncodeValue(CodecKind::kF16, 1.0f + 3 * 0x1p-11f, Rounding::kNearest)),
            1.0f + 0x1p-9f);
  EXPECT_EQ(
      DecodeValue(CodecKind::kEpgc9, EncodeValue(CodecKind::kEpgc9, 1.5f, Rounding::kNearest)),
      2.0f);
  EXPECT_EQ(DecodeValue(CodecKind::kEpgc9,
                        EncodeValue(CodecKind::kEpgc9, 1.4999999f, Rounding::kNearest)),
            1.0f);
  // epgc9 has no subnormals: fp32 subnormals go to 0 or 2^-126 by their bits.
  EXPECT_EQ(DecodeValue(CodecKind::kEpgc9,
                        EncodeValue(CodecKind::kEpgc9, 0x1p-127f + 0x1p-140f, Rounding::kNearest)),
            0x1p-126f);
  EXPECT_EQ(
      DecodeValue(CodecKind::kEpgc9, EncodeValue(CodecKind::kEpgc9, 0x1p-128f, Rounding::kNearest)),
      0.0f);
  // f16's top: truncation overflows to infinity from the next power of two, not before;
  // rounding to nearest from halfway to it.
  const struct {
    float x;
    Rounding rounding;
    float decoded;
  } top[] = {{65535.0f, Rounding::kTruncate, 65504.0f},
             {65536.0f, Rounding::kTruncate, inf},
             {65519.0f, Rounding::kNearest, 65504.0f},
             {65520.0f, Rounding::kNearest, inf}};
  for (const auto& c : top) {
    EXPECT_EQ(DecodeValue(CodecKind::kF16, EncodeValue(CodecKind::kF16, c.x, c.rounding)),
              c.decoded)
        << c.x << " rounding " << static_cast<int>(c.rounding);
  }
}

// ---- Stochastic rounding ---------------------------------------------------------------------

TEST(CodecStochastic, BitsAreTheDocumentedHash) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x123456789abcdefULL}}) {
    for (uint64_t index : {uint64_t{0}, uint64_t{7}, uint64_t{0xffffffffULL}, uint64_t{1} << 32,
                           uint64_t{0xfedcba9876543210ULL}}) {
      uint32_t h = static_cast<uint32_t>(index) * 0x9E3779B1u + static_cast<uint32_t>(seed);
      h ^= static_cast<uint32_t>(index >> 32) * 0x85EBCA77u;
      h ^= static_cast<uint32_t>(seed >> 32) * 0xC2B2AE3Du;
      h ^= h >> 16;
      h *= 0x85EBCA6Bu;
      h ^= h >> 13;
      h *= 0xC2B2AE35u;
      h ^= h >> 16;
      EXPECT_EQ(StochasticBits(seed, index), h) << seed << " " << index;
    }
  }
}

TEST(CodecStochastic, UnbiasedBetweenTwoCodes) {
  constexpr size_t kDraws = 100000;
  for (CodecKind kind : kLossyKinds) {
    // A normal value, a negative one and (E5) one between two subnormals.
    std::vector<float> lows = {1.0f, -3.0f};
    if (FormatOf(kind).e == 5) lows.push_back(DecodeValue(kind, 5));
    for (float start : lows) {
      const uint32_t code = EncodeValue(kind, start, Rounding::kTruncate);
      const float low = DecodeValue(kind, code), high = DecodeValue(kind, code + 1);
      const float x = low + 0.3f * (high - low);
      const double p = (static_cast<double>(x) - low) / (static_cast<double>(high) - low);
      const std::vector<float> xs(kDraws, x);
      for (Isa isa : Isas()) {
        SCOPED_TRACE(StrCat(Name(kind, Rounding::kStochastic, isa), " x=", x));
        EncodeOptions o;
        o.rounding = Rounding::kStochastic;
        o.seed = 42;
        const std::vector<float> d =
            DecodeWith(isa, kind, EncodeWith(isa, kind, xs.data(), kDraws, o), kDraws);
        double sum = 0;
        size_t ups = 0;
        for (float v : d) {
          ASSERT_TRUE(v == low || v == high) << v;
          sum += v;
          ups += v == high;
        }
        const double sigma =
            std::fabs(static_cast<double>(high) - low) * std::sqrt(p * (1 - p) / kDraws);
        EXPECT_NEAR(sum / kDraws, x, 4 * sigma) << ups << " up of " << kDraws;
      }
    }
  }
}

TEST(CodecStochastic, ReproducibleAndChunkable) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> x(1003);
  for (float& v : x) v = normal(gen);
  for (CodecKind kind : kLossyKinds) {
    for (Isa isa : Isas()) {
      SCOPED_TRACE(Name(kind, Rounding::kStochastic, isa));
      EncodeOptions o;
      o.rounding = Rounding::kStochastic;
      o.seed = 99;
      o.first_index = 5000;
      const std::vector<uint8_t> once = EncodeWith(isa, kind, x.data(), x.size(), o);
      EXPECT_EQ(EncodeWith(isa, kind, x.data(), x.size(), o), once);
      EncodeOptions other = o;
      other.seed = 100;
      EXPECT_NE(EncodeWith(isa, kind, x.data(), x.size(), other), once);
      // Chunks at group boundaries concatenate to the same bytes; chunks anywhere decode to
      // the same values.
      const std::vector<float> whole = DecodeWith(isa, kind, once, x.size());
      for (const std::vector<size_t>& cuts : {std::vector<size_t>{0, 8, 24, 512, 1003},
                                              std::vector<size_t>{0, 1, 7, 100, 999, 1003}}) {
        std::vector<uint8_t> joined;
        std::vector<float> decoded;
        for (size_t c = 0; c + 1 < cuts.size(); ++c) {
          EncodeOptions part = o;
          part.first_index = o.first_index + cuts[c];
          const size_t n = cuts[c + 1] - cuts[c];
          const std::vector<uint8_t> b = EncodeWith(isa, kind, x.data() + cuts[c], n, part);
          joined.insert(joined.end(), b.begin(), b.end());
          const std::vector<float> d = DecodeWith(isa, kind, b, n);
          decoded.insert(decoded.end(), d.begin(), d.end());
        }
        if (cuts[1] % 8 == 0) {
          EXPECT_EQ(joined, once);
        }
        ASSERT_EQ(decoded.size(), whole.size());
        for (size_t i = 0; i < whole.size(); ++i) ASSERT_TRUE(SameBits(decoded[i], whole[i])) << i;
      }
    }
  }
}

TEST(CodecStochastic, IndexCrossingTwoToThe32) {
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i) * 0x1p-12f;
  // The lower index word wraps inside a block of 8 or 16, at its end, and at a later upper word.
  for (uint64_t first :
       {(uint64_t{1} << 32) - 13, (uint64_t{1} << 32) - 16, (uint64_t{1} << 32) - 8,
        (uint64_t{1} << 32) - 40, (uint64_t{3} << 32) - 24}) {
    for (CodecKind kind : kLossyKinds) {
      EncodeOptions o;
      o.rounding = Rounding::kStochastic;
      o.seed = 0xabcdef0123ULL;
      o.first_index = first;
      for (Isa isa : Isas()) {
        const std::vector<float> d =
            DecodeWith(isa, kind, EncodeWith(isa, kind, x.data(), x.size(), o), x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          const uint32_t c = EncodeValue(kind, x[i], Rounding::kStochastic,
                                         StochasticBits(o.seed, o.first_index + i));
          ASSERT_TRUE(SameBits(d[i], DecodeValue(kind, c)))
              << Name(kind, o.rounding, isa) << " first index " << first << " + " << i;
        }
      }
    }
  }
}

// ---- Packing and buffer edges ----------------------------------------------------------------

TEST(CodecPacking, LayoutByteByByte) {
  // epgc11, 3 values: high parts, then 9 bits in plane order.
  const uint32_t c11[] = {0x7be, 0x001, 0x402};  // low parts 6, 1, 2
  std::vector<float> x;
  for (uint32_t c : c11) x.push_back(DecodeValue(CodecKind::kEpgc11, c));
  // Planes: p0 = bits of (0,1,0) -> string bits 0..2 = 0,1,0; p1 = (1,0,1) -> bits 3..5 = 1,0,1;
  // p2 = (1,0,0) -> bits 6..8 = 1,0,0.  Byte 0 = 0b01101010, byte 1 = 0.
  const std::vector<uint8_t> want11 = {0xf7, 0x00, 0x80, 0x6a, 0x00};
  // epgc9, 3 values: exponents, then one byte of signs.
  const float x9[] = {-1.0f, 2.0f, -INFINITY};
  const std::vector<uint8_t> want9 = {0x7f, 0x80, 0xff, 0x05};
  for (Isa isa : Isas()) {
    EXPECT_EQ(EncodeWith(isa, CodecKind::kEpgc11, x.data(), 3, {}), want11);
    EXPECT_EQ(EncodeWith(isa, CodecKind::kEpgc9, x9, 3, {}), want9);
  }
  EXPECT_EQ(PackReference(CodecKind::kEpgc11, {0x7be, 0x001, 0x402}), want11);
  // A full group of 8: 8 high bytes, then plane p in byte 8 + p (value j at bit j).
  std::vector<uint32_t> codes(8);
  std::vector<float> x8(8);
  for (uint32_t j = 0; j < 8; ++j) {
    codes[j] = (0x100 + 8 * j) | j;  // low part j: plane p holds bit p of j
    x8[j] = DecodeValue(CodecKind::kEpgc11, codes[j]);
  }
  std::vector<uint8_t> want8;
  for (uint32_t j = 0; j < 8; ++j) want8.push_back(static_cast<uint8_t>(codes[j] >> 3));
  want8.insert(want8.end(), {0xaa, 0xcc, 0xf0});
  for (Isa isa : Isas()) EXPECT_EQ(EncodeWith(isa, CodecKind::kEpgc11, x8.data(), 8, {}), want8);
}

TEST(CodecPacking, CountsEdgesAndAlignment) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{64}, size_t{1023},
                   (size_t{1} << 20) + 3}) {
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) {
      values[i] = i % 97 == 5 ? INFINITY : i % 89 == 3 ? NAN : normal(gen);
    }
    // src one byte past an aligned address; dst three bytes in, canaries around it.
    std::vector<uint8_t> src_buf(n * 4 + 1);
    if (n > 0) std::memcpy(src_buf.data() + 1, values.data(), n * 4);  // data() may be null
    const float* src = reinterpret_cast<const float*>(src_buf.data() + 1);
    for (CodecKind kind : kAllKinds) {
      const size_t bytes = EncodedBytes(kind, n);
      ASSERT_EQ(bytes, (n * CodecBits(kind) + 7) / 8);
      std::vector<uint32_t> codes(n);
      for (size_t i = 0; i < n; ++i) codes[i] = EncodeValue(kind, values[i], Rounding::kNearest);
      const std::vector<uint8_t> want = PackReference(kind, codes);
      ASSERT_EQ(want.size(), bytes);
      for (Isa isa : Isas()) {
        SCOPED_TRACE(StrCat(Name(kind, Rounding::kNearest, isa), " n=", n));
        std::vector<uint8_t> dst_buf(bytes + 3 + 64, 0xa5);
        codec_internal::EncodeWith(isa, kind, src, n, dst_buf.data() + 3, {}, nullptr);
        EXPECT_TRUE(std::equal(dst_buf.begin() + 3, dst_buf.begin() + 3 + bytes, want.begin()));
        for (size_t b = 0; b < dst_buf.size(); ++b) {
          if (b < 3 || b >= 3 + bytes) {
            ASSERT_EQ(dst_buf[b], 0xa5) << "wrote byte " << b;
          }
        }
        // Decode from the unaligned bytes; floats past the end stay untouched.
        std::vector<float> out(n + 16, 1234.5f);
        codec_internal::DecodeWith(isa, kind, dst_buf.data() + 3, n, out.data(), false);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(SameBits(out[i], DecodeValue(kind, codes[i]))) << i;
        }
        for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], 1234.5f) << "wrote float " << i;
      }
    }
  }
}

TEST(CodecAccumulate, AccumulateAndResidual) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr size_t n = 1000 + 5;
  std::vector<float> x(n), acc0(n), r0(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = normal(gen);
    acc0[i] = normal(gen);
    r0[i] = normal(gen) * 1e-3f;
  }
  x[3] = INFINITY;
  x[10] = NAN;
  x[17] = 1e6f;    // beyond the E5 formats: infinite, the loss is not kept
  x[18] = -3e38f;  // bf16 rounds it to -inf
  for (CodecKind kind : kAllKinds) {
    for (Isa isa : Isas()) {
      SCOPED_TRACE(Name(kind, Rounding::kNearest, isa));
      std::vector<float> res = r0;
      const std::vector<uint8_t> bytes = EncodeWith(isa, kind, x.data(), n, {}, res.data());
      const std::vector<float> d = DecodeWith(isa, kind, bytes, n);
      std::vector<float> acc = acc0;
      codec_internal::DecodeWith(isa, kind, bytes.data(), n, acc.data(), true);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameBits(acc[i], acc0[i] + d[i])) << i;
        const bool finite = std::isfinite(x[i]) && std::isfinite(d[i]);
        if (kind == CodecKind::kF32) {
          ASSERT_TRUE(SameBits(res[i], r0[i])) << i;  // lossless: untouched
        } else {
          ASSERT_TRUE(SameBits(res[i], r0[i] + (finite ? x[i] - d[i] : 0.0f))) << i;
        }
      }
      // From zero, the residual is exactly what the encoding lost.
      std::vector<float> zero(n, 0.0f);
      EncodeWith(isa, kind, x.data(), n, {}, zero.data());
      for (size_t i = 0; i < n; ++i) {
        if (std::isfinite(x[i]) && std::isfinite(d[i])) {
          ASSERT_EQ(zero[i], x[i] - d[i]) << i;
          ASSERT_EQ(static_cast<double>(d[i]) + zero[i], static_cast<double>(x[i])) << i;
        } else {
          ASSERT_EQ(zero[i], 0.0f) << i;
        }
      }
    }
  }
  // The public entry points (whatever CORTADO_CODEC_ISA chose) agree with the explicit ones.
  std::vector<uint8_t> bytes(EncodedBytes(CodecKind::kEpgc11, n));
  Encode(CodecKind::kEpgc11, x.data(), n, bytes.data());
  EXPECT_EQ(bytes, EncodeWith(Isa::kPortable, CodecKind::kEpgc11, x.data(), n, {}));
  std::vector<float> acc = acc0, d(n);
  DecodeAccumulate(CodecKind::kEpgc11, bytes.data(), n, acc.data());
  Decode(CodecKind::kEpgc11, bytes.data(), n, d.data());
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameBits(acc[i], acc0[i] + d[i])) << i;
}

TEST(CodecIsa, Avx2Available) {
  if (!codec_internal::CpuHasAvx2()) {
    GTEST_SKIP() << "this CPU lacks AVX2/F16C: only the portable kernels were tested";
  }
  EXPECT_GE(Isas().size(), 2u);
}

TEST(CodecIsa, Avx512Available) {
  if (!codec_internal::CpuHasAvx512()) {
    GTEST_SKIP() << "this CPU lacks AVX-512 F/BW/DQ/VL/VBMI: the AVX-512 kernels were not tested "
                    "(the cross-ISA tests compared only "
                 << (codec_internal::CpuHasAvx2() ? "AVX2 and portable)" : "portable)");
  }
  EXPECT_EQ(Isas().size(), 3u);
}

}  // namespace
}  // namespace cortado::dist
