// The layers' own tensors on a device: state their device path keeps there (a loss layer's
// probabilities, a dropout mask, batch norm's per-channel sums, a convolution's 16-bit filter) and
// the f32 staging of bf16/f16 blobs that their f32 bodies read and write, widened and rounded on
// the device as the CPU's Layer::ForwardInF32 does on the host (Tensor::ConvertFrom: one rounding
// code for both), so the results are the CPU's bit for bit.
#pragma once

#include <string>

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

// `t` as a tensor of `shape` and `dtype` on `device`, reallocated only when its device or dtype
// differs (otherwise resized in place): a layer's per-channel state on the device.
inline void EnsureOnDevice(Tensor& t, Device device, const Shape& shape, DType dtype) {
  if (!t.defined() || t.device() != device || t.dtype() != dtype) {
    t = Tensor(shape, dtype, AllocatorFor(device));
  } else {
    t.Resize(shape);
  }
}

// A tensor shaped, formatted and placed like `like`, in `dtype`, kept in `slot` (made again when
// one of those differs): a layer's private device buffer.
inline Tensor& DeviceLike(Tensor& slot, const Tensor& like, DType dtype, const std::string& name) {
  if (!slot.defined() || !slot.SameShape(like) || slot.dtype() != dtype ||
      slot.device() != like.device() || slot.format() != like.format()) {
    slot = Tensor(like.shape(), dtype, AllocatorFor(like.device()));
    slot.set_format(like.format());
    slot.set_name(name);
  }
  return slot;
}

}  // namespace cortado
