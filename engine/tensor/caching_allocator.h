// CachingAllocator: keeps freed blocks and hands them out again, so a training step that
// allocates the same sizes every iteration asks the raw source (cudaMalloc, which synchronizes
// the device and costs tens of microseconds) only during the first step.
//
// Sizes are rounded up (to 512 bytes below 1 MiB, to 128 KiB above: at most 1/8 wasted), and a
// request takes the smallest cached block that fits and is at most 1/8 larger than the rounded
// size, so a large cached block is not spent on a small request. When the raw source is out of
// memory every cached block is returned to it and the request is tried once more; failing that,
// the error names the request, what is in use and what is cached.
//
// Stream order: a block freed while kernels that use it are still queued may be handed out at
// once, which is safe because every user of one allocator queues its work on one stream (the
// device's compute stream); memory used on another stream must be synchronized by its user
// before it is freed. The raw source is host-testable (tests use plain host memory), so this
// file has no CUDA in it. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "engine/tensor/tensor.h"

namespace cortado {

// Where the cache's blocks come from. Allocate returns null when the source is out of memory
// (other failures throw).
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

struct MemoryStats {
  size_t in_use_bytes = 0;         // handed out and not yet freed (rounded sizes)
  size_t reserved_bytes = 0;       // held from the raw source: in use plus cached
  size_t peak_in_use_bytes = 0;    // high-water mark of in_use_bytes since the last ResetPeak
  size_t peak_reserved_bytes = 0;  // high-water mark of reserved_bytes since the last ResetPeak
  int64_t raw_allocations = 0;     // calls to the raw source that returned memory
  int64_t cache_hits = 0;          // requests served from the cache
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawMemory> raw);
  ~CachingAllocator() override;

  void* Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  Device device() const override { return raw_->device(); }

  MemoryStats stats() const;
  // Starts the peak figures again from what is in use and reserved now.
  void ResetPeak();
  // Returns every cached (free) block to the raw source.
  void ReleaseCached();

  // The size a request of `bytes` is rounded to.
  static size_t RoundedSize(size_t bytes);

 private:
  void* TakeCached(size_t rounded);  // caller holds mu_
  void ReleaseCachedLocked();

  std::unique_ptr<RawMemory> raw_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;       // free blocks by size
  std::unordered_map<void*, size_t> in_use_;  // block -> rounded size
  MemoryStats stats_;
};

}  // namespace cortado
