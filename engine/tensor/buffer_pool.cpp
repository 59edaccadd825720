#include "engine/tensor/buffer_pool.h"

#include <algorithm>

#include "engine/base/error.h"

namespace cortado {

Tensor BufferPool::Acquire(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].capacity >= bytes &&
        (best == free_.size() || free_[i].capacity < free_[best].capacity)) {
      best = i;
    }
  }
  Tensor t;
  if (best == free_.size()) {
    t = Tensor(shape, dtype, allocator_);
    capacity_[t.raw_data()] = std::max<size_t>(bytes, 1);
    bytes_created_ += bytes;
  } else {
    t = std::move(free_[best].tensor);
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    t.Resize(shape, dtype);  // keeps the storage: it is big enough
  }
  lent_[t.raw_data()] = bytes;
  bytes_lent_ += bytes;
  peak_bytes_lent_ = std::max(peak_bytes_lent_, bytes_lent_);
  return t;
}

void BufferPool::Release(Tensor& t) {
  auto it = capacity_.find(t.raw_data());
  CORTADO_CHECK(it != capacity_.end(), "BufferPool::Release: ", t.ToString(),
                " was not acquired from this pool");
  auto lent = lent_.find(t.raw_data());
  CORTADO_CHECK(lent != lent_.end(), "BufferPool::Release: ", t.ToString(),
                " was given back twice");
  bytes_lent_ -= lent->second;
  lent_.erase(lent);
  free_.push_back(Slot{std::move(t), it->second});
  t = Tensor();
}

}  // namespace cortado

namespace cortado {

void ArenaPool::Reserve(size_t bytes) {
  if (block_.defined() && block_.nbytes() >= bytes) return;
  block_ = Tensor();  // this pool's hold on the old block goes before the new one is made
  block_ = Tensor({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::kU8, allocator_);
}

Tensor ArenaPool::Take(const Shape& shape, DType dtype, size_t offset) {
  const size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
  CORTADO_CHECK(offset % DTypeSize(dtype) == 0 && offset + bytes <= bytes_created(),
                "ArenaPool::Take: ", bytes, " bytes at offset ", offset, " of a ", bytes_created(),
                "-byte block");
  Tensor t = block_.View({static_cast<int64_t>(bytes)}, static_cast<int64_t>(offset));
  t.Resize(shape, dtype);  // the same place, retyped: the offset is a multiple of the size
  bytes_lent_ += bytes;
  peak_bytes_lent_ = std::max(peak_bytes_lent_, bytes_lent_);
  return t;
}

void ArenaPool::Give(Tensor& t) {
  CORTADO_CHECK(Holds(t), "ArenaPool::Give: ", t.ToString(), " is not from this pool's block");
  bytes_lent_ -= t.nbytes();
  t = Tensor();
}

}  // namespace cortado
