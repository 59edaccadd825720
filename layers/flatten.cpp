#include "layers/flatten.h"

#include "layers/layer_util.h"

namespace cortado {

void FlattenLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  axis_ = settings().GetInt("axis", 1);
}

Shape FlattenLayer::TopShape(const Shape& shape) const {
  const int ndim = static_cast<int>(shape.size());
  if (ndim == 0) Fail(Describe(), ": cannot flatten a scalar");
  const int axis = CanonicalAxis(*this, axis_, ndim);
  Shape out(shape.begin(), shape.begin() + axis);
  out.push_back(ShapeCount(shape, axis, ndim));
  return out;
}

void FlattenLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  top[0]->data = bottom[0]->data.View(TopShape(bottom[0]->data.shape()));
}

void FlattenLayer::View(const Blobs& bottom, const Blobs& top) {
  // Re-view in case the bottom was reallocated after Reshape.
  top[0]->data = bottom[0]->data.View(TopShape(bottom[0]->data.shape()));
}

void FlattenLayer::CopyGradient(const Blobs& top, const std::vector<bool>& propagate_down,
                                const Blobs& bottom) {
  if (!propagate_down[0]) return;
  Tensor& dx = bottom[0]->grad;     // bottom: any shape
  const Tensor& dy = top[0]->grad;  // top: the same elements under TopShape
  CORTADO_CHECK(dx.numel() == dy.numel() && dx.dtype() == dy.dtype(), Describe(), ": gradient ",
                dy.ToString(), " does not match input ", dx.ToString());
  dx.CopyFrom(dy);  // nothing where they share memory; on a device, queued there
}

template <typename T>
void FlattenLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  View(bottom, top);
}

template <typename T>
void FlattenLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                             const Blobs& bottom) {
  CopyGradient(top, propagate_down, bottom);
}

template class TypedLayer<FlattenLayer, AllDTypes>;

CORTADO_REGISTER_LAYER(Flatten, FlattenLayer);

}  // namespace cortado
