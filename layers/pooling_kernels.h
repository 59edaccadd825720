// Pooling's shared kernel bodies (layers/pooling.h), launched by RunIndexed on the test device
// or a GPU (engine/tensor/indexed_launch.h; instantiated for CUDA in layers/cuda/pooling.cu).
// Each index computes one element of its output, in the tensor's memory order (NCHW or NHWC),
// and visits its terms in the CPU kernels' order, so the results are theirs bit for bit:
//  - forward: one output, its window's rows then columns (max: the first maximum wins, a NaN
//    always does; average: a sum from 0, then one division);
//  - backward: one input element gathers from the outputs whose windows cover it (no atomics,
//    deterministic). Max: the outputs in increasing (oh, ow) whose argmax is this element, as
//    the CPU's scatter adds them; average: output rows increasing, and within a row the columns
//    decreasing, the order in which the CPU's loop over the window's columns reaches it.
// E (layers/element_codes.h) says how elements are stored and in which type they are computed.
#pragma once

#include <cmath>
#include <cstdint>

#include "layers/element_codes.h"

namespace cortado::kernels {

CORTADO_HOST_DEVICE int64_t MinI64(int64_t a, int64_t b) { return a < b ? a : b; }
CORTADO_HOST_DEVICE int64_t MaxI64(int64_t a, int64_t b) { return a > b ? a : b; }

// The geometry of one pooling call (the layer's, after Reshape). Global pooling is a window of
// the whole plane (kernel H x W, stride 1, no padding).
struct PoolShape {
  int64_t channels = 0, height = 0, width = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool channels_last = false;
  bool count_include_pad = true;

  // The offset of element (n, c, h, w) of an (N, C, rows, cols) tensor in this format.
  CORTADO_HOST_DEVICE int64_t At(int64_t n, int64_t c, int64_t h, int64_t w, int64_t rows,
                                 int64_t cols) const {
    return channels_last ? ((n * rows + h) * cols + w) * channels + c
                         : ((n * channels + c) * rows + h) * cols + w;
  }
  // The inverse of At: (n, c, h, w) of offset i.
  CORTADO_HOST_DEVICE void Coords(int64_t i, int64_t rows, int64_t cols, int64_t* n, int64_t* c,
                                  int64_t* h, int64_t* w) const {
    if (channels_last) {
      *c = i % channels;
      i /= channels;
      *w = i % cols;
      i /= cols;
      *h = i % rows;
      *n = i / rows;
    } else {
      *w = i % cols;
      i /= cols;
      *h = i % rows;
      i /= rows;
      *c = i % channels;
      *n = i / channels;
    }
  }
  // Average pooling's divisor for output (oh, ow) (PoolingLayer::AverageDivisor): the window's
  // elements with the padding it reaches (count_include_pad) or without, 0 when it covers no
  // input element.
  CORTADO_HOST_DEVICE int64_t Divisor(int64_t oh, int64_t ow) const {
    const int64_t hs_pad = oh * stride_h - pad_h;
    const int64_t he_pad = MinI64(hs_pad + kernel_h, height + pad_h);
    const int64_t ws_pad = ow * stride_w - pad_w;
    const int64_t we_pad = MinI64(ws_pad + kernel_w, width + pad_w);
    const int64_t hs = MaxI64(hs_pad, 0), he = MinI64(he_pad, height);
    const int64_t ws = MaxI64(ws_pad, 0), we = MinI64(we_pad, width);
    if (hs >= he || ws >= we) return 0;
    return count_include_pad ? (he_pad - hs_pad) * (we_pad - ws_pad) : (he - hs) * (we - ws);
  }
  // The outputs [*lo, *hi] along one dimension whose windows cover input position `at`.
  static CORTADO_HOST_DEVICE void Covering(int64_t at, int64_t kernel, int64_t stride, int64_t pad,
                                           int64_t out, int64_t* lo, int64_t* hi) {
    const int64_t first = at + pad - kernel + 1;  // o * stride > at + pad - kernel
    *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    *hi = MinI64((at + pad) / stride, out - 1);  // o * stride - pad <= at
  }
};

// y and argmax (i32, y's shape: the plane index h * W + w of the maximum) per output.
template <class E>
struct MaxPoolForward {
  PoolShape s;
  const typename E::Stored* x;
  typename E::Stored* y;
  int32_t* argmax;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    using A = typename E::Acc;
    int64_t n, c, oh, ow;
    s.Coords(i, s.out_h, s.out_w, &n, &c, &oh, &ow);
    const int64_t hs_pad = oh * s.stride_h - s.pad_h, ws_pad = ow * s.stride_w - s.pad_w;
    const int64_t hs = MaxI64(hs_pad, 0), he = MinI64(hs_pad + s.kernel_h, s.height);
    const int64_t ws = MaxI64(ws_pad, 0), we = MinI64(ws_pad + s.kernel_w, s.width);
    A best = -static_cast<A>(INFINITY);
    int32_t arg = static_cast<int32_t>(hs * s.width + ws);
    for (int64_t ih = hs; ih < he; ++ih) {
      for (int64_t iw = ws; iw < we; ++iw) {
        const A v = E::Load(x[s.At(n, c, ih, iw, s.height, s.width)]);
        if (v > best || v != v) {
          best = v;
          arg = static_cast<int32_t>(ih * s.width + iw);
        }
      }
    }
    y[i] = E::Store(best);
    argmax[i] = arg;
  }
};

