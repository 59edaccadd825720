#include "engine/tensor/dtype.h"

#include <iterator>

#include "cortado/dist/types.h"
#include "engine/base/error.h"

namespace cortado {

namespace {

// Each DType, in the enum's order (DTypeTypes), with its name and size in bytes.
struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "f32", 4},   {DType::kF64, "f64", 8}, {DType::kF16, "f16", 2},
    {DType::kBF16, "bf16", 2}, {DType::kI32, "i32", 4}, {DType::kU8, "u8", 1},
};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kDTypes: one row per DType, in the enum's order");

// The row of `dtype`, or null for a value outside the enum.
const DTypeInfo* Find(DType dtype) {
  const auto i = static_cast<size_t>(dtype);
  return i < std::size(kDTypes) ? &kDTypes[i] : nullptr;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info != nullptr ? info->size : 0;
}

const char* DTypeName(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info != nullptr ? info->name : "?";
}

DType ParseDType(const std::string& name) {
  std::string known;
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return info.dtype;
    known += (known.empty() ? "" : ", ") + std::string(info.name);
  }
  Fail("unknown dtype '", name, "' (known: ", known, ")");
}

// The bit-level conversions live in the communication library (its codecs need them too).
Half FloatToHalf(float f) { return Half{dist::FloatToHalf(f)}; }
float HalfToFloat(Half h) { return dist::HalfToFloat(h.bits); }
BFloat16 FloatToBFloat16(float f) { return BFloat16{dist::FloatToBFloat16(f)}; }
float BFloat16ToFloat(BFloat16 b) { return dist::BFloat16ToFloat(b.bits); }

}  // namespace cortado
