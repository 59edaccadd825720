// The convolution's data movement on the CPU, apart from its GEMMs: phase planes (a strided
// input split by coordinates mod stride, so that every tap of the kernel is a stride-1 shift),
// im2col into a column matrix and col2im back (accumulating), on one image of a given
// geometry. Kept apart from layers/conv.cpp so that a device version can mirror them one for
// one. Header-only templates (f32, f64 and the 16-bit storage types all move the same way).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace cortado {

// The geometry of one image: input (c, h, w), output (oh, ow), kernel, stride, pad, dilation.
struct ConvGeometry {
  int64_t c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
};

namespace im2col {

// Output positions o in [0, out) whose input coordinate o + offset lies in [0, size): the
// half-open range [*lo, *hi).
inline void ValidRange(int64_t offset, int64_t size, int64_t out, int64_t* lo, int64_t* hi) {
  const int64_t l = std::clamp<int64_t>(-offset, 0, out);
  *lo = l;
  *hi = std::clamp<int64_t>(size - offset, l, out);
}

// Strided convolutions run on phase planes: the input split by the remainders of its
// coordinates modulo the stride, x (C, H, W) -> xq (C, sh, sw, Hq, Wq) with
// xq[c][rh][rw][i][j] = x[c][i sh + rh][j sw + rw] (zero past the edge), Hq = ceil(H / sh).
// Each tap reads a single phase plane at stride 1, so im2col copies contiguous runs of the
// small split input instead of gathering every element of the 9x larger column matrix one by
// one. With stride 1 there is one phase and it is the input itself (no copy).
inline int64_t PhaseRows(const ConvGeometry& g) { return (g.h + g.sh - 1) / g.sh; }
inline int64_t PhaseCols(const ConvGeometry& g) { return (g.w + g.sw - 1) / g.sw; }
inline bool IsStrided(const ConvGeometry& g) { return g.sh > 1 || g.sw > 1; }

// Tap k (dilation dil, padding pad) reads input coordinate o stride + k dil - pad =
// (o + q) stride + r: phase r at offset q (floor division, so 0 <= r < stride).
inline void TapPhase(int64_t k, int64_t dil, int64_t pad, int64_t stride, int64_t* q, int64_t* r) {
  const int64_t e = k * dil - pad;
  *q = e >= 0 ? e / stride : -((-e + stride - 1) / stride);
  *r = e - *q * stride;
}

// dst[j] = src[j stride] for j in [0, n). Stride 2 (the common case) gets a loop the compiler
// can vectorize with its constant stride.
template <typename T>
void GatherStrided(const T* __restrict src, int64_t stride, T* __restrict dst, int64_t n) {
  if (stride == 2) {
    for (int64_t j = 0; j < n; ++j) dst[j] = src[2 * j];
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = src[j * stride];
  }
}

// dst[j stride] = src[j] for j in [0, n) (the inverse of GatherStrided).
template <typename T>
void ScatterStrided(const T* __restrict src, int64_t stride, T* __restrict dst, int64_t n) {
  if (stride == 2) {
    for (int64_t j = 0; j < n; ++j) dst[2 * j] = src[j];
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j * stride] = src[j];
  }
}

// Whether some tap of a kernel of size k reads phase r.
inline bool PhaseUsed(int64_t k, int64_t dil, int64_t pad, int64_t stride, int64_t r) {
  for (int64_t i = 0; i < k; ++i) {
    int64_t q, ri;
    TapPhase(i, dil, pad, stride, &q, &ri);
    if (ri == r) return true;
  }
  return false;
}

// x: (C, H, W) -> xq: (C, sh, sw, Hq, Wq). Phases that no tap reads (3 of 4 for a 1x1 kernel
// at stride 2) are left unwritten.
template <typename T>
void SplitPhases(const T* x, const ConvGeometry& g, T* xq) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g);
  for (int64_t rh = 0; rh < g.sh; ++rh) {
    if (!PhaseUsed(g.kh, g.dh, g.ph, g.sh, rh)) continue;
    for (int64_t rw = 0; rw < g.sw; ++rw) {
      if (!PhaseUsed(g.kw, g.dw, g.pw, g.sw, rw)) continue;
      const int64_t jn = rw < g.w ? (g.w - rw + g.sw - 1) / g.sw : 0;  // columns inside
      for (int64_t c = 0; c < g.c; ++c) {
        T* dst = xq + ((c * g.sh + rh) * g.sw + rw) * hq * wq;
        for (int64_t i = 0; i < hq; ++i) {
          T* d = dst + i * wq;
          const int64_t ih = i * g.sh + rh;
          if (ih >= g.h) {
            std::fill(d, d + wq, T(0));
            continue;
          }
          GatherStrided(x + (c * g.h + ih) * g.w + rw, g.sw, d, jn);
          std::fill(d + jn, d + wq, T(0));
        }
      }
    }
  }
}

