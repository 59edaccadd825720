// Element types. f32 is the training type on CPU; f64 exists for reference kernels and gradient
// checks; f16 and bf16 are storage types for mixed precision (converted with the functions
// below, round-to-nearest-even); i32 holds labels, u8 raw pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cortado {

enum class DType : uint8_t { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3, kI32 = 4, kU8 = 5 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
// Parses "f32", "f64", "f16", "bf16", "i32", "u8"; throws naming the text otherwise.
DType ParseDType(const std::string& name);

// IEEE 754 binary16 stored as raw bits.
struct Half {
  uint16_t bits = 0;
};
// bfloat16: the upper half of an fp32.
struct BFloat16 {
  uint16_t bits = 0;
};

Half FloatToHalf(float f);
float HalfToFloat(Half h);

BFloat16 FloatToBFloat16(float f);
float BFloat16ToFloat(BFloat16 b);

// Maps a C++ element type to its DType, so Tensor::data<T>() can check what it hands out.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};

}  // namespace cortado
