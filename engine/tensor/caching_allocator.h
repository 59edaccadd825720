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
// once, which is safe while every user of the block queues its work on one stream (a device's
// compute stream): the next user's work runs after the last one's. Where that does not hold, the
// user names the stream with RecordUse: a device block used on another stream, or pinned host
// memory, which the host writes as soon as it has it while a queued async copy may still be
// reading it (every stream is another stream to the host). When such a block is freed,
// the cache records an event on each stream that used it and hands the block out again only once
// every one of them has been reached; until then a request takes another block (or the raw
// source's), and on running out of memory the cache waits for them before it releases its blocks.
// This is what PyTorch's caching allocator does with record_stream. Streams and events are behind
// an interface (EventSource) so that this file has no CUDA in it and is host-testable (tests use
// plain host memory and events they complete themselves). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

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

// A queue of device work named without CUDA types: a CUDA stream and the GPU it belongs to.
struct StreamRef {
  int device = 0;
  void* handle = nullptr;  // cudaStream_t
  bool operator==(const StreamRef& other) const = default;
};

// A point recorded in a stream (a CUDA event): reached once the work queued before it has run.
class StreamEvent {
 public:
  virtual ~StreamEvent() = default;
  // True once reached; does not block.
  virtual bool Reached() = 0;
  // Blocks the calling thread until reached.
  virtual void Wait() = 0;
};

// Records events on streams (cudaEventRecord); called with the cache's lock held, from whichever
// thread frees a block.
class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual std::unique_ptr<StreamEvent> Record(StreamRef stream) = 0;
};

struct MemoryStats {
  size_t in_use_bytes = 0;         // handed out and not yet freed (rounded sizes)
  size_t pending_bytes = 0;        // freed, waiting for work queued on the streams that used them
  size_t reserved_bytes = 0;       // held from the raw source: in use, pending and cached
  size_t peak_in_use_bytes = 0;    // high-water mark of in_use_bytes since the last ResetPeak
  size_t peak_reserved_bytes = 0;  // high-water mark of reserved_bytes since the last ResetPeak
  int64_t raw_allocations = 0;     // calls to the raw source that returned memory
  int64_t cache_hits = 0;          // requests served from the cache
};

class CachingAllocator final : public Allocator {
 public:
  // events: needed only by RecordUse (null: every block is used in one stream's order).
  explicit CachingAllocator(std::unique_ptr<RawMemory> raw,
                            std::shared_ptr<EventSource> events = nullptr);
  // Waits for the events of blocks still pending before it frees them.
  ~CachingAllocator() override;

  void* Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  Device device() const override { return raw_->device(); }

  // Work queued on `stream` uses the block that holds `ptr` (any address inside a block handed out
  // and not yet freed): once freed, that block is not handed out again until the work queued on
  // `stream` up to the Free has run. False, recording nothing, when no such block of this cache
  // holds ptr (memory from another allocator). Needs an EventSource.
  bool RecordUse(const void* ptr, StreamRef stream);

  MemoryStats stats() const;
  // Starts the peak figures again from what is in use and reserved now.
  void ResetPeak();
  // Returns every cached (free) block to the raw source, pending ones after waiting for their
  // events.
  void ReleaseCached();

  // The size a request of `bytes` is rounded to.
  static size_t RoundedSize(size_t bytes);

 private:
  struct InUse {
    size_t size = 0;               // rounded
    std::vector<StreamRef> users;  // streams named by RecordUse, each once
  };
  struct Pending {
    void* ptr = nullptr;
    size_t size = 0;
    std::vector<std::unique_ptr<StreamEvent>> events;  // one per stream that used the block
  };

  // The rest hold mu_.
  void* TakeCached(size_t rounded);
  // Moves the pending blocks whose events have all been reached (all of them, waiting, when
  // `wait`) to the cache.
  void CollectPending(bool wait);
  void ReleaseCachedLocked();

  std::unique_ptr<RawMemory> raw_;
  std::shared_ptr<EventSource> events_;  // outlives pending_'s events (declared before it)
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;  // free blocks by size
  // Blocks handed out, ordered by address so RecordUse finds the block around a view's pointer.
  std::map<const char*, InUse> in_use_;
  std::vector<Pending> pending_;  // freed, events not all reached; in order of freeing
  MemoryStats stats_;
};

}  // namespace cortado
