// Element type names, parsing and the fp16 conversion (bf16's is inline in the header).
#include "cortado/dist/types.h"

#include "cortado/dist/error.h"

namespace cortado::dist {

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kConfig:
      return "configuration";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kPeerFailure:
      return "peer failure";
    case ErrorKind::kRejected:
      return "rejected";
    case ErrorKind::kProtocol:
      return "protocol";
    case ErrorKind::kSystem:
      return "system";
    case ErrorKind::kInternal:
      return "internal";
  }
  return "?";
}

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kF32:
      return 4;
    case DataType::kF16:
    case DataType::kBF16:
      return 2;
    case DataType::kF64:
      return 8;
  }
  return 4;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kF32:
      return "f32";
    case DataType::kF16:
      return "f16";
    case DataType::kBF16:
      return "bf16";
    case DataType::kF64:
      return "f64";
  }
  return "?";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

DataType ParseDataType(const std::string& name) {
  if (name == "f32" || name == "float32" || name == "float") return DataType::kF32;
  if (name == "f16" || name == "float16" || name == "half") return DataType::kF16;
  if (name == "bf16" || name == "bfloat16") return DataType::kBF16;
  if (name == "f64" || name == "float64" || name == "double") return DataType::kF64;
  Fail(ErrorKind::kInvalidArgument, "unknown element type '", name,
       "' (known: f32, f16, bf16, f64)");
}

ReduceOp ParseReduceOp(const std::string& name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "avg" || name == "average" || name == "mean") return ReduceOp::kAvg;
  if (name == "max") return ReduceOp::kMax;
  Fail(ErrorKind::kInvalidArgument, "unknown reduction '", name, "' (known: sum, avg, max)");
}

uint16_t FloatToHalf(float f) {
  uint32_t x = FloatToBits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in half: scale by 2^24 using float arithmetic (exact round to even).
    float magnitude = BitsToFloat(abs) * 16777216.0f;  // 2^24
    uint32_t m = static_cast<uint32_t>(magnitude);
    float rest = magnitude - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits, ties to even.
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  uint32_t h = (rounded - 0x38000000u) >> 13;
  if (h >= 0x7c00u) h = 0x7c00u;
  return static_cast<uint16_t>(sign | h);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    float magnitude = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return BitsToFloat(FloatToBits(magnitude) | sign);
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (man << 13));
  return BitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

}  // namespace cortado::dist
