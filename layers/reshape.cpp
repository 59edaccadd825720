#include "layers/reshape.h"

#include "layers/layer_util.h"

namespace cortado {

void ReshapeLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  if (!settings().Has("shape")) Fail(Describe(), ": key 'shape' is required");
  shape_ = settings().GetInts("shape", {});
  int inferred = 0;
  for (int64_t d : shape_) {
    if (d < -1) Fail(Describe(), ": key 'shape' has ", d, "; sizes are >= 0, or -1 (inferred)");
    inferred += d == -1 ? 1 : 0;
  }
  if (inferred > 1) Fail(Describe(), ": key 'shape' may infer one dimension (-1), not ", inferred);
}

Shape ReshapeLayer::TopShape(const Shape& in) const {
  Shape out(shape_.size());
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] == 0) {
      if (i >= in.size()) {
        Fail(Describe(), ": 'shape' copies dimension ", i, " (0) of the ", in.size(), "-d input ",
             ShapeString(in));
      }
      out[i] = in[i];
    } else if (shape_[i] == -1) {
      infer_at = static_cast<int>(i);
      continue;
    } else {
      out[i] = shape_[i];
    }
    known *= out[i];
  }
  const int64_t total = ShapeNumel(in);
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) {
      Fail(Describe(), ": cannot reshape ", ShapeString(in), " (", total, " elements) to ",
           ShapeString(shape_));
    }
    out[infer_at] = total / known;
  } else if (known != total) {
    Fail(Describe(), ": cannot reshape ", ShapeString(in), " (", total, " elements) to ",
         ShapeString(out), " (", known, " elements)");
  }
  return out;
}

void ReshapeLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  top[0]->data = bottom[0]->data.View(TopShape(bottom[0]->data.shape()));
}

void ReshapeLayer::View(const Blobs& bottom, const Blobs& top) {
  // Re-view in case the bottom was reallocated after Reshape.
  top[0]->data = bottom[0]->data.View(TopShape(bottom[0]->data.shape()));
}

void ReshapeLayer::CopyGradient(const Blobs& top, const std::vector<bool>& propagate_down,
                                const Blobs& bottom) {
  if (!propagate_down[0]) return;
  Tensor& dx = bottom[0]->grad;     // bottom: any shape
  const Tensor& dy = top[0]->grad;  // top: the same elements under TopShape
  CORTADO_CHECK(dx.numel() == dy.numel() && dx.dtype() == dy.dtype(), Describe(), ": gradient ",
                dy.ToString(), " does not match input ", dx.ToString());
  dx.CopyFrom(dy);  // nothing where they share memory; on a device, queued there
}

template <typename T>
void ReshapeLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  View(bottom, top);
}

template <typename T>
void ReshapeLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                             const Blobs& bottom) {
  CopyGradient(top, propagate_down, bottom);
}

template class TypedLayer<ReshapeLayer, AllDTypes>;

CORTADO_REGISTER_LAYER(Reshape, ReshapeLayer);

}  // namespace cortado
