// Internal: element-wise reduction kernels of the collectives. f32 and f64 combine in their own
// precision; f16 and bf16 are widened to f32, combined, and rounded back (nearest even); f16
// uses F16C when the build targets it.
#pragma once

#include <cstddef>

#include "cortado/dist/types.h"

namespace cortado::dist::internal {

// dst[i] = a[i] op b[i] for i < count; dst may be a or b (exactly), not a partial overlap.
// op is kSum or kMax (kAvg reduces as kSum; Finalize divides). For kMax the result is
// (b > a || b is NaN) ? b : a, so callers that need identical results on two ranks pass the
// operands in rank order.
void Reduce(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op);

// data[i] /= divisor (the last step of kAvg); a no-op for other ops or divisor 1.
void Finalize(void* data, size_t count, DataType type, ReduceOp op, int divisor);

// The first pass of a compressed all-reduce: data[i] = data[i] * scale + residual[i], the
// product rounded to f32 before the sum (never fused: the file is built with -ffp-contract=off),
// and residual[i] = 0 (residual may be null: data[i] *= scale).
void ScaleAndFeedBack(float* data, size_t count, float scale, float* residual);

// The stochastic-rounding stream of one encoding site of a compressed all-reduce: each rank and
// ring step draws its own bits, so the roundings of successive hops are independent.
inline uint64_t HopSeed(uint64_t seed, int rank, int step) {
  uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(rank) + 1));
  h ^= 0xbf58476d1ce4e5b9ull * (static_cast<uint64_t>(step) + 1);
  return h ^ (h >> 31);
}

}  // namespace cortado::dist::internal
