// The inner product layer's device kernels as shared bodies (engine/tensor/indexed_launch.h): a
// row-major product C (m x n) = op(A) op(B), with the bias added (forward) or the bias gradient
// (the sums of op(A) over k, for the A^T B product of the weight gradient) beside it, in the terms
// of RunMatmul (engine/cuda/cublaslt_matmul.h). The TEST device runs these in place of cuBLASLt;
// a CUDA build instantiates them in layers/cuda/conv.cu but runs cuBLASLt there
// (cuda::LayerMatmul, its case built by LayerMatmulCase in layers/cuda/layer_cases.h). Each index
// sums its k terms in T (StridedDot's order): equal to the CPU's GEMM within the rounding of a
// k-term sum.
#pragma once

#include <cstdint>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE
#include "engine/tensor/dtype.h"
#include "layers/element_codes.h"

namespace cortado {

// One product: A stored (m x k), or (k x m) when transpose_a; B stored (k x n), or (n x k) when
// transpose_b; C (m x n); bias (n) added to every row; bias_grad (m) = the row sums of op(A),
// only for A^T B products.
struct MatmulDims {
  int64_t m = 1, n = 1, k = 1;
  bool transpose_a = false, transpose_b = false;
  bool bias = false, bias_grad = false;
};

// The inner product's three products for x (batch x in) and W (out x in), row-major:
//   forward       y (batch x out) = x W^T + b
//   weight grad   dW (out x in)   = dy^T x, and db = the column sums of dy
//   input grad    dx (batch x in) = dy W
inline MatmulDims InnerProductForward(int64_t batch, int64_t in, int64_t out, bool bias) {
  return {.m = batch, .n = out, .k = in, .transpose_b = true, .bias = bias};
}
inline MatmulDims InnerProductWeightGradient(int64_t batch, int64_t in, int64_t out, bool bias) {
  return {.m = out, .n = in, .k = batch, .transpose_a = true, .bias_grad = bias};
}
inline MatmulDims InnerProductInputGradient(int64_t batch, int64_t in, int64_t out) {
  return {.m = batch, .n = in, .k = out};
}

namespace kernels {

// sum over j < len of a[j sa] b[j sb], read through the element codes C (layers/element_codes.h:
// 16-bit values widened to f32, whose products are exact in f32) and summed in C::Acc, in four
// interleaved partial sums added at the end: the sums' dependency chains are four times shorter
// than one running sum's, which makes the test device's host loops (and a GPU thread) several
// times faster, in one fixed order.
template <class C>
CORTADO_HOST_DEVICE typename C::Acc StridedDot(const typename C::Stored* a, int64_t sa,
                                               const typename C::Stored* b, int64_t sb,
                                               int64_t len) {
  using A = typename C::Acc;
  A s0 = A(0), s1 = A(0), s2 = A(0), s3 = A(0);
  int64_t j = 0;
  for (; j + 4 <= len; j += 4) {
    s0 += C::Load(a[j * sa]) * C::Load(b[j * sb]);
    s1 += C::Load(a[(j + 1) * sa]) * C::Load(b[(j + 1) * sb]);
    s2 += C::Load(a[(j + 2) * sa]) * C::Load(b[(j + 2) * sb]);
    s3 += C::Load(a[(j + 3) * sa]) * C::Load(b[(j + 3) * sb]);
  }
  for (; j < len; ++j) s0 += C::Load(a[j * sa]) * C::Load(b[j * sb]);
  return (s0 + s1) + (s2 + s3);
}

// c[i, j] = sum over l of op(A)[i, l] op(B)[l, j] (+ bias[j]), A and B read through the codes C,
// summed and the bias added in C::Acc, C stored once through the codes O: the CPU's mixed
// precision (16-bit inputs, f32 sums; 16-bit outputs, or f32 weight gradients). One index per
// element of C.
template <class C, class O = C>
struct Matmul {
  MatmulDims d;
  const typename C::Stored* a;
  const typename C::Stored* b;
  const typename C::Acc* bias;  // null without the bias (f32 for 16-bit inputs)
  typename O::Stored* c;
  CORTADO_HOST_DEVICE void operator()(int64_t idx) const {
    const int64_t i = idx / d.n, j = idx % d.n;
    // Row i of op(A) and column j of op(B), with their strides over l.
    const typename C::Stored* ai = d.transpose_a ? a + i : a + i * d.k;
    const typename C::Stored* bj = d.transpose_b ? b + j * d.k : b + j;
    const typename C::Acc sum =
        StridedDot<C>(ai, d.transpose_a ? d.m : 1, bj, d.transpose_b ? 1 : d.n, d.k);
    c[idx] = O::Store(bias != nullptr ? sum + bias[j] : sum);
  }
};

// bias_grad[i] = sum over l of op(A)[i, l] with A stored (k x m) (the A^T B products), summed in
// C::Acc, stored through O. One index per row of C.
template <class C, class O = C>
struct MatmulBiasGradient {
  MatmulDims d;
  const typename C::Stored* a;
  typename O::Stored* bias_grad;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    typename C::Acc sum = 0;
    for (int64_t l = 0; l < d.k; ++l) sum += C::Load(a[l * d.m + i]);
    bias_grad[i] = O::Store(sum);
  }
};

}  // namespace kernels

#ifdef CORTADO_HAVE_CUDA
namespace cuda {
// The product on GPU `device` through cuBLASLt (layers/cuda/conv.cu: RunMatmul with
// LayerMatmulCase(dims, dtype, out_dtype)); device pointers, bias and bias_grad null unless dims
// asks.
void LayerMatmul(int device, const MatmulDims& dims, DType dtype, DType out_dtype, const void* a,
                 const void* b, void* c, const void* bias, void* bias_grad);
}  // namespace cuda
#endif

}  // namespace cortado
