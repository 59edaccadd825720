// One launch of a shared kernel body over an index range [0, n), on whichever device its tensors
// are: the CPU (a host loop, ParallelFor), the test device (one test-device kernel with the given
// tensors' blocks open, engine/tensor/test_device.h) or a GPU (a grid-stride CUDA kernel queued
// on the compute stream, engine/cuda/indexed_launch.cuh).
//
// A body is a small copyable struct of device pointers and scalars whose
// `CORTADO_HOST_DEVICE void operator()(int64_t i) const` computes index i and writes only what
// index i owns (no two indices write one element), so any split of the range computes the same
// bits. It must touch only the tensors it is launched with (the test device faults otherwise).
// The layers' bodies live beside them (layers/*_kernels.h); each body type a layer launches is
// instantiated for CUDA in a .cu file (layers/cuda/) with CORTADO_CUDA_INDEXED, which a CUDA
// build's link enforces.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/error.h"
#include "engine/base/thread_pool.h"
#include "engine/tensor/launch_geometry.h"
#include "engine/tensor/tensor.h"
#include "engine/tensor/test_device.h"

namespace cortado {

#ifdef CORTADO_HAVE_CUDA
namespace cuda {
// Defined in engine/cuda/indexed_launch.cuh; instantiated per body type in a .cu file.
template <class Body>
void LaunchIndexed(int device, int64_t n, const Body& body);
}  // namespace cuda
#endif

// The device every defined, non-empty tensor of `tensors` is on (the first one's); fails naming
// `what` and the tensor that is elsewhere. CPU when there is none.
Device DeviceOfLaunch(const char* what, const std::vector<Tensor>& tensors);

// Runs body(i) for i in [0, n) where `device` is the CPU or a test device (a host loop split in
// chunks of at least `grain` indices; on the test device inside one kernel given `tensors`) and
// returns true; returns false, doing nothing, for a GPU. RunIndexed's host half; bodies that have
// no CUDA instantiation (tests' own) call it directly.
template <class Body>
bool RunIndexedOnHost(Device device, std::vector<Tensor> tensors, int64_t n, const Body& body,
                      int64_t grain = 4096) {
  auto host_loop = [body, n, grain] {
    ParallelFor(n, grain, [&body](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) body(i);
    });
  };
  switch (device.type) {
    case DeviceType::kCPU:
      if (n > 0) host_loop();
      return true;
    case DeviceType::kTest:
      if (n > 0) LaunchOnTestDevice(device, std::move(tensors), host_loop);
      return true;
    case DeviceType::kCUDA:
      return false;
  }
  return false;
}

// Runs body(i) for i in [0, n) on the device of `tensors` (every tensor the body reads or
// writes). Host loops split the range in chunks of at least `grain` indices. Asynchronous on a
// device, as a kernel launch is; on the CPU it returns when done. Body must have external linkage
// (not in an anonymous namespace): a CUDA build instantiates it in a .cu file.
template <class Body>
void RunIndexed(const char* what, std::vector<Tensor> tensors, int64_t n, const Body& body,
                int64_t grain = 4096) {
  const Device device = DeviceOfLaunch(what, tensors);
  if (RunIndexedOnHost(device, std::move(tensors), n, body, grain)) return;
  if (device.type != DeviceType::kCUDA) Fail(what, ": no route for ", device.ToString());
#ifdef CORTADO_HAVE_CUDA
  if (n > 0) cuda::LaunchIndexed(device.index, n, body);
#else
  Fail(what, " on ", device.ToString(), ": this build has no CUDA backend");
#endif
}

}  // namespace cortado