// The adjoint of SplitPhases: dxq (C, sh, sw, Hq, Wq) -> dx (C, H, W). Every input position
// lies in exactly one phase, so dx is overwritten, not accumulated; positions in phases that
// no tap reads get zero.
template <typename T>
void MergePhases(const T* dxq, const ConvGeometry& g, T* dx) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g);
  bool all_used = true;
  for (int64_t rh = 0; rh < g.sh; ++rh) all_used &= PhaseUsed(g.kh, g.dh, g.ph, g.sh, rh);
  for (int64_t rw = 0; rw < g.sw; ++rw) all_used &= PhaseUsed(g.kw, g.dw, g.pw, g.sw, rw);
  if (!all_used) std::fill(dx, dx + g.c * g.h * g.w, T(0));
  for (int64_t rh = 0; rh < g.sh; ++rh) {
    if (!PhaseUsed(g.kh, g.dh, g.ph, g.sh, rh)) continue;
    for (int64_t rw = 0; rw < g.sw; ++rw) {
      if (!PhaseUsed(g.kw, g.dw, g.pw, g.sw, rw)) continue;
      const int64_t jn = rw < g.w ? (g.w - rw + g.sw - 1) / g.sw : 0;
      for (int64_t c = 0; c < g.c; ++c) {
        const T* src = dxq + ((c * g.sh + rh) * g.sw + rw) * hq * wq;
        for (int64_t i = 0; i < hq && i * g.sh + rh < g.h; ++i) {
          ScatterStrided(src + i * wq, g.sw, dx + (c * g.h + i * g.sh + rh) * g.w + rw, jn);
        }
      }
    }
  }
}

// Zeroes columns [0, ow_lo) and [ow_hi, ow_n) of rows [oh_lo, oh_hi) of a (rows, ow_n) block.
// Column-major on purpose: the runs are only `pad` long, and a row-wise loop would be turned
// into one memset call per row.
template <typename T>
void ZeroColumns(T* block, int64_t ow_n, int64_t oh_lo, int64_t oh_hi, int64_t ow_lo,
                 int64_t ow_hi) {
  for (int64_t ow = 0; ow < ow_lo; ++ow) {
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) block[oh * ow_n + ow] = T(0);
  }
  for (int64_t ow = ow_hi; ow < ow_n; ++ow) {
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) block[oh * ow_n + ow] = T(0);
  }
}

// xq: phase planes (C, sh, sw, Hq, Wq) (the input itself at stride 1) -> col rows
// (C, kh, kw), each row `ld` apart holding the (oh, ow) positions.
template <typename T>
void Im2Col(const T* xq, const ConvGeometry& g, T* col, int64_t ld) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g), plane = hq * wq;
  // As many output columns as phase columns (e.g. 3x3 pad 1 at stride 1 or 2): each column
  // row is the plane shifted by one offset, so one bulk copy plus zeroing the few padded
  // columns of each output row.
  const bool shift = wq == g.ow;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      int64_t qh, rh, oh_lo, oh_hi;
      TapPhase(ki, g.dh, g.ph, g.sh, &qh, &rh);
      ValidRange(qh, hq, g.oh, &oh_lo, &oh_hi);
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* dst = col + ((c * g.kh + ki) * g.kw + kj) * ld;
        int64_t qw, rw, ow_lo, ow_hi;
        TapPhase(kj, g.dw, g.pw, g.sw, &qw, &rw);
        ValidRange(qw, wq, g.ow, &ow_lo, &ow_hi);
        const T* xc = xq + ((c * g.sh + rh) * g.sw + rw) * plane;
        std::fill(dst, dst + oh_lo * g.ow, T(0));
        std::fill(dst + oh_hi * g.ow, dst + g.oh * g.ow, T(0));
        if (oh_lo >= oh_hi) continue;
        if (shift) {
          // dst[p] = xc[p + delta] for every valid p; the copy is clipped to the plane, and
          // what it leaves or over-copies lies in padded columns, zeroed next.
          const int64_t delta = qh * wq + qw;
          const int64_t s0 = std::max<int64_t>(oh_lo * wq + delta, 0);
          const int64_t s1 = std::min<int64_t>(oh_hi * wq + delta, plane);
          if (s1 > s0) std::memcpy(dst + s0 - delta, xc + s0, sizeof(T) * (s1 - s0));
          ZeroColumns(dst, g.ow, oh_lo, oh_hi, ow_lo, ow_hi);
          continue;
        }
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* d = dst + oh * g.ow;
          const T* s = xc + (oh + qh) * wq + qw;
          std::fill(d, d + ow_lo, T(0));
          std::memcpy(d + ow_lo, s + ow_lo, sizeof(T) * (ow_hi - ow_lo));
          std::fill(d + ow_hi, d + g.ow, T(0));
        }
      }
    }
  }
}

