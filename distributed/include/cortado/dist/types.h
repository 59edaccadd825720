// Element types and reduction operators of the collectives, and the fp16/bf16 conversions they
// use. f16 and bf16 are reduced by converting to f32, combining, and rounding back once per
// pairwise step (round to nearest even), so accumulation happens in f32. f32 and f64 are reduced
// in their own precision; f64 is for statistics that must match a single process to rounding
// (synchronized batch norm's per-channel sums), not for bulk gradients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace cortado::dist {

enum class DataType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };
enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2 };

size_t DataTypeSize(DataType type);               // bytes per element: 4, 2, 2, 8
const char* DataTypeName(DataType type);          // "f32", "f16", "bf16", "f64"
const char* ReduceOpName(ReduceOp op);            // "sum", "avg", "max"
DataType ParseDataType(const std::string& name);  // throws kInvalidArgument naming the text
ReduceOp ParseReduceOp(const std::string& name);

inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE 754 binary16, as raw bits.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// bfloat16 (the upper half of an f32), as raw bits; NaN stays NaN.
inline uint16_t FloatToBFloat16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}
inline float BFloat16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

}  // namespace cortado::dist
