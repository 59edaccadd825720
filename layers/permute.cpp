#include "layers/permute.h"

#include <cstring>

#include "engine/base/thread_pool.h"
#include "layers/layer_util.h"

namespace cortado {

void PermuteLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  if (!settings().Has("order")) Fail(Describe(), ": key 'order' is required");
  order_ = settings().GetInts("order", {});
}

void PermuteLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Shape& in = bottom[0]->data.shape();
  const size_t ndim = in.size();
  std::vector<bool> seen(ndim, false);
  bool ok = order_.size() == ndim;
  for (size_t i = 0; ok && i < ndim; ++i) {
    ok = order_[i] >= 0 && order_[i] < static_cast<int64_t>(ndim) && !seen[order_[i]];
    if (ok) seen[order_[i]] = true;
  }
  if (!ok) {
    Fail(Describe(), ": key 'order' must be a permutation of 0 to ", ndim - 1, " for the ", ndim,
         "-d input '", bottom[0]->name, "' ", ShapeString(in), ", got ", ShapeString(order_));
  }
  std::vector<int64_t> strides(ndim, 1);
  for (size_t d = ndim; d-- > 1;) strides[d - 1] = strides[d] * in[d];
  out_shape_.assign(ndim, 0);
  in_strides_.assign(ndim, 0);
  for (size_t i = 0; i < ndim; ++i) {
    out_shape_[i] = in[order_[i]];
    in_strides_[i] = strides[order_[i]];
  }
  top[0]->data.Resize(out_shape_, bottom[0]->data.dtype());
}

namespace {

// For every output element o (row-major over out_shape), copies between output o and input
// element sum_i index_i * in_strides[i]; to_output picks the direction. E is an unsigned type of
// the element's size.
template <typename E>
void PermuteCopy(const Shape& out_shape, const std::vector<int64_t>& in_strides, E* in, E* out,
                 bool to_output) {
  const int64_t total = ShapeNumel(out_shape);
  const int ndim = static_cast<int>(out_shape.size());
  if (total == 0) return;
  ParallelFor(total, 4096, [&](int64_t o0, int64_t o1) {
    // The multi-index of o0, and the input offset it maps to.
    std::vector<int64_t> index(ndim, 0);
    int64_t rest = o0, offset = 0;
    for (int d = ndim; d-- > 0;) {
      index[d] = rest % out_shape[d];
      rest /= out_shape[d];
      offset += index[d] * in_strides[d];
    }
    const int last = ndim - 1;
    const int64_t inner = ndim > 0 ? out_shape[last] : 1;
    const int64_t step = ndim > 0 ? in_strides[last] : 0;
    for (int64_t o = o0; o < o1;) {
      // A run along the last output dimension: constant input stride.
      const int64_t run = std::min(inner - (ndim > 0 ? index[last] : 0), o1 - o);
      if (to_output) {
        for (int64_t j = 0; j < run; ++j) out[o + j] = in[offset + j * step];
      } else {
        for (int64_t j = 0; j < run; ++j) in[offset + j * step] = out[o + j];
      }
      o += run;
      if (o >= o1) break;
      // Advance the multi-index by `run` (to the start of the next run).
      if (ndim > 0) {
        offset += run * step;
        index[last] += run;
        for (int d = last; d > 0 && index[d] == out_shape[d]; --d) {
          offset -= index[d] * in_strides[d];
          index[d] = 0;
          ++index[d - 1];
          offset += in_strides[d - 1];
        }
      }
    }
  });
}

void Dispatch(size_t elem, const Shape& out_shape, const std::vector<int64_t>& in_strides, void* in,
              void* out, bool to_output) {
  switch (elem) {
    case 1:
      return PermuteCopy(out_shape, in_strides, static_cast<uint8_t*>(in),
                         static_cast<uint8_t*>(out), to_output);
    case 2:
      return PermuteCopy(out_shape, in_strides, static_cast<uint16_t*>(in),
                         static_cast<uint16_t*>(out), to_output);
    case 4:
      return PermuteCopy(out_shape, in_strides, static_cast<uint32_t*>(in),
                         static_cast<uint32_t*>(out), to_output);
    case 8:
      return PermuteCopy(out_shape, in_strides, static_cast<uint64_t*>(in),
                         static_cast<uint64_t*>(out), to_output);
    default:
      Fail("Permute: unsupported element size ", elem);
  }
}

}  // namespace

template <typename T>
void PermuteLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  const Tensor& x = bottom[0]->data;
  Dispatch(DTypeSize(x.dtype()), out_shape_, in_strides_, x.raw_data(), top[0]->data.raw_data(),
           /*to_output=*/true);
}

template <typename T>
void PermuteLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                             const Blobs& bottom) {
  if (!propagate_down[0]) return;
  Tensor& dx = bottom[0]->grad;
  Dispatch(DTypeSize(dx.dtype()), out_shape_, in_strides_, dx.raw_data(), top[0]->grad.raw_data(),
           /*to_output=*/false);
}

template class TypedLayer<PermuteLayer, AllDTypes>;

CORTADO_REGISTER_LAYER(Permute, PermuteLayer);

}  // namespace cortado
