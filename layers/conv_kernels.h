// The convolution layer's device kernels as shared bodies (engine/tensor/indexed_launch.h): the
// direct convolution forward, backward data and backward filter that the TEST device runs in
// place of cuDNN, and the bias and its gradient, which run on every device (after cuDNN's pass on
// a GPU). Each body computes one output element from the definition (no im2col, no GEMM), reading
// x, w and y through the strides of their memory formats as cuDNN is told them (ConvDims), so the
// layer's plumbing (formats, the OHWI weight copy, groups, dilation) runs on the test device as it
// would on a GPU. Elements are read through element codes C (layers/element_codes.h) and the sums
// run in C::Acc (f32 or f64; f32 for bf16 and f16, whose products are exact in f32: the CPU's
// mixed precision), each output stored once through the codes O (16-bit outputs, or the f32
// weight and bias gradients of 16-bit activations), in an order of their own (the longest run of
// terms of one tap or row as a StridedDot, the rest around it): they equal the CPU's
// im2col + GEMM within the rounding of a sum of that many terms (and the one rounding of a 16-bit
// output), not bit for bit.
//
// A CUDA build instantiates every body in layers/cuda/conv.cu; there the layer runs cuDNN for the
// three passes (cuda::LayerConvolution below, RunConvolution's case built by LayerConvCase in
// layers/cuda/layer_cases.h) and these bodies only for the bias.
#pragma once

#include <cstdint>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE
#include "engine/tensor/dtype.h"
#include "layers/matmul_kernels.h"  // StridedDot

namespace cortado {

enum class ConvPassKind : uint8_t { kForward, kBackwardData, kBackwardFilter };

// A convolution as the device runs it: logical dims (x (N, C, H, W), w (K, C / groups, kh, kw),
// y (N, K, oh, ow)) and the memory formats (x and y NHWC or NCHW, w OHWI or OIHW).
struct ConvDims {
  struct Strides {
    int64_t n, c, h, w;
  };
  int64_t n = 1, c = 1, h = 1, w = 1, k = 1, kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  int64_t groups = 1, oh = 1, ow = 1;
  bool nhwc = false;  // x and y channels-last
  bool ohwi = false;  // w as (K, kh, kw, C / groups) in memory

