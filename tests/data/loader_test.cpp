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
  auto produce = [=](int, int64_t b, int64_t pos, int64_t sample,
                     const BatchLoader::SampleOut& out) {
    if (sample == fail_at) Fail("cannot decode sample ", sample);
    // Uneven work, so workers finish out of order.
    if (KeyToUniform(static_cast<uint64_t>(sample)) < 0.2) {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
    out.image[0] = static_cast<float>(sample);
    out.image[1] = static_cast<float>(b);
    *out.label = static_cast<int32_t>(pos);
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
  auto produce = [](int, int64_t b, int64_t, int64_t sample, const BatchLoader::SampleOut& out) {
    out.image[0] = static_cast<float>(sample);
    out.image[1] = -static_cast<float>(sample);
    *out.label = static_cast<int32_t>(sample);
    const bool left_out = b == 1 || (b == 0 && sample % 2 == 1);
    return BatchLoader::Produced{left_out ? 1 : 0, left_out};
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

// Rows (detection's objects): each sample yields its own number of rows; a batch delivers them
// all as one (1, 1, G, width + 1) tensor in position order, each prefixed by its sample's
// position in the delivered batch, after left-out positions are removed. G may be 0. The
// per-sample info moves up with its sample as the labels do.
TEST(Loader, RowsOfEachSampleBecomeOneTensorPrefixedByItemId) {
  // Sample s = 10 b + p yields s % 4 rows [s, k]; batch 2 yields none; sample 31 is left out.
  auto plan = [](int64_t b, std::vector<int64_t>* samples) {
    if (b >= 5) return;
    for (int64_t p = 0; p < 3; ++p) samples->push_back(10 * b + p);
  };
  auto produce = [](int, int64_t b, int64_t, int64_t sample, const BatchLoader::SampleOut& out) {
    EXPECT_TRUE(out.rows != nullptr && out.rows->empty());
    out.image[0] = static_cast<float>(sample);
    const int64_t n = b == 2 ? 0 : sample % 4;
    for (int64_t k = 0; k < n; ++k) out.rows->insert(out.rows->end(), {float(sample), float(k)});
    *out.label = static_cast<int32_t>(n);
    out.info[0] = static_cast<int32_t>(sample);  // moved up with its sample when one is left out
    out.info[1] = static_cast<int32_t>(-sample);
    if (KeyToUniform(static_cast<uint64_t>(sample)) < 0.3) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // finish out of order
    }
    return BatchLoader::Produced{sample == 31 ? 1 : 0, sample == 31};
  };
  for (int threads : {1, 2, 5}) {
    BatchLoader loader(threads, 2, 3, Shape{1}, plan, produce, BatchLoader::Extras{2, 2});
    for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the slots' row buffers
      loader.Start();
      Batch batch;
      int64_t b = 0;
      while (loader.Next(batch, nullptr)) {
        ASSERT_EQ(batch.boxes.ndim(), 4);
        ASSERT_EQ(batch.boxes.dim(0), 1);
        ASSERT_EQ(batch.boxes.dim(1), 1);
        ASSERT_EQ(batch.boxes.dim(3), 3);
        // What the rows should be: every kept sample's, in order, with its new position.
        std::vector<float> want;
        int64_t item = 0;
        for (int64_t p = 0; p < 3; ++p) {
          const int64_t sample = 10 * b + p;
          if (sample == 31) continue;
          const int64_t n = b == 2 ? 0 : sample % 4;
          for (int64_t k = 0; k < n; ++k)
            want.insert(want.end(), {float(item), float(sample), float(k)});
          EXPECT_EQ(batch.labels.data<int32_t>()[item], n);
          EXPECT_EQ(batch.info.data<int32_t>()[2 * item], sample);
          EXPECT_EQ(batch.info.data<int32_t>()[2 * item + 1], -sample);
          ++item;
        }
        ASSERT_EQ(batch.size, item);
        ASSERT_EQ(batch.info.shape(), (Shape{item, 2}));
        const float* got = batch.boxes.data<float>();
        EXPECT_EQ(std::vector<float>(got, got + batch.boxes.numel()), want)
            << "batch " << b << ", " << threads << " thread(s)";
        EXPECT_EQ(batch.boxes.dim(2), static_cast<int64_t>(want.size() / 3));
        ++b;
      }
      EXPECT_EQ(b, 5);
    }
  }
  // Without rows, batches carry no box tensor.
  std::atomic<int> produced{0};
  BatchLoader plain = MakeLoader(1, 1, 2, 1, 2, &produced);
  plain.Start();
  Batch batch;
  ASSERT_TRUE(plain.Next(batch, nullptr));
  EXPECT_FALSE(batch.boxes.defined());
  EXPECT_FALSE(batch.info.defined());
}

TEST(Loader, RowsThatAreNotWholeRowsAreAnError) {
  auto plan = [](int64_t b, std::vector<int64_t>* samples) {
    if (b == 0) samples->push_back(0);
  };
  auto produce = [](int, int64_t, int64_t, int64_t, const BatchLoader::SampleOut& out) {
    out.rows->assign(5, 0.0f);  // not a multiple of 2
    return BatchLoader::Produced{};
  };
  BatchLoader loader(1, 1, 1, Shape{1}, plan, produce, BatchLoader::Extras{2, 0});
  loader.Start();
  Batch batch;
  try {
    loader.Next(batch, nullptr);
    FAIL() << "accepted half a row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of 2"), std::string::npos) << e.what();
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
