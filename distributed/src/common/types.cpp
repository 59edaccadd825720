// Element type names, parsing and the fp16 conversion (bf16's is inline in the header).
#include "cortado/dist/types.h"

#include "common/names.h"
#include "cortado/dist/error.h"

namespace cortado::dist {

namespace {

constexpr internal::Spelling<ErrorKind> kErrorKindNames[] = {
    {ErrorKind::kInvalidArgument, "invalid argument"},
    {ErrorKind::kConfig, "configuration"},
    {ErrorKind::kTimeout, "timeout"},
    {ErrorKind::kPeerFailure, "peer failure"},
    {ErrorKind::kRejected, "rejected"},
    {ErrorKind::kProtocol, "protocol"},
    {ErrorKind::kSystem, "system"},
    {ErrorKind::kInternal, "internal"}};
constexpr internal::Spelling<DataType> kDataTypeNames[] = {
    {DataType::kF32, "f32"},     {DataType::kF16, "f16"},     {DataType::kBF16, "bf16"},
    {DataType::kF64, "f64"},     {DataType::kF32, "float32"}, {DataType::kF32, "float"},
    {DataType::kF16, "float16"}, {DataType::kF16, "half"},    {DataType::kBF16, "bfloat16"},
    {DataType::kF64, "float64"}, {DataType::kF64, "double"}};
constexpr internal::Spelling<ReduceOp> kReduceOpNames[] = {{ReduceOp::kSum, "sum"},
                                                           {ReduceOp::kAvg, "avg"},
                                                           {ReduceOp::kMax, "max"},
                                                           {ReduceOp::kAvg, "average"},
                                                           {ReduceOp::kAvg, "mean"}};

}  // namespace

const char* ErrorKindName(ErrorKind kind) { return internal::NameOf(kErrorKindNames, kind); }

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

const char* DataTypeName(DataType type) { return internal::NameOf(kDataTypeNames, type); }

const char* ReduceOpName(ReduceOp op) { return internal::NameOf(kReduceOpNames, op); }

DataType ParseDataType(const std::string& name) {
  if (auto type = internal::FindName(kDataTypeNames, name)) return *type;
  Fail(ErrorKind::kInvalidArgument, "unknown element type '", name,
       "' (known: ", internal::KnownNames(kDataTypeNames), ")");
}

ReduceOp ParseReduceOp(const std::string& name) {
  if (auto op = internal::FindName(kReduceOpNames, name)) return *op;
  Fail(ErrorKind::kInvalidArgument, "unknown reduction '", name,
       "' (known: ", internal::KnownNames(kReduceOpNames), ")");
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
