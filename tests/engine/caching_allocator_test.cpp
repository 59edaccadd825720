// The caching allocator over plain host memory: what a GPU's cudaMalloc would be asked for.
#include "engine/tensor/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <vector>

namespace cortado {
namespace {

// Host memory with a budget, counting the calls the cache makes.
class CountingMemory final : public RawMemory {
 public:
  explicit CountingMemory(size_t budget) : budget_(budget) {}
  void* Allocate(size_t bytes) override {
    if (used_ + bytes > budget_) return nullptr;
    used_ += bytes;
    ++allocations;
    return std::malloc(bytes);
  }
  void Free(void* ptr, size_t bytes) override {
    used_ -= bytes;
    ++frees;
    std::free(ptr);
  }
  Device device() const override { return Device{DeviceType::kCUDA, 3}; }
  int allocations = 0;
  int frees = 0;

 private:
  size_t budget_;
  size_t used_ = 0;
};

struct Fixture {
  explicit Fixture(size_t budget = size_t{1} << 30) {
    auto raw = std::make_unique<CountingMemory>(budget);
    memory = raw.get();
    cache = std::make_unique<CachingAllocator>(std::move(raw));
  }
  CountingMemory* memory;
  std::unique_ptr<CachingAllocator> cache;
};

TEST(CachingAllocator, RoundsSmallTo512BytesAndLargeTo128KiB) {
  EXPECT_EQ(CachingAllocator::RoundedSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundedSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundedSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundedSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundedSize((1 << 20) - 1), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::RoundedSize((1 << 20) + 1), (size_t{1} << 20) + (128 << 10));
}

TEST(CachingAllocator, ASecondStepWithTheSameSizesAsksTheSourceForNothing) {
  Fixture f;
  const std::vector<size_t> step = {4096, 1 << 20, 3 << 20, 100, 4096, 77777};
  for (int iteration = 0; iteration < 3; ++iteration) {
    std::vector<void*> blocks;
    for (size_t bytes : step) blocks.push_back(f.cache->Allocate(bytes));
    std::set<void*> distinct(blocks.begin(), blocks.end());
    EXPECT_EQ(distinct.size(), step.size()) << "a block was handed out twice";
    for (size_t i = 0; i < step.size(); ++i) f.cache->Free(blocks[i], step[i]);
  }
  EXPECT_EQ(f.memory->allocations, static_cast<int>(step.size()));
  EXPECT_EQ(f.cache->stats().cache_hits, static_cast<int64_t>(2 * step.size()));
  EXPECT_EQ(f.cache->stats().in_use_bytes, 0u);
}

TEST(CachingAllocator, ASmallRequestDoesNotTakeAMuchLargerBlock) {
  Fixture f;
  void* big = f.cache->Allocate(8 << 20);
  f.cache->Free(big, 8 << 20);
  void* small = f.cache->Allocate(4 << 20);
  EXPECT_NE(small, big);
  EXPECT_EQ(f.memory->allocations, 2);
  // At most 1/8 larger is close enough.
  f.cache->Free(small, 4 << 20);
  void* near = f.cache->Allocate((8 << 20) - (512 << 10));
  EXPECT_EQ(near, big);
  f.cache->Free(near, (8 << 20) - (512 << 10));
}

TEST(CachingAllocator, PeaksCountRoundedBytesAndResetToWhatIsInUse) {
  Fixture f;
  void* a = f.cache->Allocate(1000);  // 1024
  void* b = f.cache->Allocate(3000);  // 3072
  f.cache->Free(a, 1000);
  MemoryStats s = f.cache->stats();
  EXPECT_EQ(s.in_use_bytes, 3072u);
  EXPECT_EQ(s.reserved_bytes, 4096u);
  EXPECT_EQ(s.peak_in_use_bytes, 4096u);
  f.cache->ResetPeak();
  EXPECT_EQ(f.cache->stats().peak_in_use_bytes, 3072u);
  EXPECT_EQ(f.cache->stats().peak_reserved_bytes, 4096u);
  f.cache->Free(b, 3000);
  f.cache->ReleaseCached();
  EXPECT_EQ(f.cache->stats().reserved_bytes, 0u);
  EXPECT_EQ(f.memory->frees, 2);
}

TEST(CachingAllocator, OutOfMemoryReleasesTheCacheAndRetries) {
  Fixture f(size_t{6} << 20);
  void* a = f.cache->Allocate(4 << 20);
  f.cache->Free(a, 4 << 20);             // cached: 4 MiB of the 6 MiB budget
  void* b = f.cache->Allocate(5 << 20);  // fits only after the cache is released
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(f.memory->frees, 1);
  EXPECT_EQ(f.cache->stats().reserved_bytes, size_t{5} << 20);
  f.cache->Free(b, 5 << 20);
}

TEST(CachingAllocator, OutOfMemoryNamesTheDeviceAndTheSizes) {
  Fixture f(size_t{2} << 20);
  void* a = f.cache->Allocate(1 << 20);
  try {
    f.cache->Allocate(3 << 20);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of memory on cuda:3"), std::string::npos) << what;
    EXPECT_NE(what.find("cannot allocate 3 MiB"), std::string::npos) << what;
    EXPECT_NE(what.find("1 MiB in use"), std::string::npos) << what;
  }
  f.cache->Free(a, 1 << 20);
}

TEST(CachingAllocator, TensorsDrawFromItAndReturnToIt) {
  auto raw = std::make_unique<CountingMemory>(size_t{1} << 30);
  CountingMemory* memory = raw.get();
  auto cache = std::make_shared<CachingAllocator>(std::move(raw));
  for (int i = 0; i < 4; ++i) {
    Tensor t({16, 3, 8, 8}, DType::kF32, cache);
    EXPECT_EQ(t.device(), (Device{DeviceType::kCUDA, 3}));
  }
  EXPECT_EQ(memory->allocations, 1);
  EXPECT_EQ(cache->stats().in_use_bytes, 0u);
}

}  // namespace
}  // namespace cortado
