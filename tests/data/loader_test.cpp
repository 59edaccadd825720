// BatchLoader: batches come out complete and in order whatever the thread timing; a short last
// batch, the end of the stream, restarts, positions left out, and worker exceptions reach the
// consumer.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/base/error.h"
#include "engine/base/random.h"

namespace cortado {
namespace {

// Sample s of batch b is id 1000 * b + pos; the plan ends after `batches` batches, the last
// one holding `last` samples.
BatchLoader MakeLoader(int threads, int prefetch, int64_t batch_size, int64_t batches, int64_t last,
                       std::atomic<int>* produced, int fail_at = -1) {
  auto plan = [=](int64_t b, std::vector<int64_t>* samples) {
    if (b >= batches) return;
    const int64_t n = b == batches - 1 ? last : batch_size;
    for (int64_t p = 0; p < n; ++p) samples->push_back(1000 * b + p);
  };
  auto produce = [=](int, int64_t b, int64_t pos, int64_t sample, float* image, int32_t* label) {
    if (sample == fail_at) Fail("cannot decode sample ", sample);
    // Uneven work, so workers finish out of order.
    if (KeyToUniform(static_cast<uint64_t>(sample)) < 0.2) {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
    image[0] = static_cast<float>(sample);
    image[1] = static_cast<float>(b);
    *label = static_cast<int32_t>(pos);
    produced->fetch_add(1);
    return BatchLoader::Produced{};
  };
  return BatchLoader(threads, prefetch, batch_size, Shape{2}, plan, produce);
}

TEST(Loader, BatchesCompleteAndInOrder) {
  for (int threads : {1, 2, 5}) {
    std::atomic<int> produced{0};
    BatchLoader loader = MakeLoader(threads, 3, 7, 20, 4, &produced);
    loader.Start();
    Batch batch;
    double wait = 0;
    for (int64_t b = 0; b < 20; ++b) {
      ASSERT_TRUE(loader.Next(batch, &wait));
      const int64_t n = b == 19 ? 4 : 7;
      ASSERT_EQ(batch.size, n);
      ASSERT_EQ(batch.images.dim(0), n);
      ASSERT_EQ(batch.labels.dim(0), n);
      for (int64_t p = 0; p < n; ++p) {
        EXPECT_EQ(batch.images.data<float>()[p * 2], 1000 * b + p);
        EXPECT_EQ(batch.labels.data<int32_t>()[p], p);
      }
    }
    EXPECT_FALSE(loader.Next(batch, &wait));
    EXPECT_FALSE(loader.Next(batch, &wait));  // stays ended
    EXPECT_EQ(produced.load(), 19 * 7 + 4);
    EXPECT_GE(wait, 0.0);
  }
}

TEST(Loader, RestartBeginsAgainAndReusesBuffers) {
  std::atomic<int> produced{0};
  BatchLoader loader = MakeLoader(2, 2, 4, 100, 4, &produced);
  loader.Start();
  Batch batch;
  ASSERT_TRUE(loader.Next(batch, nullptr));
  ASSERT_TRUE(loader.Next(batch, nullptr));
  EXPECT_EQ(batch.images.data<float>()[0], 1000);
  loader.Start();  // discards what was decoded ahead
  std::vector<const void*> buffers;
  for (int b = 0; b < 9; ++b) {
    ASSERT_TRUE(loader.Next(batch, nullptr));
    EXPECT_EQ(batch.images.data<float>()[0], 1000 * b);
    buffers.push_back(batch.images.raw_data());
  }
  // prefetch + 1 buffers, used in turn: no allocation per batch.
  EXPECT_EQ(buffers[0], buffers[3]);
  EXPECT_EQ(buffers[1], buffers[7]);
  EXPECT_NE(buffers[0], buffers[1]);
}

TEST(Loader, WorkerErrorsReachTheConsumer) {
  std::atomic<int> produced{0};
  BatchLoader loader = MakeLoader(3, 2, 5, 100, 5, &produced, /*fail_at=*/2003);
  loader.Start();
  Batch batch;
  ASSERT_TRUE(loader.Next(batch, nullptr));
  ASSERT_TRUE(loader.Next(batch, nullptr));
  try {
    for (int i = 0; i < 10; ++i) loader.Next(batch, nullptr);
    FAIL() << "the error in batch 2 must surface";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot decode sample 2003"), std::string::npos);
  }
  // Start clears the error (the plan is the same, so it fails again at the same place).
  loader.Start();
  ASSERT_TRUE(loader.Next(batch, nullptr));
}

// Positions left out (unreadable records in evaluation) are removed from their batch, the
// samples after them moved up in order; a batch of nothing but such positions comes out empty,
// and the next batch in the same buffer is whole again.
TEST(Loader, LeftOutPositionsAreRemovedFromTheirBatch) {
  // Batch b holds samples 10 b + p for p < 4; odd samples of batch 0 and all of batch 1 are
  // left out.
  auto plan = [](int64_t b, std::vector<int64_t>* samples) {
    if (b >= 6) return;
    for (int64_t p = 0; p < 4; ++p) samples->push_back(10 * b + p);
  };
  auto produce = [](int, int64_t b, int64_t, int64_t sample, float* image, int32_t* label) {
    image[0] = static_cast<float>(sample);
    image[1] = -static_cast<float>(sample);
    *label = static_cast<int32_t>(sample);
    const bool out = b == 1 || (b == 0 && sample % 2 == 1);
    return BatchLoader::Produced{out ? 1 : 0, out};
  };
  for (int threads : {1, 3}) {
    BatchLoader loader(threads, 1, 4, Shape{2}, plan, produce);
    loader.Start();
    Batch batch;
    int64_t skipped = 0;
    std::vector<std::vector<int32_t>> labels;
    while (loader.Next(batch, nullptr, &skipped)) {
      ASSERT_EQ(batch.images.dim(0), batch.size);
      ASSERT_EQ(batch.labels.dim(0), batch.size);
      std::vector<int32_t> l(batch.labels.data<int32_t>(),
                             batch.labels.data<int32_t>() + batch.size);
      for (int64_t i = 0; i < batch.size; ++i) {
        EXPECT_EQ(batch.images.data<float>()[2 * i], static_cast<float>(l[i]));
        EXPECT_EQ(batch.images.data<float>()[2 * i + 1], -static_cast<float>(l[i]));
      }
      labels.push_back(l);
    }
    const std::vector<std::vector<int32_t>> want = {
        {0, 2}, {}, {20, 21, 22, 23}, {30, 31, 32, 33}, {40, 41, 42, 43}, {50, 51, 52, 53}};
    EXPECT_EQ(labels, want) << threads << " thread(s)";
    EXPECT_EQ(skipped, 6);
  }
}

TEST(Loader, StopsCleanlyWhileWorkersWait) {
  std::atomic<int> produced{0};
  {
    BatchLoader loader = MakeLoader(4, 2, 3, 1000000, 3, &produced);
    loader.Start();
    Batch batch;
    ASSERT_TRUE(loader.Next(batch, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the ring fills up
  }  // the destructor joins the waiting workers
  // Only what fits in the ring was decoded: prefetch 2 ahead + the held one.
  EXPECT_LE(produced.load(), 3 * 3);
}

}  // namespace
}  // namespace cortado
