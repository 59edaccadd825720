// Typed routes for the shared kernel bodies (engine/tensor/kernel_bodies.h): one call per
// operation, dispatched on the tensors' device and dtype. On the CPU the body runs in a host loop
// (ParallelFor); on the test device inside a kernel launch (engine/tensor/test_device.h: the
// blocks of the tensors it is given open, the rest guarded); on a GPU as a CUDA kernel
// (engine/cuda/device_kernels.cu), queued on the compute stream. Every tensor of a call must be
// on one device and of one floating dtype (f32 or f64); the error names the operation and the
// tensor otherwise.
#pragma once

#include "engine/tensor/kernel_bodies.h"
#include "engine/tensor/tensor.h"

namespace cortado {

// y = x > 0 ? x : slope * x.
void DeviceReluForward(const Tensor& x, Tensor& y, double slope);
// dx = mask > 0 ? dy : slope * dy (mask: x, or y where the slope is not negative).
void DeviceReluBackward(const Tensor& mask, const Tensor& dy, Tensor& dx, double slope);
// y += alpha * x.
void DeviceAxpy(const Tensor& x, Tensor& y, double alpha);
// y = alpha * x.
void DeviceScale(const Tensor& x, Tensor& y, double alpha);

struct SgdStepArgs {
  double lr = 0, weight_decay = 0, momentum = 0, grad_scale = 1;
  bool nesterov = false;
};
// The fused SGD step over w, its gradient g and momentum v (SgdSolver::Step's arithmetic).
void DeviceSgdStep(Tensor& w, const Tensor& g, Tensor& v, const SgdStepArgs& args);
// Sets flag (i32[1] on x's device) to 1 when an element of x is inf or NaN; leaves it otherwise,
// so one flag, zeroed once, covers every gradient of a step.
void DeviceMarkNonFinite(const Tensor& x, Tensor& flag);

}  // namespace cortado
