// A pool of tensor storage for memory whose lifetime is shorter than a step: the net's
// activation gradients, each alive from the backward pass of the layer that writes it to that
// of the layer that produced the activation. Released storage is kept and handed out again
// (best fit by size), so a steady state allocates nothing and memory is bounded by the most
// gradients alive at once, not by their sum.
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "engine/tensor.h"

namespace cortado {

class BufferPool {
 public:
  // A tensor of this shape and dtype on storage nobody else holds; contents are undefined.
  Tensor Acquire(const Shape& shape, DType dtype);
  // Takes back storage that Acquire handed out; `t` is left empty.
  void Release(Tensor& t);
  // Bytes of all storage the pool has created (in use or free): its peak footprint.
  size_t bytes_created() const { return bytes_created_; }
  size_t free_count() const { return free_.size(); }

 private:
  struct Slot {
    Tensor tensor;
    size_t capacity;
  };
  std::vector<Slot> free_;
  std::unordered_map<const void*, size_t> capacity_;  // by storage address
  size_t bytes_created_ = 0;
};

}  // namespace cortado
