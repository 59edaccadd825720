#include "layers/reorder.h"

#include "layers/layer_util.h"

namespace cortado {

void ReorderLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const std::string format = settings().GetString("format");
  if (format == "nchw") {
    format_ = MemoryFormat::kNCHW;
  } else if (format == "nhwc") {
    format_ = MemoryFormat::kNHWC;
  } else {
    Fail(Describe(), ": key 'format' expects nchw or nhwc, got '", format, "'");
  }
}

void ReorderLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  top[0]->data.Resize(x.shape(), x.dtype());
  top[0]->data.set_format(x.ndim() == 4 ? format_ : MemoryFormat::kNCHW);
}

template <typename T>
void ReorderLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  top[0]->data.ReorderFrom(bottom[0]->data);
}

template <typename T>
void ReorderLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                             const Blobs& bottom) {
  if (propagate_down[0]) bottom[0]->grad.ReorderFrom(top[0]->grad);
}

template class TypedLayer<ReorderLayer, AllDTypes>;

CORTADO_REGISTER_LAYER(Reorder, ReorderLayer);

}  // namespace cortado
