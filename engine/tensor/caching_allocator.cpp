#include "engine/tensor/caching_allocator.h"

#include <algorithm>
#include <functional>

#include "engine/base/error.h"

namespace cortado {
namespace {

constexpr size_t kSmallRound = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeRound = size_t{128} << 10;

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

std::string Mib(size_t bytes) { return StrCat(static_cast<double>(bytes) / (1 << 20), " MiB"); }

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<RawMemory> raw,
                                   std::shared_ptr<EventSource> events)
    : raw_(std::move(raw)), events_(std::move(events)) {
  CORTADO_ASSERT(raw_ != nullptr);
}

CachingAllocator::~CachingAllocator() {
  // Blocks still in use belong to tensors that outlive the allocator only through a bug (each
  // Storage holds its allocator); the cached ones go back to the source, the pending ones once
  // the work that uses them has run.
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
}

size_t CachingAllocator::RoundedSize(size_t bytes) {
  if (bytes == 0) return kSmallRound;
  return bytes < kLargeThreshold ? RoundUp(bytes, kSmallRound) : RoundUp(bytes, kLargeRound);
}

void* CachingAllocator::TakeCached(size_t rounded) {
  auto it = cached_.lower_bound(rounded);
  if (it == cached_.end() || it->first > rounded + rounded / 8) return nullptr;
  void* ptr = it->second;
  in_use_[static_cast<const char*>(ptr)] = InUse{it->first, {}};
  stats_.in_use_bytes += it->first;
  cached_.erase(it);
  ++stats_.cache_hits;
  return ptr;
}

void* CachingAllocator::Allocate(size_t bytes) {
  const size_t rounded = RoundedSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  CollectPending(/*wait=*/false);
  void* ptr = TakeCached(rounded);
  if (ptr == nullptr) {
    ptr = raw_->Allocate(rounded);
    if (ptr == nullptr && (!cached_.empty() || !pending_.empty())) {
      ReleaseCachedLocked();  // waits for the pending blocks' streams first
      ptr = raw_->Allocate(rounded);
    }
    if (ptr == nullptr) {
      Fail("out of memory on ", raw_->device().ToString(), ": cannot allocate ", Mib(rounded), " (",
           Mib(stats_.in_use_bytes), " in use by tensors, ",
           Mib(stats_.reserved_bytes - stats_.in_use_bytes),
           " cached; a smaller data.batch_size needs less)");
    }
    in_use_[static_cast<const char*>(ptr)] = InUse{rounded, {}};
    stats_.in_use_bytes += rounded;
    stats_.reserved_bytes += rounded;
    ++stats_.raw_allocations;
  }
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return ptr;
}

void CachingAllocator::Free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(static_cast<const char*>(ptr));
  CORTADO_ASSERT(it != in_use_.end());
  const size_t size = it->second.size;
  CORTADO_ASSERT(size >= RoundedSize(bytes));  // a cached block may be up to 1/8 larger
  stats_.in_use_bytes -= size;
  if (it->second.users.empty()) {
    cached_.emplace(size, ptr);  // stream-ordered: the next user queues behind the last
  } else {
    // Work on the streams that used the block may still be queued: it waits for an event on each.
    Pending pending{ptr, size, {}};
    for (const StreamRef& stream : it->second.users) {
      pending.events.push_back(events_->Record(stream));
    }
    pending_.push_back(std::move(pending));
    stats_.pending_bytes += size;
  }
  in_use_.erase(it);
}

bool CachingAllocator::RecordUse(const void* ptr, StreamRef stream) {
  CORTADO_CHECK(events_ != nullptr, "internal: RecordUse on a cache of ", raw_->device().ToString(),
                " memory that has no event source");
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  // The block that starts at or before p, if p is inside it.
  auto it = in_use_.upper_bound(p);
  if (it == in_use_.begin()) return false;
  --it;
  if (std::less<const char*>()(p, it->first) ||
      !std::less<const char*>()(p, it->first + it->second.size)) {
    return false;
  }
  std::vector<StreamRef>& users = it->second.users;
  if (std::find(users.begin(), users.end(), stream) == users.end()) users.push_back(stream);
  return true;
}

void CachingAllocator::CollectPending(bool wait) {
  auto reached = [&](Pending& block) {
    for (auto& event : block.events) {
      if (wait) {
        event->Wait();
      } else if (!event->Reached()) {
        return false;
      }
    }
    return true;
  };
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!reached(*it)) {
      ++it;
      continue;
    }
    cached_.emplace(it->size, it->ptr);
    stats_.pending_bytes -= it->size;
    it = pending_.erase(it);  // a few blocks at most: those freed since the streams last caught up
  }
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::ReleaseCached() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
}

void CachingAllocator::ReleaseCachedLocked() {
  CollectPending(/*wait=*/true);
  for (auto& [size, ptr] : cached_) {
    raw_->Free(ptr, size);
    stats_.reserved_bytes -= size;
  }
  cached_.clear();
}

}  // namespace cortado
