// The caching allocator over plain host memory: what a GPU's cudaMalloc would be asked for; and
// blocks used on other streams (RecordUse), with events the test reaches itself: such a block is
// not handed out again until the work queued on those streams has run.
#include "engine/tensor/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
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

// Events the test reaches by hand, as a GPU would when the work queued before them has run. Each
// records its stream; Wait reaches the event (the host waited for the stream) and counts.
class FakeEvents final : public EventSource {
 public:
  struct Event {
    StreamRef stream;
    bool reached = false;
    int waits = 0;
  };
  std::unique_ptr<StreamEvent> Record(StreamRef stream) override {
    events.push_back(std::make_shared<Event>(Event{stream}));
    return std::make_unique<Handle>(events.back());
  }
  // Everything queued on `stream` so far has run.
  void Reach(StreamRef stream) {
    for (auto& e : events) e->reached |= e->stream == stream;
  }
  std::vector<std::shared_ptr<Event>> events;

 private:
  class Handle final : public StreamEvent {
   public:
    explicit Handle(std::shared_ptr<Event> e) : e_(std::move(e)) {}
    bool Reached() override { return e_->reached; }
    void Wait() override {
      ++e_->waits;
      e_->reached = true;
    }

   private:
    std::shared_ptr<Event> e_;
  };
};

int kStreamTag = 0;  // streams are named by addresses, as cudaStream_t handles are
const StreamRef kCopyStream{0, &kStreamTag};
const StreamRef kOtherStream{1, &kStreamTag + 1};

struct Fixture {
  explicit Fixture(size_t budget = size_t{1} << 30) {
    auto raw = std::make_unique<CountingMemory>(budget);
    auto fake = std::make_shared<FakeEvents>();
    memory = raw.get();
    events = fake.get();
    cache = std::make_unique<CachingAllocator>(std::move(raw), fake);
  }
  CountingMemory* memory;
  FakeEvents* events;
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

// A pinned host block that a queued copy reads is freed (the loader is done with the batch): the
// next request of its size gets another block, and the first comes back only once the copy's
// stream has passed the point where the block was freed.
TEST(CachingAllocator, ABlockAQueuedCopyReadsIsNotReusedUntilItsStreamGetsThere) {
  Fixture f;
  void* batch = f.cache->Allocate(3 << 20);
  ASSERT_TRUE(f.cache->RecordUse(batch, kCopyStream));
  f.cache->Free(batch, 3 << 20);
  ASSERT_EQ(f.events->events.size(), 1u);
  EXPECT_EQ(f.events->events[0]->stream, kCopyStream);
  EXPECT_EQ(f.cache->stats().pending_bytes, size_t{3} << 20);
  EXPECT_EQ(f.cache->stats().in_use_bytes, 0u);

  void* next = f.cache->Allocate(3 << 20);
  EXPECT_NE(next, batch) << "handed out while a queued copy may still read it";
  EXPECT_EQ(f.memory->allocations, 2);
  f.cache->Free(next, 3 << 20);  // no use recorded: cached at once

  f.events->Reach(kCopyStream);
  void* a = f.cache->Allocate(3 << 20);
  void* b = f.cache->Allocate(3 << 20);
  EXPECT_TRUE((a == batch && b == next) || (a == next && b == batch));
  EXPECT_EQ(f.memory->allocations, 2);
  EXPECT_EQ(f.cache->stats().pending_bytes, 0u);
  EXPECT_EQ(f.cache->stats().reserved_bytes, size_t{6} << 20);
  f.cache->Free(a, 3 << 20);
  f.cache->Free(b, 3 << 20);
}

// Each stream that used a block gets one event, however often it was named, and the block waits
// for all of them; a block whose use was recorded once is not marked for its next owner.
TEST(CachingAllocator, ABlockWaitsForEveryStreamThatUsedIt) {
  Fixture f;
  void* block = f.cache->Allocate(4096);
  EXPECT_TRUE(f.cache->RecordUse(block, kCopyStream));
  EXPECT_TRUE(f.cache->RecordUse(static_cast<char*>(block) + 100, kCopyStream));  // a view
  EXPECT_TRUE(f.cache->RecordUse(block, kOtherStream));
  f.cache->Free(block, 4096);
  ASSERT_EQ(f.events->events.size(), 2u);
  f.events->Reach(kCopyStream);
  void* other = f.cache->Allocate(4096);
  EXPECT_NE(other, block) << "reused before the second stream got there";
  f.cache->Free(other, 4096);
  f.events->Reach(kOtherStream);
  std::set<void*> both = {f.cache->Allocate(4096), f.cache->Allocate(4096)};
  EXPECT_EQ(both, (std::set<void*>{block, other}));
  EXPECT_EQ(f.memory->allocations, 2);
  // The new owner recorded nothing: freeing records no event.
  for (void* p : both) f.cache->Free(p, 4096);
  EXPECT_EQ(f.events->events.size(), 2u);
}

TEST(CachingAllocator, RecordUseFindsTheBlockAroundAPointerAndNothingElse) {
  Fixture f;
  char* a = static_cast<char*>(f.cache->Allocate(1000));  // a 1024-byte block
  EXPECT_TRUE(f.cache->RecordUse(a + 1023, kCopyStream));
  EXPECT_FALSE(f.cache->RecordUse(a + 1024, kCopyStream)) << "past the block's end";
  const auto* before = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(a) - 1);
  EXPECT_FALSE(f.cache->RecordUse(before, kCopyStream)) << "before the block's start";
  int elsewhere = 0;
  EXPECT_FALSE(f.cache->RecordUse(&elsewhere, kCopyStream));
  f.cache->Free(a, 1000);
  EXPECT_FALSE(f.cache->RecordUse(a, kCopyStream)) << "a freed block is no longer in use";
}

// Out of memory with a block still pending: the cache waits for its streams, then releases every
// free block and tries again.
TEST(CachingAllocator, OutOfMemoryWaitsForPendingBlocksThenReleasesThem) {
  Fixture f(size_t{6} << 20);
  void* a = f.cache->Allocate(4 << 20);
  f.cache->RecordUse(a, kCopyStream);
  f.cache->Free(a, 4 << 20);
  void* b = f.cache->Allocate(5 << 20);  // fits only once the pending block is released
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(f.events->events.size(), 1u);
  EXPECT_EQ(f.events->events[0]->waits, 1);
  EXPECT_EQ(f.memory->frees, 1);
  EXPECT_EQ(f.cache->stats().pending_bytes, 0u);
  EXPECT_EQ(f.cache->stats().reserved_bytes, size_t{5} << 20);
  f.cache->Free(b, 5 << 20);
}

TEST(CachingAllocator, ReleaseCachedWaitsForPendingBlocksBeforeFreeingThem) {
  Fixture f;
  void* a = f.cache->Allocate(4096);
  f.cache->RecordUse(a, kCopyStream);
  f.cache->Free(a, 4096);
  f.cache->ReleaseCached();
  ASSERT_EQ(f.events->events.size(), 1u);
  EXPECT_EQ(f.events->events[0]->waits, 1);
  EXPECT_EQ(f.memory->frees, 1);
  EXPECT_EQ(f.cache->stats().reserved_bytes, 0u);
}

TEST(CachingAllocator, RecordUseNeedsAnEventSource) {
  CachingAllocator cache(std::make_unique<CountingMemory>(size_t{1} << 20));
  void* a = cache.Allocate(100);
  EXPECT_THROW(cache.RecordUse(a, kCopyStream), Error);
  cache.Free(a, 100);
}

}  // namespace
}  // namespace cortado
