#include "engine/dtype.h"

#include "engine/error.h"

namespace cortado {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
  }
  return "?";
}

DType ParseDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kU8}) {
    if (name == DTypeName(d)) return d;
  }
  Fail("unknown dtype '", name, "' (known: f32, f64, f16, bf16, i32, u8)");
}

Half FloatToHalf(float f) {
  uint32_t x = FloatBits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf or nan
    return Half{static_cast<uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u))};
  }
  if (mag >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow
  if (mag < 0x38800000u) {
    // Subnormal half (or zero): add a magic number so the FPU rounds at the right bit.
    float r = BitsFloat(mag) + 0.5f;
    return Half{static_cast<uint16_t>(sign | (FloatBits(r) - FloatBits(0.5f)))};
  }
  uint32_t mant_odd = (mag >> 13) & 1u;
  mag += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return Half{static_cast<uint16_t>(sign | (mag >> 13))};
}

float HalfToFloat(Half h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return (sign != 0u) ? -v : v;
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace cortado
