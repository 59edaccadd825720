#include "layers/split.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "engine/base/thread_pool.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/copy_kernels.h"
#include "layers/layer_util.h"

namespace cortado {

constexpr int64_t kSplitChunk = 32768;

void SplitLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  if (top.empty()) Fail(Describe(), ": needs at least one output");
}

void SplitLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  // Sharing (not copying) the storage: a Tensor copy refers to the same memory.
  for (Blob* t : top) t->data = bottom[0]->data;
}

void SplitLayer::Share(const Blobs& bottom, const Blobs& top) {
  // The bottom may have been reallocated since Reshape (a larger batch); share again.
  for (Blob* t : top) t->data = bottom[0]->data;
}

template <typename T>
void SplitLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                           const Blobs& bottom) {
  if (!propagate_down[0]) return;
  T* dx = bottom[0]->grad.data<T>();  // bottom: any shape
  std::vector<const T*> dy;           // top[j]: bottom's shape
  for (Blob* t : top) dy.push_back(t->grad.data<T>());
  const size_t n_top = dy.size();
  ParallelFor(bottom[0]->data.numel(), kSplitChunk, [&](int64_t begin, int64_t end) {
    if (n_top == 1) {
      std::copy(dy[0] + begin, dy[0] + end, dx + begin);
      return;
    }
    if constexpr (kIsLowPrecision<T>) {
      // 16-bit: sum in f32 a cache-sized block at a time, round once (as the f32 fallback).
      std::vector<float> acc(kSplitChunk);
      for (int64_t b0 = begin; b0 < end; b0 += kSplitChunk) {
        const size_t n = static_cast<size_t>(std::min(kSplitChunk, end - b0));
        dist::Decode(LowpCodec<T>(), dy[0] + b0, n, acc.data());
        for (size_t j = 1; j < n_top; ++j) {
          dist::DecodeAccumulate(LowpCodec<T>(), dy[j] + b0, n, acc.data());
        }
        dist::Encode(LowpCodec<T>(), acc.data(), n, dx + b0);
      }
    } else {
      const T* a = dy[0];
      const T* b = dy[1];
      for (int64_t i = begin; i < end; ++i) dx[i] = a[i] + b[i];
      for (size_t j = 2; j < n_top; ++j) {
        const T* c = dy[j];
        for (int64_t i = begin; i < end; ++i) dx[i] += c[i];
      }
    }
  });
}

template <typename T>
void SplitLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  Share(bottom, top);
}

template <class E>
void SplitLayer::SumOnDevice(const Blobs& top, Tensor& dx) {
  using A = typename E::Acc;
  const int64_t n = dx.numel();
  const int n_top = static_cast<int>(top.size());
  // 16-bit storage keeps the running sum of a long split in f32 between passes.
  constexpr bool kWide = !std::is_same_v<typename E::Stored, A>;
  if (kWide && n_top > kernels::kSumTopsPerPass) {
    if (partial_.device() != dx.device()) {
      partial_ = Tensor({0}, DType::kF32, AllocatorFor(dx.device()));
    }
    partial_.Resize({n}, DType::kF32);
  }
  const std::string what = Describe() + " backward";
  for (int first = 0; first < n_top; first += kernels::kSumTopsPerPass) {
    const int count = std::min(kernels::kSumTopsPerPass, n_top - first);
    const bool last = first + count == n_top;
    kernels::SumTops<E> body{};
    std::vector<Tensor> given{dx};
    for (int j = 0; j < count; ++j) {
      body.dy[j] = StoredData<E>(top[first + j]->grad);
      given.push_back(top[first + j]->grad);
    }
    body.count = count;
    if constexpr (kWide) {
      if (first > 0) body.partial = static_cast<const A*>(partial_.raw_data());
      if (!last) body.running = static_cast<A*>(partial_.raw_data());
      if (n_top > kernels::kSumTopsPerPass) given.push_back(partial_);
    } else if (first > 0) {
      body.partial = StoredData<E>(dx);  // f32 and f64 add into dx, as the CPU does
    }
    if (last || !kWide) body.out = StoredData<E>(dx);
    RunIndexed(what.c_str(), given, n, body);
  }
}

void SplitLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                  const Blobs& bottom) {
  if (!propagate_down[0]) return;
  Tensor& dx = bottom[0]->grad;
  if (top.size() == 1) return dx.CopyFrom(top[0]->grad);  // the bits as they are, as the CPU
  WithElementCodes(*this, bottom[0]->data.dtype(),
                   [&](auto codes) { SumOnDevice<decltype(codes)>(top, dx); });
}

template class TypedLayer<SplitLayer, AllFloatTypes>;

CORTADO_REGISTER_LAYER(Split, SplitLayer);

}  // namespace cortado
