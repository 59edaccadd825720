#include "engine/buffer_pool.h"

#include "engine/error.h"

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
  if (best == free_.size()) {
    Tensor t(shape, dtype);
    capacity_[t.raw_data()] = std::max<size_t>(bytes, 1);
    bytes_created_ += bytes;
    return t;
  }
  Tensor t = std::move(free_[best].tensor);
  free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
  t.Resize(shape, dtype);  // keeps the storage: it is big enough
  return t;
}

void BufferPool::Release(Tensor& t) {
  auto it = capacity_.find(t.raw_data());
  CORTADO_CHECK(it != capacity_.end(), "BufferPool::Release: ", t.ToString(),
                " was not acquired from this pool");
  free_.push_back(Slot{std::move(t), it->second});
  t = Tensor();
}

}  // namespace cortado
