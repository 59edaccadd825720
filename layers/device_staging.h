// The layers' own tensors on a device: state their device path keeps there (a loss layer's
// probabilities, a dropout mask) and the f32 staging of bf16/f16 blobs that their f32 bodies read
// and write, widened and rounded on the device as the CPU's Layer::ForwardInF32 does on the host
// (Tensor::ConvertFrom: one rounding code for both), so the results are the CPU's bit for bit.
#pragma once

#include "engine/tensor/device_runtime.h"
#include "engine/tensor/tensor.h"

namespace cortado {

// Gives `t` storage on `device` (a new tensor of its shape and dtype) where it is elsewhere: the
// device path keeps its state there, the CPU kernel (the test device's fallback included) in host
// memory.
inline void KeepOn(Tensor& t, Device device) {
  if (t.device() != device) t = Tensor(t.shape(), t.dtype(), AllocatorFor(device));
}

// `staging` as an f32 tensor of `like`'s shape and format on its device (contents undefined).
inline Tensor& StagedF32(const Tensor& like, Tensor& staging) {
  KeepOn(staging, like.device());
  staging.Resize(like.shape(), DType::kF32);
  if (like.ndim() == 4) staging.set_format(like.format());
  return staging;
}

// `staging` holding `src` (bf16/f16) widened to f32, on src's device.
inline Tensor& WidenedF32(const Tensor& src, Tensor& staging) {
  StagedF32(src, staging).ConvertFrom(src);
  return staging;
}

}  // namespace cortado
