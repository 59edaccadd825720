// Element types. f32 is the training type on CPU; f64 exists for reference kernels and gradient
// checks; f16 and bf16 are storage types for mixed precision (converted with the functions
// below, round-to-nearest-even); i32 holds labels, u8 raw pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

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

// The C++ element type of each DType, in the enum's order.
template <typename... Ts>
struct TypeList {};
using DTypeTypes = TypeList<float, double, Half, BFloat16, int32_t, uint8_t>;

// Where T stands in a TypeList, or -1.
template <typename T, typename... Ts>
constexpr int IndexOfType(TypeList<Ts...>) {
  constexpr bool kSame[] = {std::is_same_v<T, Ts>...};
  for (size_t i = 0; i < sizeof...(Ts); ++i) {
    if (kSame[i]) return static_cast<int>(i);
  }
  return -1;
}

// Maps a C++ element type to its DType, so Tensor::data<T>() can check what it hands out.
template <typename T>
struct DTypeOf {
  static constexpr int kIndex = IndexOfType<T>(DTypeTypes{});
  static_assert(kIndex >= 0, "DTypeOf: not an element type (see DTypeTypes)");
  static constexpr DType value = static_cast<DType>(kIndex);
};

}  // namespace cortado
