#include "engine/tensor/caching_allocator.h"

#include <algorithm>

#include "engine/base/error.h"

namespace cortado {
namespace {

constexpr size_t kSmallRound = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeRound = size_t{128} << 10;

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

std::string Mib(size_t bytes) { return StrCat(static_cast<double>(bytes) / (1 << 20), " MiB"); }

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<RawMemory> raw) : raw_(std::move(raw)) {
  CORTADO_ASSERT(raw_ != nullptr);
}

CachingAllocator::~CachingAllocator() {
  // Blocks still in use belong to tensors that outlive the allocator only through a bug (each
  // Storage holds its allocator); the cached ones go back to the source.
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
  in_use_[ptr] = it->first;
  stats_.in_use_bytes += it->first;
  cached_.erase(it);
  ++stats_.cache_hits;
  return ptr;
}

void* CachingAllocator::Allocate(size_t bytes) {
  const size_t rounded = RoundedSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = TakeCached(rounded);
  if (ptr == nullptr) {
    ptr = raw_->Allocate(rounded);
    if (ptr == nullptr && !cached_.empty()) {
      ReleaseCachedLocked();
      ptr = raw_->Allocate(rounded);
    }
    if (ptr == nullptr) {
      Fail("out of memory on ", raw_->device().ToString(), ": cannot allocate ", Mib(rounded), " (",
           Mib(stats_.in_use_bytes), " in use by tensors, ",
           Mib(stats_.reserved_bytes - stats_.in_use_bytes),
           " cached; a smaller data.batch_size needs less)");
    }
    in_use_[ptr] = rounded;
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
  auto it = in_use_.find(ptr);
  CORTADO_ASSERT(it != in_use_.end());
  CORTADO_ASSERT(it->second >= RoundedSize(bytes));  // a cached block may be up to 1/8 larger
  stats_.in_use_bytes -= it->second;
  cached_.emplace(it->second, ptr);
  in_use_.erase(it);
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
  for (auto& [size, ptr] : cached_) {
    raw_->Free(ptr, size);
    stats_.reserved_bytes -= size;
  }
  cached_.clear();
}

}  // namespace cortado
