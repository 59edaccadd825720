// Convolutions through oneDNN's primitives on channels-last (NHWC) activations: forward,
// backward-data and backward-weights of one convolution geometry, f32 and bf16 (and f16, widened),
// for layers/conv.cpp's fast path. The im2col path in layers/conv.cpp stays the reference these
// are tested against (tests/layers/conv_channels_last_test.cpp).
//
// Kernels: oneDNN picks them per geometry and CPU (brgconv / jit for AVX-512, jit for AVX2;
// native bf16 where the CPU has AVX512_BF16). Prepare refuses a geometry for which oneDNN offers
// only its reference kernels ("ref:any", orders of magnitude slower); the layer then falls back
// to the im2col path for that layer and logs why. 16-bit storage without a native bf16 kernel (an
// AVX2 machine, and f16 always: oneDNN 2.6 has no f16 CPU convolution) is widened to f32 a few
// images at a time, run by the f32 primitive and rounded back (to nearest even), so the
// activations stay 16-bit in memory and the arithmetic is f32's: the "widened" path.
//
// Weights: the canonical f32 OIHW tensor (the layer's parameter, what checkpoints hold) is the
// truth; each call reorders it into the format oneDNN chose for that primitive (blocked, ISA-
// dependent: forward and backward-data choose different ones), into a buffer the caller passes
// (a net's convolutions share it). Per-output-channel scales may ride on that reorder: a batch
// norm folded into the convolution at inference. With `keep_weights`, Forward keeps its
// reordered copy in the object instead and reorders only when Forward is told the weights
// changed (inference nets, whose weights change only when loaded). The weight gradient comes
// back in oneDNN's format and is reordered into the f32 OIHW gradient.
//
// Threads: the batch is split into one contiguous range of images per pool thread
// (ParallelTasks), each running the primitive single-threaded (oneDNN's OpenMP is held at one
// thread per calling thread, as for the GEMMs in engine/graph/math.cpp): measured faster than one
// primitive over OpenMP's two threads on a shared 2-core machine (BENCHMARKS.md), and no second
// pool of spinning threads competes with the engine's. Backward-weights sums the per-thread
// partial gradients in thread order, so results are deterministic at a fixed thread count.
// Primitives are created once per (images per call) and cached in the object, on the calling
// thread with OpenMP at one thread too (oneDNN sizes a primitive's parallel work when it creates
// it). Each thread passes its own scratchpad: Debian's oneDNN is built without concurrent
// execution, so its library scratchpad is one buffer shared by every thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor/tensor.h"

namespace cortado {

// One convolution's geometry (per image) as oneDNN needs it; dilation 1 means none.
struct ConvShape {
  int64_t c = 0, h = 0, w = 0;     // input channels and size
  int64_t oc = 0, oh = 0, ow = 0;  // output channels and size
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t groups = 1;
  bool bias = false;
  bool operator==(const ConvShape&) const = default;
};

// What the caller lends the primitives for one call (a net's convolutions share these).
struct ConvScratch {
  Tensor* weights = nullptr;                // the weights in a primitive's format
  std::vector<Tensor>* partials = nullptr;  // per thread: weight and bias gradient partials (f32)
  std::vector<Tensor>* staging = nullptr;   // per thread, widened path: f32 activations
};

class ChannelsLastConv {
 public:
  ChannelsLastConv();
  ~ChannelsLastConv();
  ChannelsLastConv(const ChannelsLastConv&) = delete;
  ChannelsLastConv& operator=(const ChannelsLastConv&) = delete;

  // Whether this build has oneDNN (the only source of these kernels today).
  static bool Built();

  // Sets up `shape` for activations stored as `dtype` (f32, bf16 or f16) and checks that
  // oneDNN has a kernel other than its reference one for every direction needed (`train`:
  // backward too) at `images` per thread. relu: a ReLU post-op on the forward output (inference
  // folding; not with train). keep_weights: see the header. False, with *why, when it cannot
  // run them; the object is then unusable.
  bool Prepare(const ConvShape& shape, DType dtype, int64_t images, bool train, bool relu,
               bool keep_weights, std::string* why);
  // "brgconv:avx512_core" or "jit:avx2, bf16 widened to f32", for logs and `inspect`.
  std::string Describe() const;
  // Whether 16-bit storage is widened to f32 around f32 primitives.
  bool widened() const;

  // y (n, OH, OW, OC) = conv(x (n, H, W, C)) [+ bias] [ReLU]; activations in the prepared
  // dtype. weights: f32 (OC, C / groups, kh, kw); scales: per output channel factors applied
  // to the weights (null: none); bias: f32 (OC) or null. weights_changed: with keep_weights,
  // whether to reorder them again (the first call always does).
  void Forward(int64_t n, const void* x, const float* weights, const float* scales,
               const float* bias, void* y, bool weights_changed, const ConvScratch& scratch);
  // dx (n, H, W, C) = the input gradient of dy (n, OH, OW, OC).
  void BackwardData(int64_t n, const void* dy, const float* weights, void* dx,
                    const ConvScratch& scratch);
  // dweights (f32 OIHW) and dbias (f32 (OC), or null without bias), overwritten, from x and dy.
  void BackwardWeights(int64_t n, const void* x, const void* dy, float* dweights, float* dbias,
                       const ConvScratch& scratch);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cortado
