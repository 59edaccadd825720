#include "engine/dtype.h"

#include "cortado/dist/types.h"
#include "engine/error.h"

namespace cortado {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

DType ParseDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kU8}) {
    if (name == DTypeName(d)) return d;
  }
  Fail("unknown dtype '", name, "' (known: f32, f64, f16, bf16, i32, u8)");
}

// The bit-level conversions live in the communication library (its codecs need them too).
Half FloatToHalf(float f) { return Half{dist::FloatToHalf(f)}; }
float HalfToFloat(Half h) { return dist::HalfToFloat(h.bits); }
BFloat16 FloatToBFloat16(float f) { return BFloat16{dist::FloatToBFloat16(f)}; }
float BFloat16ToFloat(BFloat16 b) { return dist::BFloat16ToFloat(b.bits); }

}  // namespace cortado
