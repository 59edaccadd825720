#include "engine/tensor/device_kernels.h"

#include <vector>

#include "engine/base/thread_pool.h"
#include "engine/tensor/test_device.h"

namespace cortado {

#ifdef CORTADO_HAVE_CUDA
namespace cuda {
// Defined in engine/cuda/device_kernels.cu (called by name: tensor/ includes no CUDA header).
void LaunchElementOp(int device, DType dtype, kernels::ElementOp op,
                     const kernels::ElementArgs& args, int64_t n);
}  // namespace cuda
#endif

namespace {

using kernels::ElementArgs;
using kernels::ElementOp;

// The op is a template argument here, so the body's switch folds away and the loop vectorizes
// as the CPU's own loops did.
template <typename T, ElementOp kOp>
void HostLoop(const ElementArgs& args, int64_t n) {
  if constexpr (kOp == ElementOp::kMarkNonFinite) {
    // One thread: the flag is one word that every finding writes.
    for (int64_t i = 0; i < n; ++i) kernels::ElementAt<T>(kOp, args, i);
  } else {
    ParallelFor(n, 32768, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) kernels::ElementAt<T>(kOp, args, i);
    });
  }
}

template <typename T>
void HostLoopOf(ElementOp op, const ElementArgs& args, int64_t n) {
  switch (op) {
    case ElementOp::kReluForward:
      return HostLoop<T, ElementOp::kReluForward>(args, n);
    case ElementOp::kReluBackward:
      return HostLoop<T, ElementOp::kReluBackward>(args, n);
    case ElementOp::kAxpy:
      return HostLoop<T, ElementOp::kAxpy>(args, n);
    case ElementOp::kScale:
      return HostLoop<T, ElementOp::kScale>(args, n);
    case ElementOp::kSgdStep:
      return HostLoop<T, ElementOp::kSgdStep>(args, n);
    case ElementOp::kMarkNonFinite:
      return HostLoop<T, ElementOp::kMarkNonFinite>(args, n);
  }
}

void RunOnHost(DType dtype, ElementOp op, const ElementArgs& args, int64_t n) {
  if (dtype == DType::kF32) return HostLoopOf<float>(op, args, n);
  HostLoopOf<double>(op, args, n);
}

// `operands`: the floating tensors, each of n elements; `flag`: an i32 tensor or null.
void Route(const char* what, ElementOp op, const ElementArgs& args,
           const std::vector<const Tensor*>& operands, const Tensor* flag) {
  const Tensor& first = *operands[0];
  const Device device = first.device();
  const DType dtype = first.dtype();
  const int64_t n = first.numel();
  CORTADO_CHECK(dtype == DType::kF32 || dtype == DType::kF64, what, ": ", first.ToString(), " on ",
                device.ToString(), " (the device kernels take f32 or f64)");
  for (const Tensor* t : operands) {
    CORTADO_CHECK(t->device() == device && t->dtype() == dtype && t->numel() == n, what, ": ",
                  t->name().empty() ? "" : StrCat("'", t->name(), "' "), t->ToString(), " on ",
                  t->device().ToString(), " with ", first.ToString(), " on ", device.ToString(),
                  " (one device, dtype and size)");
  }
  if (flag != nullptr) {
    CORTADO_CHECK(flag->device() == device && flag->dtype() == DType::kI32 && flag->numel() == 1,
                  what, ": the flag is ", flag->ToString(), " on ", flag->device().ToString(),
                  ", not i32[1] on ", device.ToString());
  }
  if (n == 0) return;
  switch (device.type) {
    case DeviceType::kCPU:
      return RunOnHost(dtype, op, args, n);
    case DeviceType::kTest: {
      std::vector<Tensor> given;
      for (const Tensor* t : operands) given.push_back(*t);
      if (flag != nullptr) given.push_back(*flag);
      return LaunchOnTestDevice(device, std::move(given),
                                [dtype, op, args, n] { RunOnHost(dtype, op, args, n); });
    }
    case DeviceType::kCUDA:
#ifdef CORTADO_HAVE_CUDA
      return cuda::LaunchElementOp(device.index, dtype, op, args, n);
#else
      Fail(what, " on ", device.ToString(), ": this build has no CUDA backend");
#endif
  }
  Fail(what, ": no route for ", device.ToString());
}

}  // namespace

void DeviceReluForward(const Tensor& x, Tensor& y, double slope) {
  ElementArgs a;
  a.a = x.raw_data();
  a.b = y.raw_data();
  a.s0 = slope;
  Route("ReLU forward", ElementOp::kReluForward, a, {&x, &y}, nullptr);
}

void DeviceReluBackward(const Tensor& mask, const Tensor& dy, Tensor& dx, double slope) {
  ElementArgs a;
  a.a = mask.raw_data();
  a.b = dy.raw_data();
  a.c = dx.raw_data();
  a.s0 = slope;
  Route("ReLU backward", ElementOp::kReluBackward, a, {&mask, &dy, &dx}, nullptr);
}

void DeviceAxpy(const Tensor& x, Tensor& y, double alpha) {
  ElementArgs a;
  a.a = x.raw_data();
  a.b = y.raw_data();
  a.s0 = alpha;
  Route("axpy", ElementOp::kAxpy, a, {&x, &y}, nullptr);
}

void DeviceScale(const Tensor& x, Tensor& y, double alpha) {
  ElementArgs a;
  a.a = x.raw_data();
  a.b = y.raw_data();
  a.s0 = alpha;
  Route("scale", ElementOp::kScale, a, {&x, &y}, nullptr);
}

void DeviceSgdStep(Tensor& w, const Tensor& g, Tensor& v, const SgdStepArgs& args) {
  ElementArgs a;
  a.a = w.raw_data();
  a.b = g.raw_data();
  a.c = v.raw_data();
  a.s0 = args.lr;
  a.s1 = args.weight_decay;
  a.s2 = args.momentum;
  a.s3 = args.grad_scale;
  a.flag = args.nesterov;
  Route("SGD step", ElementOp::kSgdStep, a, {&w, &g, &v}, nullptr);
}

void DeviceMarkNonFinite(const Tensor& x, Tensor& flag) {
  ElementArgs a;
  a.a = x.raw_data();
  a.flag32 = static_cast<int32_t*>(flag.raw_data());
  Route("finite check", ElementOp::kMarkNonFinite, a, {&x}, &flag);
}

}  // namespace cortado
