// The convolution layer's device kernels as shared bodies (engine/tensor/indexed_launch.h): the
// direct convolution forward, backward data and backward filter that the TEST device runs in
// place of cuDNN, and the bias and its gradient, which run on every device (after cuDNN's pass on
// a GPU). Each body computes one output element from the definition (no im2col, no GEMM), reading
// x, w and y through the strides of their memory formats as cuDNN is told them (ConvDims), so the
// layer's plumbing (formats, the OHWI weight copy, groups, dilation) runs on the test device as it
// would on a GPU. The sums run in T (f32 or f64) in an order of their own: they equal the CPU's
// im2col + GEMM within the rounding of a sum of that many terms, not bit for bit.
//
// A CUDA build instantiates every body in layers/cuda/conv.cu; there the layer runs cuDNN for the
// three passes (cuda::LayerConvolution below, RunConvolution's case built by LayerConvCase in
// layers/cuda/layer_cases.h) and these bodies only for the bias.
#pragma once

#include <cstdint>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE
#include "engine/tensor/dtype.h"

namespace cortado {

enum class ConvPassKind : uint8_t { kForward, kBackwardData, kBackwardFilter };

// A convolution as the device runs it: logical dims (x (N, C, H, W), w (K, C / groups, kh, kw),
// y (N, K, oh, ow)) and the memory formats (x and y NHWC or NCHW, w OHWI or OIHW).
struct ConvDims {
  int64_t n = 1, c = 1, h = 1, w = 1, k = 1, kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  int64_t groups = 1, oh = 1, ow = 1;
  bool nhwc = false;  // x and y channels-last
  bool ohwi = false;  // w as (K, kh, kw, C / groups) in memory

  CORTADO_HOST_DEVICE int64_t XAt(int64_t in, int64_t ic, int64_t ih, int64_t iw) const {
    return nhwc ? ((in * h + ih) * w + iw) * c + ic : ((in * c + ic) * h + ih) * w + iw;
  }
  CORTADO_HOST_DEVICE int64_t YAt(int64_t in, int64_t ik, int64_t p, int64_t q) const {
    return nhwc ? ((in * oh + p) * ow + q) * k + ik : ((in * k + ik) * oh + p) * ow + q;
  }
  CORTADO_HOST_DEVICE int64_t WAt(int64_t o, int64_t i, int64_t r, int64_t s) const {
    const int64_t cg = c / groups;
    return ohwi ? ((o * kh + r) * kw + s) * cg + i : ((o * cg + i) * kh + r) * kw + s;
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

namespace kernels {

// y[i] = sum over the group's input channels and the kernel taps inside the input of x * w.
// One index per element of y.
template <typename T>
struct ConvForward {
  ConvDims d;
  const T* x;
  const T* w;
  T* y;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    int64_t at[4];
    d.Split(i, d.k, d.oh, d.ow, at);
    const int64_t n = at[0], o = at[1], p = at[2], q = at[3];
    const int64_t cg = d.c / d.groups, first = o / (d.k / d.groups) * cg;
    T sum = T(0);
    for (int64_t ci = 0; ci < cg; ++ci) {
      for (int64_t r = 0; r < d.kh; ++r) {
        const int64_t ih = p * d.stride_h - d.pad_h + r * d.dilation_h;
        if (ih < 0 || ih >= d.h) continue;
        for (int64_t s = 0; s < d.kw; ++s) {
          const int64_t iw = q * d.stride_w - d.pad_w + s * d.dilation_w;
          if (iw < 0 || iw >= d.w) continue;
          sum += x[d.XAt(n, first + ci, ih, iw)] * w[d.WAt(o, ci, r, s)];
        }
      }
    }
    y[i] = sum;
  }
};

// dx[i] = sum over the outputs that read x's element i (its group's output channels, each tap
// whose output position is a whole stride inside the output) of dy * w: a gather, so each index
// writes its own element. One index per element of dx.
template <typename T>
struct ConvBackwardData {
  ConvDims d;
  const T* dy;
  const T* w;
  T* dx;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    int64_t at[4];
    d.Split(i, d.c, d.h, d.w, at);
    const int64_t n = at[0], c = at[1], ih = at[2], iw = at[3];
    const int64_t cg = d.c / d.groups, kg = d.k / d.groups;
    const int64_t first = c / cg * kg, ci = c % cg;
    T sum = T(0);
    for (int64_t ok = 0; ok < kg; ++ok) {
      const int64_t o = first + ok;
      for (int64_t r = 0; r < d.kh; ++r) {
        const int64_t ph = ih + d.pad_h - r * d.dilation_h;  // p * stride_h
        if (ph < 0 || ph % d.stride_h != 0 || ph / d.stride_h >= d.oh) continue;
        for (int64_t s = 0; s < d.kw; ++s) {
          const int64_t pw = iw + d.pad_w - s * d.dilation_w;
          if (pw < 0 || pw % d.stride_w != 0 || pw / d.stride_w >= d.ow) continue;
          sum += dy[d.YAt(n, o, ph / d.stride_h, pw / d.stride_w)] * w[d.WAt(o, ci, r, s)];
        }
      }
    }
    dx[i] = sum;
  }
};

// dw[i] = sum over images and output positions of dy * the input element the tap reads there.
// One index per element of dw (in w's format).
template <typename T>
struct ConvBackwardFilter {
  ConvDims d;
  const T* x;
  const T* dy;
  T* dw;
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
    const int64_t c = o / (d.k / d.groups) * cg + ci;
    T sum = T(0);
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t p = 0; p < d.oh; ++p) {
        const int64_t ih = p * d.stride_h - d.pad_h + r * d.dilation_h;
        if (ih < 0 || ih >= d.h) continue;
        for (int64_t q = 0; q < d.ow; ++q) {
          const int64_t iw = q * d.stride_w - d.pad_w + s * d.dilation_w;
          if (iw < 0 || iw >= d.w) continue;
          sum += dy[d.YAt(n, o, p, q)] * x[d.XAt(n, c, ih, iw)];
        }
      }
    }
    dw[i] = sum;
  }
};

// y[i] += bias[its channel]. One index per element of y.
template <typename T>
struct ConvAddBias {
  ConvDims d;
  const T* bias;
  T* y;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const { y[i] += bias[d.OutputChannel(i)]; }
};

// db[o] = sum over images and output positions of dy (channel o). One index per channel.
template <typename T>
struct ConvBiasGradient {
  ConvDims d;
  const T* dy;
  T* db;
  CORTADO_HOST_DEVICE void operator()(int64_t o) const {
    T sum = T(0);
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t p = 0; p < d.oh; ++p) {
        for (int64_t q = 0; q < d.ow; ++q) sum += dy[d.YAt(n, o, p, q)];
      }
    }
    db[o] = sum;
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
