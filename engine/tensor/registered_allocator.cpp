#include "engine/tensor/registered_allocator.h"

namespace cortado {

void* RegisteredAllocator::Allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) return CpuAllocator()->Allocate(bytes);
  std::unique_ptr<dist::RegisteredMemory> memory = comm_->AllocateRegistered(bytes);
  void* p = memory->data();
  blocks_.emplace(p, std::move(memory));
  return p;
}

void RegisteredAllocator::Free(void* ptr, size_t bytes) {
  std::unique_ptr<dist::RegisteredMemory> memory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      CpuAllocator()->Free(ptr, bytes);  // allocated after Detach
      return;
    }
    memory = std::move(it->second);
    blocks_.erase(it);
  }
  // Freed outside the lock: unregistering may take a while.
}

void RegisteredAllocator::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  comm_ = nullptr;
}

size_t RegisteredAllocator::registered_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocks_.size();
}

}  // namespace cortado