template <class E>
struct AvgPoolForward {
  PoolShape s;
  const typename E::Stored* x;
  typename E::Stored* y;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    using A = typename E::Acc;
    int64_t n, c, oh, ow;
    s.Coords(i, s.out_h, s.out_w, &n, &c, &oh, &ow);
    const int64_t hs_pad = oh * s.stride_h - s.pad_h, ws_pad = ow * s.stride_w - s.pad_w;
    const int64_t hs = MaxI64(hs_pad, 0), he = MinI64(hs_pad + s.kernel_h, s.height);
    const int64_t ws = MaxI64(ws_pad, 0), we = MinI64(ws_pad + s.kernel_w, s.width);
    A sum = A(0);
    for (int64_t ih = hs; ih < he; ++ih) {
      for (int64_t iw = ws; iw < we; ++iw) sum += E::Load(x[s.At(n, c, ih, iw, s.height, s.width)]);
    }
    const int64_t divisor = s.Divisor(oh, ow);
    y[i] = E::Store(divisor == 0 ? A(0) : sum / static_cast<A>(divisor));
  }
};

// Global average: index i = n * C + c (y is (N, C, 1, 1) in either format) sums its plane's
// positions in order, then divides once.
template <class E>
struct GlobalAvgPoolForward {
  PoolShape s;
  const typename E::Stored* x;
  typename E::Stored* y;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    using A = typename E::Acc;
    const int64_t plane = s.height * s.width;
    const int64_t n = i / s.channels, c = i % s.channels;
    const typename E::Stored* p = s.channels_last ? x + n * plane * s.channels + c : x + i * plane;
    const int64_t step = s.channels_last ? s.channels : 1;
    A sum = A(0);
    for (int64_t k = 0; k < plane; ++k) sum += E::Load(p[k * step]);
    y[i] = E::Store(sum / static_cast<A>(plane));
  }
};

// dx per input element: the gradients of the outputs whose argmax it is.
template <class E>
struct MaxPoolBackward {
  PoolShape s;
  const typename E::Stored* dy;
  const int32_t* argmax;
  typename E::Stored* dx;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    using A = typename E::Acc;
    int64_t n, c, ih, iw;
    s.Coords(i, s.height, s.width, &n, &c, &ih, &iw);
    int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    PoolShape::Covering(ih, s.kernel_h, s.stride_h, s.pad_h, s.out_h, &oh_lo, &oh_hi);
    PoolShape::Covering(iw, s.kernel_w, s.stride_w, s.pad_w, s.out_w, &ow_lo, &ow_hi);
    const int32_t me = static_cast<int32_t>(ih * s.width + iw);
    A sum = A(0);
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t o = s.At(n, c, oh, ow, s.out_h, s.out_w);
        if (argmax[o] == me) sum += E::Load(dy[o]);
      }
    }
    dx[i] = E::Store(sum);
  }
};

// dx per input element: each covering output's gradient divided by its window's divisor.
template <class E>
struct AvgPoolBackward {
  PoolShape s;
  const typename E::Stored* dy;
  typename E::Stored* dx;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    using A = typename E::Acc;
    int64_t n, c, ih, iw;
    s.Coords(i, s.height, s.width, &n, &c, &ih, &iw);
    int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    PoolShape::Covering(ih, s.kernel_h, s.stride_h, s.pad_h, s.out_h, &oh_lo, &oh_hi);
    PoolShape::Covering(iw, s.kernel_w, s.stride_w, s.pad_w, s.out_w, &ow_lo, &ow_hi);
    A sum = A(0);
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int64_t ow = ow_hi; ow >= ow_lo; --ow) {
        const int64_t divisor = s.Divisor(oh, ow);
        const A g = E::Load(dy[s.At(n, c, oh, ow, s.out_h, s.out_w)]);
        sum += divisor == 0 ? A(0) : g / static_cast<A>(divisor);
      }
    }
    dx[i] = E::Store(sum);
  }
};

// Global average: every position of plane (n, c) gets dy[n * C + c] / (H W).
template <class E>
struct GlobalAvgPoolBackward {
  PoolShape s;
  const typename E::Stored* dy;
  typename E::Stored* dx;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    using A = typename E::Acc;
    int64_t n, c, ih, iw;
    s.Coords(i, s.height, s.width, &n, &c, &ih, &iw);
    dx[i] = E::Store(E::Load(dy[n * s.channels + c]) / static_cast<A>(s.height * s.width));
  }
};

}  // namespace cortado::kernels
