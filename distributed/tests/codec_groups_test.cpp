// The group functions of codecs/codec_values.h, which the CUDA kernels run one group of 8 values
// per thread, run here on the host over whole streams and held to the CPU codecs bit for bit:
// bytes, residuals, decoded and accumulated values, for every codec, rounding mode and residual
// setting, at counts from 0 to past 2^16 and at stream positions past 2^32. What the GPU adds on
// top (the launch, one thread per group) is tested on a GPU by codec_device_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codecs/codec_values.h"
#include "cortado/dist/codec.h"
#include "cortado/dist/types.h"

namespace cortado::dist {
namespace {

using codec_internal::DecodeGroup;
using codec_internal::EncodeGroup;
using codec_internal::GroupByteOffset;

// Runs the group functions as the kernels do: group g holds values 8g .. 8g + 7.
template <CodecKind K, Rounding R, bool kResidual>
void EncodeByGroups(const float* src, size_t count, uint8_t* dst, const EncodeOptions& o,
                    float* residual) {
  for (size_t g = 0; g * 8 < count; ++g) {
    const int k = static_cast<int>(std::min<size_t>(8, count - g * 8));
    EncodeGroup<K, R, kResidual>(src + g * 8, k, dst + GroupByteOffset<K>(g), o.seed,
                                 o.first_index + g * 8, kResidual ? residual + g * 8 : nullptr);
  }
}

template <CodecKind K, bool kAccumulate>
void DecodeByGroups(const uint8_t* src, size_t count, float* dst) {
  for (size_t g = 0; g * 8 < count; ++g) {
    const int k = static_cast<int>(std::min<size_t>(8, count - g * 8));
    DecodeGroup<K, kAccumulate>(src + GroupByteOffset<K>(g), k, dst + g * 8);
  }
}

template <CodecKind K>
void EncodeAny(Rounding r, bool residual, const float* src, size_t n, uint8_t* dst,
               const EncodeOptions& o, float* res) {
  switch (r) {
    case Rounding::kNearest:
      return residual ? EncodeByGroups<K, Rounding::kNearest, true>(src, n, dst, o, res)
                      : EncodeByGroups<K, Rounding::kNearest, false>(src, n, dst, o, res);
    case Rounding::kTruncate:
      return residual ? EncodeByGroups<K, Rounding::kTruncate, true>(src, n, dst, o, res)
                      : EncodeByGroups<K, Rounding::kTruncate, false>(src, n, dst, o, res);
    case Rounding::kStochastic:
      return residual ? EncodeByGroups<K, Rounding::kStochastic, true>(src, n, dst, o, res)
                      : EncodeByGroups<K, Rounding::kStochastic, false>(src, n, dst, o, res);
  }
}

// Values of every kind a gradient holds, with the edges sprinkled in.
std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::uniform_int_distribution<uint32_t> bits;
  const float edges[] = {0.0f,
                         -0.0f,
                         65504.0f,
                         65520.0f,
                         1e-8f,
                         -6e-5f,
                         3e38f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::denorm_min()};
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 7) {
      case 0:
        x[i] = BitsToFloat(bits(gen));  // any pattern: NaNs, subnormals, huge values
        break;
      case 1:
        x[i] = edges[(i / 7) % (sizeof(edges) / sizeof(edges[0]))];
        break;
      default:
        x[i] = normal(gen) * static_cast<float>(1 << (i % 5 * 4));
    }
  }
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp of empty vectors would pass it null pointers)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

template <CodecKind K>
void CheckKind() {
  const size_t counts[] = {0, 1, 7, 8, 9, 15, 17, 1000, (size_t{1} << 16) + 3};
  for (Rounding rounding : {Rounding::kNearest, Rounding::kTruncate, Rounding::kStochastic}) {
    for (bool residual : {false, true}) {
      for (size_t n : counts) {
        SCOPED_TRACE(testing::Message() << CodecName(K) << " " << RoundingName(rounding)
                                        << (residual ? " residual" : "") << " n=" << n);
        const std::vector<float> x = Gradient(n, static_cast<uint32_t>(n) * 31 + 5);
        // A stream position past 2^32 - 100 crosses the random hash's word boundary.
        const EncodeOptions o{rounding, 0x1234567890abcdefull, (uint64_t{1} << 32) - 100};
        std::vector<uint8_t> cpu(EncodedBytes(K, n) + 1, 0xA5), groups(cpu.size(), 0xA5);
        std::vector<float> cpu_res(n, 0.25f), group_res(n, 0.25f);
        Encode(K, x.data(), n, cpu.data(), o, residual ? cpu_res.data() : nullptr);
        EncodeAny<K>(rounding, residual, x.data(), n, groups.data(), o,
                     residual ? group_res.data() : nullptr);
        ASSERT_EQ(groups, cpu);  // the byte past the end untouched too
        ASSERT_TRUE(SameBits(group_res, cpu_res));

        std::vector<float> cpu_out(n), group_out(n);
        Decode(K, cpu.data(), n, cpu_out.data());
        DecodeByGroups<K, false>(cpu.data(), n, group_out.data());
        ASSERT_TRUE(SameBits(group_out, cpu_out));
        std::vector<float> cpu_acc = Gradient(n, 99), group_acc = cpu_acc;
        DecodeAccumulate(K, cpu.data(), n, cpu_acc.data());
        DecodeByGroups<K, true>(cpu.data(), n, group_acc.data());
        ASSERT_TRUE(SameBits(group_acc, cpu_acc));
      }
    }
  }
}

TEST(CodecGroups, F16MatchesTheCpuKernels) { CheckKind<CodecKind::kF16>(); }
TEST(CodecGroups, Bf16MatchesTheCpuKernels) { CheckKind<CodecKind::kBF16>(); }
TEST(CodecGroups, Epgc11MatchesTheCpuKernels) { CheckKind<CodecKind::kEpgc11>(); }
TEST(CodecGroups, Epgc9MatchesTheCpuKernels) { CheckKind<CodecKind::kEpgc9>(); }
TEST(CodecGroups, Epgc8MatchesTheCpuKernels) { CheckKind<CodecKind::kEpgc8>(); }

TEST(CodecGroups, EveryF16CodeDecodesAsOnTheCpu) {
  std::vector<uint8_t> codes(2 * 65536);
  for (uint32_t c = 0; c < 65536; ++c) {
    codes[2 * c] = static_cast<uint8_t>(c);
    codes[2 * c + 1] = static_cast<uint8_t>(c >> 8);
  }
  std::vector<float> cpu(65536), groups(65536);
  Decode(CodecKind::kF16, codes.data(), 65536, cpu.data());
  DecodeByGroups<CodecKind::kF16, false>(codes.data(), 65536, groups.data());
  EXPECT_TRUE(SameBits(groups, cpu));
}

}  // namespace
}  // namespace cortado::dist
