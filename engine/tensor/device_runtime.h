// DeviceRuntime: what the engine needs from an accelerator, behind one interface so that no
// CPU source includes a CUDA header. The CUDA backend (engine/cuda/) implements it; a build
// without CUDA has none, and asking for a CUDA device there says so.
//
// A runtime owns, per device: a caching allocator for device memory
// (engine/tensor/caching_allocator.h, every tensor on that device draws from it), a compute stream
// on which every operation below is queued in order, and a pinned host allocator for the loader's
// batches. Operations return when queued (the stream keeps their order); Synchronize waits for
// them, and a copy into host memory waits for its own completion. A copy from pinned host memory
// tells the pinned cache its stream, so the block is not handed out again (and written) before the
// copy has run; a copy between two GPUs keeps both devices' streams in order around it.
#pragma once

#include <memory>
#include <string>

#include "engine/tensor/caching_allocator.h"
#include "engine/tensor/tensor.h"

namespace cortado {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType type() const = 0;

  // Devices present and usable; 0 with `why` set ("no CUDA device: <the driver's words>") when
  // there are none.
  virtual int DeviceCount(std::string* why) const = 0;
  // One line for logs: "cuda:0 NVIDIA H200, 139.8 GiB, compute capability 9.0".
  virtual std::string Describe(int index) const = 0;

  virtual const std::shared_ptr<Allocator>& DeviceAllocator(int index) = 0;
  virtual const std::shared_ptr<Allocator>& PinnedHostAllocator() = 0;
  virtual MemoryStats Memory(int index) const = 0;
  virtual void ResetPeakMemory(int index) = 0;

  // dst and src: same element count and dtype; either may be on the host.
  virtual void Copy(Tensor& dst, const Tensor& src) = 0;
  // Every element of `t` (on this runtime's device) set to value, rounded as Tensor::Fill does.
  virtual void Fill(Tensor& t, double value) = 0;
  // dst = src converted between floating dtypes on the device, rounded as Tensor::ConvertFrom.
  virtual void Convert(Tensor& dst, const Tensor& src) = 0;
  // dst = src moved between memory formats (Tensor::ReorderFrom: same shape and dtype, 4-d, the
  // formats differ). The default refuses, naming the device: a backend that runs channels-last
  // nets implements it.
  virtual void Reorder(Tensor& dst, const Tensor& src);
  // dst (host memory, best from PinnedHostAllocator) = src (on this runtime's device), queued on
  // the device's stream behind its work so far, without waiting: the host reads dst only once
  // the returned event is reached (data-parallel training copies each gradient bucket out this
  // way while backward runs on). The default copies at once (Copy) and returns an event that is
  // reached already.
  virtual std::unique_ptr<StreamEvent> CopyToHostAsync(Tensor& dst, const Tensor& src);
  virtual void Synchronize(int index) = 0;
};

// The runtime for a device type, or null when this build has none (CPU has none: the CPU is
// the engine itself). The test device's (engine/tensor/test_device.h) is in every build.
DeviceRuntime* FindDeviceRuntime(DeviceType type);

// The runtime for `device`, checked to exist in this build and to have that device; the error
// names the device and why it cannot be used.
DeviceRuntime& RuntimeFor(Device device);

// Where tensors on `device` are allocated: CpuAllocator() for the CPU, else the device's caching
// allocator (RuntimeFor(device).DeviceAllocator).
const std::shared_ptr<Allocator>& AllocatorFor(Device device);

// dst (on any device) = src (any device, any float dtype, same element count and format),
// converted on the host where the dtypes differ: how saved state comes back onto a device.
void AssignConverted(Tensor& dst, const Tensor& src);

// "cpu", "cuda" (cuda:0), "cuda:N", "test" (test:0) or "test:N"; the error names the text and
// the accepted forms.
Device ParseDevice(const std::string& text);

// True when `device` can be used here; otherwise false with `why` set (for tests that skip).
bool DeviceUsable(Device device, std::string* why);

}  // namespace cortado
