// A pool of tensor storage for memory whose lifetime is shorter than a step: the net's
// activation gradients, each alive from the backward pass of the layer that writes it to that
// of the layer that produced the activation, and (with a memory plan, engine/tensor/memory_plan.h)
// the activations themselves. Released storage is kept and handed out again
// (best fit by size), so a steady state allocates nothing and memory is bounded by the most
// gradients alive at once, not by their sum.
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "engine/tensor/tensor.h"

namespace cortado {

class BufferPool {
 public:
  // Where new storage comes from (null, the default: CpuAllocator(); a device's allocator for a
  // net on a device). Set before the first Acquire.
  void set_allocator(std::shared_ptr<Allocator> allocator) { allocator_ = std::move(allocator); }
  // A tensor of this shape and dtype on storage nobody else holds; contents are undefined.
  Tensor Acquire(const Shape& shape, DType dtype);
  // Takes back storage that Acquire handed out; `t` is left empty.
  void Release(Tensor& t);
  // Bytes of all storage the pool has created (in use or free): its peak footprint.
  size_t bytes_created() const { return bytes_created_; }
  size_t free_count() const { return free_.size(); }
  // Bytes handed out and not yet given back (as asked for, not the slots' capacity), and the
  // most there ever were: what a memory plan's peak predicts.
  size_t bytes_lent() const { return bytes_lent_; }
  size_t peak_bytes_lent() const { return peak_bytes_lent_; }
  void ResetPeak() { peak_bytes_lent_ = bytes_lent_; }

 private:
  struct Slot {
    Tensor tensor;
    size_t capacity;
  };
  std::vector<Slot> free_;
  std::unordered_map<const void*, size_t> capacity_;  // by storage address
  std::unordered_map<const void*, size_t> lent_;      // by storage address: bytes asked for
  size_t bytes_created_ = 0;
  size_t bytes_lent_ = 0, peak_bytes_lent_ = 0;
  std::shared_ptr<Allocator> allocator_;
};

}  // namespace cortado

namespace cortado {

// The storage of a memory plan (engine/tensor/memory_plan.h): one block of the plan's arena_bytes,
// each group a view at its planned offset, so buffers given back in any order leave no holes
// that a larger buffer cannot use. Counts what is lent as BufferPool does: the measured
// high-water mark that the plan's peak predicts.
class ArenaPool {
 public:
  // Where the block comes from (null: CpuAllocator()); set before the first Reserve.
  void set_allocator(std::shared_ptr<Allocator> allocator) { allocator_ = std::move(allocator); }
  // Makes the block at least `bytes` long; a larger block than before is new storage (views
  // into the old one keep it alive until they are dropped).
  void Reserve(size_t bytes);
  // A tensor of this shape and dtype at byte `offset` of the block, counted as lent; its
  // contents are undefined. Throws when it would not fit in the block.
  Tensor Take(const Shape& shape, DType dtype, size_t offset);
  // Takes back a tensor Take handed out; `t` is left empty.
  void Give(Tensor& t);
  bool Holds(const Tensor& t) const { return t.SharesStorageWith(block_); }
  // Bytes of the block (the storage behind every buffer of the plan).
  size_t bytes_created() const { return block_.defined() ? block_.nbytes() : 0; }
  size_t bytes_lent() const { return bytes_lent_; }
  size_t peak_bytes_lent() const { return peak_bytes_lent_; }
  void ResetPeak() { peak_bytes_lent_ = bytes_lent_; }

 private:
  Tensor block_;  // u8
  size_t bytes_lent_ = 0, peak_bytes_lent_ = 0;
  std::shared_ptr<Allocator> allocator_;
};

}  // namespace cortado