template <typename T>
void AddKernel(const T* __restrict src, T* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// The adjoint of Im2Col: adds every column entry back to the phase-plane position it came
// from. dxq: (C, sh, sw, Hq, Wq), zeroed here first unless `accumulate` (a band of output
// rows adding to what earlier bands wrote). In the shift case the entries of padded
// positions in `col` are overwritten with zeros (the caller's scratch buffer), so that each
// column row is added back in one pass.
template <typename T>
void Col2Im(T* col, int64_t ld, const ConvGeometry& g, T* dxq, bool accumulate = false) {
  const int64_t hq = PhaseRows(g), wq = PhaseCols(g), plane = hq * wq;
  const bool shift = wq == g.ow;
  if (!accumulate) std::fill(dxq, dxq + g.c * g.sh * g.sw * plane, T(0));
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      int64_t qh, rh, oh_lo, oh_hi;
      TapPhase(ki, g.dh, g.ph, g.sh, &qh, &rh);
      ValidRange(qh, hq, g.oh, &oh_lo, &oh_hi);
      if (oh_lo >= oh_hi) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* src = col + ((c * g.kh + ki) * g.kw + kj) * ld;
        int64_t qw, rw, ow_lo, ow_hi;
        TapPhase(kj, g.dw, g.pw, g.sw, &qw, &rw);
        ValidRange(qw, wq, g.ow, &ow_lo, &ow_hi);
        T* xc = dxq + ((c * g.sh + rh) * g.sw + rw) * plane;
        if (shift) {
          ZeroColumns(src, g.ow, oh_lo, oh_hi, ow_lo, ow_hi);
          const int64_t delta = qh * wq + qw;
          const int64_t s0 = std::max<int64_t>(oh_lo * wq + delta, 0);
          const int64_t s1 = std::min<int64_t>(oh_hi * wq + delta, plane);
          if (s1 > s0) AddKernel(src + s0 - delta, xc + s0, s1 - s0);
          continue;
        }
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          AddKernel(src + oh * g.ow + ow_lo, xc + (oh + qh) * wq + qw + ow_lo, ow_hi - ow_lo);
        }
      }
    }
  }
}

// Im2Col of one image x (C, H, W); a strided convolution splits it into xq first.
template <typename T>
void ImageToColumns(const T* x, const ConvGeometry& g, T* xq, T* col, int64_t ld) {
  if (IsStrided(g)) {
    SplitPhases(x, g, xq);
    x = xq;
  }
  Im2Col(x, g, col, ld);
}

// Col2Im into one image's gradient dx (C, H, W), through the phase buffer dxq when strided.
template <typename T>
void ColumnsToImage(T* col, int64_t ld, const ConvGeometry& g, T* dxq, T* dx) {
  if (!IsStrided(g)) return Col2Im(col, ld, g, dx);
  Col2Im(col, ld, g, dxq);
  MergePhases(dxq, g, dx);
}

// Elements of one image's phase planes (none are needed at stride 1).
inline int64_t PhaseSize(const ConvGeometry& g) {
  return IsStrided(g) ? g.c * g.sh * g.sw * PhaseRows(g) * PhaseCols(g) : 0;
}

// Output rows [row_begin, row_end) of a stride-1 convolution as a geometry of their own: the
// same input, fewer output rows, the padding moved by row_begin (it may turn negative). Im2Col
// of the band writes only those rows' columns and Col2Im adds back only what they read, so a
// large image runs in bands with a column buffer a fraction of the whole image's.
inline ConvGeometry RowBand(const ConvGeometry& g, int64_t row_begin, int64_t row_end) {
  ConvGeometry band = g;
  band.oh = row_end - row_begin;
  band.ph = g.ph - row_begin * g.sh;
  return band;
}

}  // namespace im2col
}  // namespace cortado
