// Element types and reduction operators of the collectives (the fp16/bf16 conversions they use
// are half.h's). f16 and bf16 are reduced by converting to f32, combining, and rounding back once
// per pairwise step (round to nearest even), so accumulation happens in f32. f32 and f64 are
// reduced in their own precision; f64 is for statistics that must match a single process to
// rounding (synchronized batch norm's per-channel sums), not for bulk gradients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "cortado/dist/half.h"

namespace cortado::dist {

enum class DataType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };
enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2 };

size_t DataTypeSize(DataType type);               // bytes per element: 4, 2, 2, 8
const char* DataTypeName(DataType type);          // "f32", "f16", "bf16", "f64"
const char* ReduceOpName(ReduceOp op);            // "sum", "avg", "max"
DataType ParseDataType(const std::string& name);  // throws kInvalidArgument naming the text
ReduceOp ParseReduceOp(const std::string& name);

// FloatToBits, BitsToFloat and the f16 / bf16 conversions: cortado/dist/half.h.

}  // namespace cortado::dist
