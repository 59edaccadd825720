// The host/device conversions of engine/half_bits.h against the CPU's (cortado::dist), bit for
// bit: the CUDA kernels compile the same functions, so this is what keeps GPU conversions equal
// to the CPU reference even where no GPU is present to run them.
#include "engine/half_bits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cortado/dist/types.h"

namespace cortado {
namespace {

TEST(HalfBits, EveryHalfCodeWidensAsTheCpuDoes) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const auto h = static_cast<uint16_t>(code);
    ASSERT_EQ(half_bits::Bits(half_bits::HalfToFloat(h)), dist::FloatToBits(dist::HalfToFloat(h)))
        << std::hex << code;
    ASSERT_EQ(half_bits::Bits(half_bits::BFloat16ToFloat(h)),
              dist::FloatToBits(dist::BFloat16ToFloat(h)))
        << std::hex << code;
  }
}

TEST(HalfBits, FloatsNarrowAsTheCpuDoesAcrossTheirBitPatterns) {
  // A stride through all 2^32 patterns (every sign, exponent and rounding case is hit many
  // times), then the edges: ties, subnormal boundaries, overflow, infinities and NaNs.
  auto check = [](uint32_t bits) {
    const float f = dist::BitsToFloat(bits);
    ASSERT_EQ(half_bits::FloatToHalf(f), dist::FloatToHalf(f)) << std::hex << bits;
    ASSERT_EQ(half_bits::FloatToBFloat16(f), dist::FloatToBFloat16(f)) << std::hex << bits;
  };
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099)
    check(static_cast<uint32_t>(bits));
  const float edges[] = {0.0f,
                         -0.0f,
                         65504.0f,
                         65520.0f,
                         65519.99f,
                         6.1035156e-05f,
                         5.9604645e-08f,
                         2.9802322e-08f,
                         2.9802326e-08f,
                         1.0f + 1.0f / 2048,
                         1.0f + 3.0f / 2048,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::denorm_min(),
                         std::numeric_limits<float>::max()};
  for (float f : edges) check(dist::FloatToBits(f));
  for (uint32_t low = 0; low < 0x20000u; ++low) {
    check(0x7f800000u | (low + 1));  // NaN payloads
    check(0x3f800000u | low);        // every rounding of [1, 1.03) to f16 and bf16
  }
}

}  // namespace
}  // namespace cortado
