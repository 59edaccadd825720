#include "tools/device_feed.h"

#include <utility>

#include "engine/tensor/device_runtime.h"

namespace cortado {
namespace {

// `src` (host) in `dtype` and `format`, written into a fresh block of pinned host memory.
Tensor Pinned(const Tensor& src, DType dtype, MemoryFormat format, DeviceRuntime& runtime) {
  Tensor pinned(src.shape(), dtype, runtime.PinnedHostAllocator());
  if (src.ndim() == 4) pinned.set_format(format);
  const bool same_format = src.format() == pinned.format() || src.IsLayoutTrivial();
  if (dtype == src.dtype()) {
    if (same_format) {
      pinned.CopyFrom(src);
    } else {
      pinned.ReorderFrom(src);
    }
  } else {
    pinned.ConvertFrom(same_format ? src : src.Reordered(pinned.format()));
  }
  return pinned;
}

}  // namespace

void CheckBatchFitsNet(Net& net, const Batch& batch) {
  CORTADO_CHECK(batch.images.dtype() == DType::kF32 && batch.labels.dtype() == DType::kI32,
                "data source produced ", batch.images.ToString(), " images and ",
                batch.labels.ToString(), " labels (want f32 and i32)");
  const Tensor& data = net.input("data");
  CORTADO_CHECK(
      batch.images.ndim() == 4 && data.ndim() == 4 && batch.images.dim(1) == data.dim(1) &&
          batch.images.dim(2) == data.dim(2) && batch.images.dim(3) == data.dim(3),
      "data source produced images ", batch.images.ToString(), " but the net expects [N, ",
      data.dim(1), ", ", data.dim(2), ", ", data.dim(3), "]");
}

StagedBatch StageBatch(Net& net, const Batch& batch) {
  CheckBatchFitsNet(net, batch);
  const Device device = net.device();
  CORTADO_CHECK(device.type != DeviceType::kCPU,
                "StageBatch: the net is on the CPU (it reads the batch where it is)");
  DeviceRuntime& runtime = RuntimeFor(device);
  StagedBatch staged;
  staged.images = Pinned(batch.images, net.input("data").dtype(), net.layout(), runtime).To(device);
  // A detector's label input is the batch's ground-truth boxes (f32, declared keep_dtype).
  const Tensor& truth = batch.boxes.defined() && net.input("label").dtype() != DType::kI32
                            ? batch.boxes
                            : batch.labels;
  staged.labels = Pinned(truth, truth.dtype(), MemoryFormat::kNCHW, runtime).To(device);
  return staged;
}

void FeedStaged(Net& net, StagedBatch staged) {
  for (auto [name, t] : {std::pair{"data", &staged.images}, std::pair{"label", &staged.labels}}) {
    Tensor& input = net.input(name);
    t->set_name(input.name());
    input = std::move(*t);
  }
}

}  // namespace cortado
