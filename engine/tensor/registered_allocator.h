// RegisteredAllocator: a Tensor Allocator whose blocks are a communicator's registered memory
// (dist::Communicator::AllocateRegistered). The data-parallel glue allocates its flat gradient
// block from one, so every bucket lies in memory the transport registered once, at allocation:
// over UCX with every rank on one host that is shared memory, and the buckets' all-reduces run
// the direct algorithm (each rank reduces its slice straight from the others' blocks).
//
// Ownership: tensors hold the allocator by shared_ptr, and a block may be freed after the
// communicator is gone (the registered memory keeps what it needs). The communicator must
// outlive Detach(), which its owner calls before destroying it; after Detach, new blocks are
// plain host memory. Allocate and Free may run on any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "cortado/dist/communicator.h"
#include "engine/tensor/tensor.h"

namespace cortado {

class RegisteredAllocator final : public Allocator {
 public:
  explicit RegisteredAllocator(dist::Communicator& comm) : comm_(&comm) {}
  void* Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  Device device() const override { return Device::CPU(); }
  // Stops using the communicator (see the file comment).
  void Detach();
  // Blocks handed out and not yet freed that are registered memory.
  size_t registered_blocks() const;

 private:
  mutable std::mutex mu_;
  dist::Communicator* comm_;
  std::unordered_map<void*, std::unique_ptr<dist::RegisteredMemory>> blocks_;
};

}  // namespace cortado
