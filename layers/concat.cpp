#include "layers/concat.h"

#include <cstring>

#include "engine/base/thread_pool.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/copy_kernels.h"
#include "layers/layer_util.h"

namespace cortado {

void ConcatLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  axis_setting_ = settings().GetInt("axis", 1);
}

void ConcatLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  CheckSameDType(*this, bottom);
  const Shape& s0 = bottom[0]->data.shape();
  const int ndim = static_cast<int>(s0.size());
  axis_ = CanonicalAxis(*this, axis_setting_, ndim);
  Shape out = s0;
  out[axis_] = 0;
  for (size_t i = 0; i < bottom.size(); ++i) {
    const Shape& s = bottom[i]->data.shape();
    bool ok = static_cast<int>(s.size()) == ndim;
    for (int d = 0; ok && d < ndim; ++d) ok = d == axis_ || s[d] == s0[d];
    if (!ok) {
      Fail(Describe(), ": input ", i, " ('", bottom[i]->name, "') has shape ", ShapeString(s),
           ", which does not match input 0's ", ShapeString(s0), " outside axis ", axis_);
    }
    out[axis_] += s[axis_];
    if (bottom[i]->data.format() != bottom[0]->data.format() &&
        !bottom[i]->data.IsLayoutTrivial()) {
      Fail(Describe(), ": input ", i, " ('", bottom[i]->name, "') is ", bottom[i]->data.ToString(),
           " but input 0 ('", bottom[0]->name, "') is ", bottom[0]->data.ToString(),
           "; all inputs must have the same memory format");
    }
  }
  // The slices are cut along the axis as it lies in memory: channels-last tensors are
  // (N, H, W, C) there, so joining channels copies C_i values per pixel.
  Shape physical = s0;
  int axis = axis_;
  if (bottom[0]->data.channels_last()) {
    physical = {s0[0], s0[2], s0[3], s0[1]};
    constexpr int kPhysical[4] = {0, 3, 1, 2};  // logical axis -> its place in memory
    axis = kPhysical[axis_];
  }
  outer_ = ShapeCount(physical, 0, axis);
  inner_ = ShapeCount(physical, axis + 1, ndim);
  top[0]->data.Resize(out, bottom[0]->data.dtype());
  top[0]->data.set_format(bottom[0]->data.format());
}

// Copies between the top (outer, top_axis, inner) and each bottom (outer, axis_i, inner) as
// rows of bytes; to_top picks the direction.
static void CopySlices(const std::vector<Blob*>& bottom, Blob* top, int axis, int64_t outer,
                       int64_t inner, bool to_top, const std::vector<bool>* which) {
  const size_t elem = DTypeSize(top->data.dtype());
  const int64_t top_axis = top->data.dim(axis);
  char* top_base = static_cast<char*>(to_top ? top->data.raw_data() : top->grad.raw_data());
  ParallelFor(outer, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      int64_t offset = 0;  // along the axis
      for (size_t i = 0; i < bottom.size(); ++i) {
        const int64_t len = bottom[i]->data.dim(axis);
        const size_t bytes = static_cast<size_t>(len * inner) * elem;
        char* t = top_base + static_cast<size_t>((o * top_axis + offset) * inner) * elem;
        if (to_top) {
          const char* b = static_cast<const char*>(bottom[i]->data.raw_data());
          std::memcpy(t, b + o * bytes, bytes);
        } else if ((*which)[i]) {
          char* b = static_cast<char*>(bottom[i]->grad.raw_data());
          std::memcpy(b + o * bytes, t, bytes);
        }
        offset += len;
      }
    }
  });
}

template <typename T>
void ConcatLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  CopySlices(bottom, top[0], axis_, outer_, inner_, /*to_top=*/true, nullptr);
}

template <typename T>
void ConcatLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                            const Blobs& bottom) {
  CopySlices(bottom, top[0], axis_, outer_, inner_, /*to_top=*/false, &propagate_down);
}

namespace {

// Launches one slice copy in units of U (sizes in bytes: the slice, the wide axis, the offset).
template <typename U>
void LaunchSliceCopy(const char* what, const Tensor& narrow, const Tensor& wide, bool to_wide,
                     int64_t outer, int64_t slice, int64_t wide_len, int64_t at) {
  constexpr int64_t u = sizeof(U);
  U* n = static_cast<U*>(narrow.raw_data());
  U* w = static_cast<U*>(wide.raw_data());
  kernels::SliceCopy<U> body{};
  body.src = to_wide ? n : w;
  body.dst = to_wide ? w : n;
  body.slice = slice / u;
  body.wide = wide_len / u;
  body.at = at / u;
  body.to_wide = to_wide;
  RunIndexed(what, {narrow, wide}, outer * (slice / u), body);
}

}  // namespace

void ConcatLayer::CopySlicesOnDevice(const Blobs& bottom, Blob* top, bool to_top,
                                     const std::vector<bool>* which) {
  const int64_t elem = static_cast<int64_t>(DTypeSize(top->data.dtype()));
  const Tensor& wide = to_top ? top->data : top->grad;
  const int64_t wide_len = top->data.dim(axis_) * inner_ * elem;  // bytes per outer index
  const std::string what = Describe() + (to_top ? " forward" : " backward");
  int64_t offset = 0;  // along the axis
  for (size_t i = 0; i < bottom.size(); ++i) {
    const int64_t len = bottom[i]->data.dim(axis_);
    const int64_t slice = len * inner_ * elem, at = offset * inner_ * elem;
    offset += len;
    if (!to_top && !(*which)[i]) continue;
    const Tensor& narrow = to_top ? bottom[i]->data : bottom[i]->grad;
    // The widest unit dividing every size and both addresses.
    const auto bits = static_cast<uint64_t>(slice | wide_len | at) |
                      reinterpret_cast<uintptr_t>(narrow.raw_data()) |
                      reinterpret_cast<uintptr_t>(wide.raw_data());
    if (bits % 8 == 0) {
      LaunchSliceCopy<uint64_t>(what.c_str(), narrow, wide, to_top, outer_, slice, wide_len, at);
    } else if (bits % 4 == 0) {
      LaunchSliceCopy<uint32_t>(what.c_str(), narrow, wide, to_top, outer_, slice, wide_len, at);
    } else if (bits % 2 == 0) {
      LaunchSliceCopy<uint16_t>(what.c_str(), narrow, wide, to_top, outer_, slice, wide_len, at);
    } else {
      LaunchSliceCopy<uint8_t>(what.c_str(), narrow, wide, to_top, outer_, slice, wide_len, at);
    }
  }
}

void ConcatLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  CopySlicesOnDevice(bottom, top[0], /*to_top=*/true, nullptr);
}

void ConcatLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                   const Blobs& bottom) {
  CopySlicesOnDevice(bottom, top[0], /*to_top=*/false, &propagate_down);
}

template class TypedLayer<ConcatLayer, AllDTypes>;

CORTADO_REGISTER_LAYER(Concat, ConcatLayer);

}  // namespace cortado