  // Element strides of x and y along (n, channel, row, column), and of w along (o, i, r, s).
  CORTADO_HOST_DEVICE Strides XStrides() const {
    return nhwc ? Strides{h * w * c, 1, w * c, c} : Strides{c * h * w, h * w, w, 1};
  }
  CORTADO_HOST_DEVICE Strides YStrides() const {
    return nhwc ? Strides{oh * ow * k, 1, ow * k, k} : Strides{k * oh * ow, oh * ow, ow, 1};
  }
  CORTADO_HOST_DEVICE Strides WStrides() const {
    const int64_t cg = c / groups;
    return ohwi ? Strides{kh * kw * cg, 1, kw * cg, cg} : Strides{cg * kh * kw, kh * kw, kw, 1};
  }
  // The logical (n, channel, row, column) of element `i` in memory of a (N, channels, rows,
  // cols) tensor in the activations' format.
  CORTADO_HOST_DEVICE void Split(int64_t i, int64_t channels, int64_t rows, int64_t cols,
                                 int64_t* out) const {
    if (nhwc) {
      out[1] = i % channels;
      i /= channels;
      out[3] = i % cols;
      i /= cols;
      out[2] = i % rows;
      out[0] = i / rows;
    } else {
      out[3] = i % cols;
      i /= cols;
      out[2] = i % rows;
      i /= rows;
      out[1] = i % channels;
      out[0] = i / channels;
    }
  }
  // The channel of element `i` of y.
  CORTADO_HOST_DEVICE int64_t OutputChannel(int64_t i) const {
    return nhwc ? i % k : (i / (oh * ow)) % k;
  }
};

// The taps t in [0, taps) (or positions, with `step` the stride) whose coordinate start + t step
// lies in [0, size): the half-open range [*lo, *hi), empty when none does. The bodies loop over
// these ranges, so their inner loops test no bounds.
CORTADO_HOST_DEVICE void InsideRange(int64_t start, int64_t step, int64_t size, int64_t taps,
                                     int64_t* lo, int64_t* hi) {
  *lo = start >= 0 ? 0 : (-start + step - 1) / step;
  *hi = start >= size ? 0 : (size - 1 - start) / step + 1;
  if (*hi > taps) *hi = taps;
  if (*hi < *lo) *hi = *lo;
}

namespace kernels {

// y[i] = sum over the group's input channels and the kernel taps inside the input of x * w (plus
// bias[its channel] when given: 16-bit outputs take it before their one rounding, as the CPU
// adds it in f32). One index per element of y.
template <class C>
struct ConvForward {
  using T = typename C::Stored;
  using A = typename C::Acc;
  ConvDims d;
  const T* x;
  const T* w;
  T* y;
  const A* bias = nullptr;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    int64_t at[4];
    d.Split(i, d.k, d.oh, d.ow, at);
    const int64_t n = at[0], o = at[1], p = at[2], q = at[3];
    const ConvDims::Strides xs = d.XStrides(), ws = d.WStrides();
    const int64_t cg = d.c / d.groups, first = o / (d.k / d.groups) * cg;
    const int64_t h0 = p * d.stride_h - d.pad_h, w0 = q * d.stride_w - d.pad_w;
    int64_t r0, r1, s0, s1;
    InsideRange(h0, d.dilation_h, d.h, d.kh, &r0, &r1);
    InsideRange(w0, d.dilation_w, d.w, d.kw, &s0, &s1);
    const T* xn = x + n * xs.n + first * xs.c;
    const T* wo = w + o * ws.n;
    A sum = A(0);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t s = s0; s < s1; ++s) {
        // The tap over the group's input channels.
        sum += StridedDot<C>(xn + (h0 + r * d.dilation_h) * xs.h + (w0 + s * d.dilation_w) * xs.w,
                             xs.c, wo + r * ws.h + s * ws.w, ws.c, cg);
      }
    }
    if (bias != nullptr) sum += bias[o];
    y[i] = C::Store(sum);
  }
};

// The output position p with p stride = at, if there is one in [0, out). Stride 1 (most
// convolutions) skips the division, which costs more than the rest of a tap on the host.
CORTADO_HOST_DEVICE bool OutputAt(int64_t at, int64_t stride, int64_t out, int64_t* p) {
  if (at < 0) return false;
  if (stride != 1) {
    if (at % stride != 0) return false;
    at /= stride;
  }
  *p = at;
  return at < out;
}

// dx[i] = sum over the outputs that read x's element i (each tap whose output position is a whole
// stride inside the output, and the group's output channels) of dy * w: a gather, so each index
// writes its own element. One index per element of dx.
template <class C>
struct ConvBackwardData {
  using T = typename C::Stored;
  ConvDims d;
  const T* dy;
  const T* w;
  T* dx;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    int64_t at[4];
    d.Split(i, d.c, d.h, d.w, at);
    const int64_t n = at[0], c = at[1], ih = at[2], iw = at[3];
    const ConvDims::Strides ys = d.YStrides(), ws = d.WStrides();
    const int64_t cg = d.c / d.groups, kg = d.k / d.groups;
    const int64_t first = c / cg * kg, ci = c % cg;
    typename C::Acc sum = 0;
    for (int64_t r = 0; r < d.kh; ++r) {
      int64_t p;
      if (!OutputAt(ih + d.pad_h - r * d.dilation_h, d.stride_h, d.oh, &p)) continue;
      for (int64_t s = 0; s < d.kw; ++s) {
        int64_t q;
        if (!OutputAt(iw + d.pad_w - s * d.dilation_w, d.stride_w, d.ow, &q)) continue;
        const T* dyt = dy + n * ys.n + first * ys.c + p * ys.h + q * ys.w;
        const T* wt = w + first * ws.n + ci * ws.c + r * ws.h + s * ws.w;
        sum += StridedDot<C>(dyt, ys.c, wt, ws.n, kg);  // over the group's output channels
      }
    }
    dx[i] = C::Store(sum);
  }
};

