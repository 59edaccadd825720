// What the convolution and inner product layers ask of cuDNN and cuBLASLt on a GPU: the
// RunConvolution case of a ConvDims pass and the RunMatmul case of a MatmulDims product. Pure
// functions (no GPU), tested on the host (tests/cuda_host/layer_cases_test.cpp) against the cases
// the cuDNN and cuBLASLt tests check. The math the CPU layers promise: f32 products in f32 (TF32
// is not allowed: the CPU computes full f32 and nothing configures otherwise) and deterministic
// engines (the CPU's results repeat run to run).
#pragma once

#include "engine/base/error.h"
#include "engine/cuda/cublaslt_matmul.h"
#include "engine/cuda/cudnn_conv.h"
#include "layers/conv_kernels.h"
#include "layers/matmul_kernels.h"

namespace cortado::cuda {

inline ConvPass LayerConvPass(ConvPassKind pass) {
  switch (pass) {
    case ConvPassKind::kForward:
      return ConvPass::kForward;
    case ConvPassKind::kBackwardData:
      return ConvPass::kBackwardData;
    case ConvPassKind::kBackwardFilter:
      return ConvPass::kBackwardFilter;
  }
  return ConvPass::kForward;
}

inline ConvCase LayerConvCase(const ConvDims& d, ConvPassKind pass, DType dtype) {
  ConvCase c;
  c.geometry = {.n = d.n,
                .c = d.c,
                .h = d.h,
                .w = d.w,
                .k = d.k,
                .kh = d.kh,
                .kw = d.kw,
                .stride_h = d.stride_h,
                .stride_w = d.stride_w,
                .pad_h = d.pad_h,
                .pad_w = d.pad_w,
                .dilation_h = d.dilation_h,
                .dilation_w = d.dilation_w,
                .groups = d.groups};
  c.format = d.nhwc ? ConvFormat::kNHWC : ConvFormat::kNCHW;
  c.filter_format = d.ohwi ? ConvFormat::kNHWC : ConvFormat::kNCHW;
  c.dtype = dtype;
  c.allow_tf32 = false;
  c.deterministic = true;
  c.pass = LayerConvPass(pass);
  return c;
}

// `dtype` of A and B, `out_dtype` of C (and its bias or bias gradient): f32 for the weight
// gradient of 16-bit activations, as the CPU keeps it.
inline MatmulCase LayerMatmulCase(const MatmulDims& d, DType dtype, DType out_dtype) {
  return {.m = d.m,
          .n = d.n,
          .k = d.k,
          .transpose_a = d.transpose_a,
          .transpose_b = d.transpose_b,
          .dtype = dtype,
          .out_dtype = out_dtype,
          .allow_tf32 = false,
          .epilogue = d.bias_grad ? MatmulEpilogue::kBiasGradient
                      : d.bias    ? MatmulEpilogue::kBias
                                  : MatmulEpilogue::kNone};
}

}  // namespace cortado::cuda
