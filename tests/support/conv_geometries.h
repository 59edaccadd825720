// Test helper: convolution geometries that the cuDNN tests on the host (tests/cuda_host/) and on
// a GPU (tests/cuda/) share, so both check the same cases.
#pragma once

#include <vector>

#include "engine/cuda/cudnn_conv.h"

namespace cortado::testing {

// ResNet-50's first 3x3 of its second stage, 8 images: 64x56x56 -> 128x28x28, stride 2, pad 1.
inline cuda::ConvGeometry StridedResNetConv() {
  return {.n = 8,
          .c = 64,
          .h = 56,
          .w = 56,
          .k = 128,
          .kh = 3,
          .kw = 3,
          .stride_h = 2,
          .stride_w = 2,
          .pad_h = 1,
          .pad_w = 1};
}

// Shapes no trained net has, small enough for a reference on the CPU: grouped, depthwise with
// a stride, and dilated with an asymmetric kernel, stride and padding.
inline std::vector<cuda::ConvGeometry> UnusualConvolutions() {
  return {{.n = 2,
           .c = 16,
           .h = 9,
           .w = 9,
           .k = 32,
           .kh = 3,
           .kw = 3,
           .pad_h = 1,
           .pad_w = 1,
           .groups = 4},
          {.n = 2,
           .c = 16,
           .h = 10,
           .w = 10,
           .k = 16,
           .kh = 3,
           .kw = 3,
           .stride_h = 2,
           .stride_w = 2,
           .pad_h = 1,
           .pad_w = 1,
           .groups = 16},
          {.n = 2,
           .c = 8,
           .h = 17,
           .w = 15,
           .k = 8,
           .kh = 3,
           .kw = 5,
           .stride_h = 2,
           .stride_w = 3,
           .pad_h = 2,
           .pad_w = 0,
           .dilation_h = 2,
           .dilation_w = 3}};
}

}  // namespace cortado::testing
