// The test device (DeviceType::kTest, "test" or "test:N"): host memory behind a DeviceRuntime of
// its own, so that the engine's device code paths run and are checked on a machine without a
// GPU. It is small on purpose, and does what a GPU does where the engine could get it wrong:
//
//  - Memory comes from a CachingAllocator over page-aligned mappings that are GUARDED: every
//    block is mprotect(PROT_NONE) except while a device kernel that was given it runs. Host code
//    that reads or writes test-device memory outside a kernel (a missed copy, a CPU kernel fed a
//    device tensor) faults at once, as a device pointer dereferenced on the host would.
//  - Each device has a stream: an ordered queue run by a thread of its own. Kernels, fills,
//    conversions, reorders and copies are queued there and return at once; Synchronize waits,
//    and a copy into host memory waits for its own completion (DeviceRuntime's contract), but for
//    CopyToHostAsync, whose event (a ticket on the stream) is reached once it has run. A copy
//    from the pinned allocator's memory runs after the call returns (its block is held from reuse
//    until the stream has passed it, through the pinned cache's events); from other host memory
//    the call waits.
//  - A kernel is Launch(device, tensors, body): when its turn comes, the blocks holding `tensors`
//    are opened (readable and writable), `body` runs on the host (the shared CORTADO_HOST_DEVICE
//    bodies that a CUDA build runs as kernels), and the blocks are closed again. A body may use
//    ParallelFor; it must touch only the tensors it was given.
//
// A kernel's error is kept and thrown by the next Synchronize or copy into host memory of that
// device (the way a CUDA error surfaces at the next synchronizing call); later queued work of the
// device is skipped until then. What the test device does not prove: device-side numerics of
// CUDA kernels (the bodies run as host code), launch geometry, and real concurrency between the
// copy and compute engines.
#pragma once

#include <functional>
#include <vector>

#include "engine/tensor/device_runtime.h"

namespace cortado {

// How many test devices there are (test:0 .. test:kTestDeviceCount-1).
inline constexpr int kTestDeviceCount = 4;

// The test device's runtime (what FindDeviceRuntime(DeviceType::kTest) returns).
DeviceRuntime& TestDeviceRuntime();

// Queues `body` on `device`'s stream (a test device); when it runs, the blocks holding the
// test-device tensors among `tensors` are open to host code (others are ignored). The tensors
// are held (their storage stays alive) until the body has run.
void LaunchOnTestDevice(Device device, std::vector<Tensor> tensors, std::function<void()> body);

// Host views of test-device tensors, for a CPU kernel run inside a test-device kernel (the
// fallback of layers without shared bodies yet): each is a CPU tensor at the same address, shape,
// format and name, valid only while that kernel runs (its blocks open). Tensors on one block get
// views of one alias block, so SharesStorageWith holds among the views as among the originals.
// Undefined, empty and CPU tensors come back as they are.
std::vector<Tensor> TestDeviceHostAliases(const std::vector<Tensor>& tensors);

// How many times TestDeviceHostAliases has been called in this process: tests tell a layer's own
// device path (no host views) from the CPU-kernel fallback with it.
int64_t TestDeviceHostAliasCalls();

// Whether `ptr` lies in a test-device block that is closed to host code now (for tests).
bool TestDeviceMemoryGuarded(const void* ptr);

}  // namespace cortado
