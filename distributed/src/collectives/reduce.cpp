// Reduction kernels; see reduce.h. The f32 and f64 loops are written so the compiler vectorizes
// them (the build uses -O3 and, by default, -march=native): one loop per aliasing pattern, each
// with __restrict pointers, because a loop that might alias gets a scalar fallback.
#include "collectives/reduce.h"

#include <cstdint>
#include <cstring>

#include "cortado/dist/codec.h"

namespace cortado::dist::internal {
namespace {

template <typename T>
inline T MaxOf(T a, T b) {
  return (b > a || b != b) ? b : a;
}

// One loop per aliasing pattern, for T = float and double.
// dst == a
template <typename T>
void SumInPlace(T* __restrict d, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = d[i] + b[i];
}
// dst == b
template <typename T>
void SumInPlaceRight(T* __restrict d, const T* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = a[i] + d[i];
}
template <typename T>
void Sum3(T* __restrict d, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
}
template <typename T>
void MaxInPlace(T* __restrict d, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = MaxOf(d[i], b[i]);
}
template <typename T>
void MaxInPlaceRight(T* __restrict d, const T* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = MaxOf(a[i], d[i]);
}
template <typename T>
void Max3(T* __restrict d, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = MaxOf(a[i], b[i]);
}

// f32 and f64: the same kernels in the type's own precision.
template <typename T>
void ReduceFloat(T* d, const T* a, const T* b, size_t n, bool max) {
  if (d == a) {
    max ? MaxInPlace(d, b, n) : SumInPlace(d, b, n);
  } else if (d == b) {
    max ? MaxInPlaceRight(d, a, n) : SumInPlaceRight(d, a, n);
  } else {
    max ? Max3(d, a, b, n) : Sum3(d, a, b, n);
  }
}

// 16-bit types: convert a block to f32 on the stack, reduce, convert back. Blocks keep the
// temporaries in L1 and let the f32 loops vectorize.
constexpr size_t kBlock = 256;

template <typename ToF32, typename FromF32>
void Reduce16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n, bool max, ToF32 to,
              FromF32 from) {
  float fa[kBlock], fb[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = n - base < kBlock ? n - base : kBlock;
    to(a + base, fa, m);
    to(b + base, fb, m);
    ReduceFloat(fa, fa, fb, m, max);
    from(fa, d + base, m);
  }
}

// The 16-bit conversions are the codecs' (round to nearest even, vectorized per CPU): one set of
// kernels for the compressed all-reduce, the f16/bf16 data all-reduce and the engine's tensors.
void HalfToF32(const uint16_t* in, float* out, size_t n) { Decode(CodecKind::kF16, in, n, out); }
void F32ToHalf(const float* in, uint16_t* out, size_t n) { Encode(CodecKind::kF16, in, n, out); }
void BF16ToF32(const uint16_t* in, float* out, size_t n) { Decode(CodecKind::kBF16, in, n, out); }
void F32ToBF16(const float* in, uint16_t* out, size_t n) { Encode(CodecKind::kBF16, in, n, out); }

}  // namespace

void Reduce(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op) {
  if (count == 0) return;
  bool max = op == ReduceOp::kMax;
  switch (type) {
    case DataType::kF32:
      ReduceFloat(static_cast<float*>(dst), static_cast<const float*>(a),
                  static_cast<const float*>(b), count, max);
      return;
    case DataType::kF64:
      ReduceFloat(static_cast<double*>(dst), static_cast<const double*>(a),
                  static_cast<const double*>(b), count, max);
      return;
    case DataType::kF16:
      Reduce16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
               static_cast<const uint16_t*>(b), count, max, HalfToF32, F32ToHalf);
      return;
    case DataType::kBF16:
      Reduce16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
               static_cast<const uint16_t*>(b), count, max, BF16ToF32, F32ToBF16);
      return;
  }
}

void Finalize(void* data, size_t count, DataType type, ReduceOp op, int divisor) {
  if (op != ReduceOp::kAvg || divisor == 1 || count == 0) return;
  if (type == DataType::kF64) {
    // One division by the exact divisor: the mean is the correctly rounded sum / n.
    double q = static_cast<double>(divisor);
    double* d = static_cast<double*>(data);
    for (size_t i = 0; i < count; ++i) d[i] = d[i] / q;
    return;
  }
  float q = static_cast<float>(divisor);
  if (type == DataType::kF32) {
    float* d = static_cast<float*>(data);
    for (size_t i = 0; i < count; ++i) d[i] = d[i] / q;
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(data);
  float f[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t m = count - base < kBlock ? count - base : kBlock;
    if (type == DataType::kF16) {
      HalfToF32(d + base, f, m);
    } else {
      BF16ToF32(d + base, f, m);
    }
    for (size_t i = 0; i < m; ++i) f[i] = f[i] / q;
    if (type == DataType::kF16) {
      F32ToHalf(f, d + base, m);
    } else {
      F32ToBF16(f, d + base, m);
    }
  }
}

void ScaleAndFeedBack(float* data, size_t count, float scale, float* residual) {
  if (residual == nullptr) {
    if (scale != 1.0f) {
      for (size_t i = 0; i < count; ++i) data[i] *= scale;
    }
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    data[i] = data[i] * scale + residual[i];
    residual[i] = 0;
  }
}

}  // namespace cortado::dist::internal