// dw[i] = sum over images and the output positions where the tap reads inside the input of dy *
// that input element, stored through O. One index per element of dw (in w's format).
template <class C, class O = C>
struct ConvBackwardFilter {
  using T = typename C::Stored;
  ConvDims d;
  const T* x;
  const T* dy;
  typename O::Stored* dw;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t cg = d.c / d.groups;
    int64_t o, ci, r, s;
    if (d.ohwi) {
      ci = i % cg;
      s = i / cg % d.kw;
      r = i / (cg * d.kw) % d.kh;
      o = i / (cg * d.kw * d.kh);
    } else {
      s = i % d.kw;
      r = i / d.kw % d.kh;
      ci = i / (d.kw * d.kh) % cg;
      o = i / (d.kw * d.kh * cg);
    }
    const ConvDims::Strides xs = d.XStrides(), ys = d.YStrides();
    const int64_t c = o / (d.k / d.groups) * cg + ci;
    // Output rows p read input row p stride_h - pad_h + r dilation_h (columns alike).
    const int64_t h0 = r * d.dilation_h - d.pad_h, w0 = s * d.dilation_w - d.pad_w;
    int64_t p0, p1, q0, q1;
    InsideRange(h0, d.stride_h, d.h, d.oh, &p0, &p1);
    InsideRange(w0, d.stride_w, d.w, d.ow, &q0, &q1);
    typename C::Acc sum = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t p = p0; p < p1; ++p) {
        const T* dyr = dy + n * ys.n + o * ys.c + p * ys.h;
        const T* xr = x + n * xs.n + c * xs.c + (h0 + p * d.stride_h) * xs.h + w0 * xs.w;
        sum += StridedDot<C>(dyr + q0 * ys.w, ys.w, xr + q0 * d.stride_w * xs.w, d.stride_w * xs.w,
                             q1 - q0);
      }
    }
    dw[i] = O::Store(sum);
  }
};

// y[i] += bias[its channel] (in C::Acc, the bias in f32 for 16-bit y). One index per element of y.
template <class C>
struct ConvAddBias {
  ConvDims d;
  const typename C::Acc* bias;
  typename C::Stored* y;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    y[i] = C::Store(C::Load(y[i]) + bias[d.OutputChannel(i)]);
  }
};

// db[o] = sum over images and output positions of dy (channel o), summed in C::Acc, stored
// through O. One index per channel.
template <class C, class O = C>
struct ConvBiasGradient {
  using T = typename C::Stored;
  ConvDims d;
  const T* dy;
  typename O::Stored* db;
  CORTADO_HOST_DEVICE void operator()(int64_t o) const {
    const ConvDims::Strides ys = d.YStrides();
    typename C::Acc sum = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t p = 0; p < d.oh; ++p) {
        const T* dyr = dy + n * ys.n + o * ys.c + p * ys.h;
        for (int64_t q = 0; q < d.ow; ++q) sum += C::Load(dyr[q * ys.w]);
      }
    }
    db[o] = O::Store(sum);
  }
};

}  // namespace kernels

#ifdef CORTADO_HAVE_CUDA
namespace cuda {
// The pass on GPU `device` through cuDNN (layers/cuda/conv.cu: RunConvolution with
// LayerConvCase(dims, pass, dtype)): x, w, y are device pointers as RunConvolution takes them.
void LayerConvolution(int device, const ConvDims& dims, ConvPassKind pass, DType dtype, void* x,
                      void* w, void* y);
}  // namespace cuda
#endif

}  // namespace cortado
