// LMDB sources end to end: convert a folder, then train and evaluate from it. Checks shapes,
// labels, determinism across thread counts, resume, rank sharding, the short last evaluation
// batch, corrupt records (training: counted and replaced; evaluation: counted and left out),
// Caffe's raw BGR records, labels outside the class list, and databases that a conversion did
// not finish (refused).
#include "data/lmdb_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "data/annotated_datum.h"
#include "data/converter.h"
#include "data/datum.h"
#include "data/lmdb.h"
#include "engine/base/thread_pool.h"
#include "tests/data/test_images.h"
#include "tests/data/wire_format.h"

namespace cortado {
namespace {

using testing::CaffeRawDatum;
using testing::EncodeJpeg;
using testing::EncodeWithOpenCV;
using testing::MakeImage;
using testing::TempDir;
using testing::WriteFile;

std::vector<float> Floats(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}
std::vector<int32_t> Labels(const Batch& b) {
  const int32_t* p = b.labels.data<int32_t>();
  return std::vector<int32_t>(p, p + b.size);
}

class LmdbSourceTest : public ::testing::Test {
 protected:
  // 3 classes x 20 images of assorted sizes, grey and colour.
  static void SetUpTestSuite() {
    SetNumThreads(2);
    dir_ = new TempDir();
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 20; ++i) {
        const int w = 40 + (i * 13) % 70, h = 40 + (i * 29) % 60;
        const int channels = i % 7 == 3 ? 1 : 3;
        char name[64];
        std::snprintf(name, sizeof(name), "/images/class%d/%03d.JPEG", c, i);
        WriteFile(dir_->path() + name, EncodeJpeg(MakeImage(w, h, channels, c * 20 + i), 90));
      }
    }
    ConvertOptions o;
    o.root = *dir_ / "images";
    o.out = *dir_ / "db";
    ConvertImages(o);
  }
  static void TearDownTestSuite() { delete dir_; }

  static DataOptions Options() {
    DataOptions o;
    o.type = "lmdb";
    o.train = o.val = *dir_ / "db";
    o.batch_size = 8;
    o.crop = 32;
    o.val_resize = 36;
    o.threads = 2;
    o.prefetch = 2;
    o.flip = true;
    return o;
  }

  static TempDir* dir_;
};
TempDir* LmdbSourceTest::dir_ = nullptr;

TEST_F(LmdbSourceTest, TrainBatchesHaveTheRightShapeAndLabels) {
  auto source = MakeTrainSource(Options(), ShardSpec{}, 1);
  EXPECT_EQ(source->batch_size(), 8);
  EXPECT_EQ(source->sample_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(source->num_classes(), 3);
  EXPECT_EQ(source->batches_per_epoch(), 7);  // 60 / 8, tail dropped
  EXPECT_EQ(source->samples_per_epoch(), 56);
  Batch batch;
  std::map<int, int> per_class;
  for (int b = 0; b < 7; ++b) {  // one epoch
    ASSERT_TRUE(source->Next(batch));
    EXPECT_EQ(batch.images.shape(), (Shape{8, 3, 32, 32}));
    EXPECT_EQ(batch.size, 8);
    for (int32_t l : Labels(batch)) {
      ASSERT_GE(l, 0);
      ASSERT_LT(l, 3);
      per_class[l]++;
    }
    // Normalized with ImageNet's statistics: values of a natural range, not all equal.
    const std::vector<float> v = Floats(batch.images);
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    EXPECT_GT(*lo, -2.2f);
    EXPECT_LT(*hi, 2.7f);
    EXPECT_LT(*lo + 0.5f, *hi);
  }
  // 56 of the 60 records, roughly balanced.
  for (auto [label, count] : per_class) EXPECT_GE(count, 14) << "class " << label;
  EXPECT_EQ(source->stats().skipped_records, 0);
  EXPECT_GE(source->stats().wait_seconds, 0.0);
  // The decode threads account for their CPU time (the trainer reports it at the end).
  EXPECT_GE(source->stats().loader_threads, 1);
  EXPECT_GT(source->stats().loader_cpu_seconds, 0.0);
  EXPECT_LT(source->stats().loader_cpu_seconds, 60.0);
}

// With channels_last the sources write the same images channels-last (the net's layout): the
// same values at their NHWC places, the batch labeled NHWC; synthetic data alike, exactly.
TEST_F(LmdbSourceTest, ChannelsLastBatchesHoldTheSameImages) {
  DataOptions hwc = Options();
  hwc.channels_last = true;
  for (bool train : {true, false}) {
    auto planes =
        train ? MakeTrainSource(Options(), ShardSpec{}, 1) : MakeEvalSource(Options(), {});
    auto interleaved = train ? MakeTrainSource(hwc, ShardSpec{}, 1) : MakeEvalSource(hwc, {});
    Batch a, b;
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(planes->Next(a));
      ASSERT_TRUE(interleaved->Next(b));
      EXPECT_FALSE(a.images.channels_last());
      EXPECT_TRUE(b.images.channels_last());
      ASSERT_EQ(a.images.shape(), b.images.shape());
      const Tensor back = b.images.Reordered(MemoryFormat::kNCHW);
      for (int64_t k = 0; k < back.numel(); ++k) {
        const float want = a.images.data<float>()[k], got = back.data<float>()[k];
        // The same f32 formula, fused or not: NormalizeBound in transforms_test.cpp says why,
        // here with the default mean and std (the largest |mean / std| is 2.12).
        ASSERT_LE(std::fabs(got - want), std::ldexp(3 * std::fabs(want) + 2.2f, -23) + 1e-30f) << k;
      }
      EXPECT_EQ(Labels(a), Labels(b));
    }
  }
  DataOptions synthetic;
  synthetic.type = "synthetic";
  synthetic.batch_size = 4;
  synthetic.synthetic_shape = {3, 5, 7};
  DataOptions synthetic_hwc = synthetic;
  synthetic_hwc.channels_last = true;
  Batch a, b;
  ASSERT_TRUE(MakeTrainSource(synthetic, ShardSpec{}, 1)->Next(a));
  ASSERT_TRUE(MakeTrainSource(synthetic_hwc, ShardSpec{}, 1)->Next(b));
  EXPECT_TRUE(b.images.channels_last());
  const Tensor back = b.images.Reordered(MemoryFormat::kNCHW);
  EXPECT_EQ(0, std::memcmp(back.raw_data(), a.images.raw_data(), back.nbytes()));
}

TEST_F(LmdbSourceTest, SameBatchesWhateverTheThreadCountAndAfterResume) {
  DataOptions one = Options(), many = Options();
  one.threads = 1;
  many.threads = 2;
  many.prefetch = 5;
  auto a = MakeTrainSource(one, ShardSpec{}, 42);
  auto b = MakeTrainSource(many, ShardSpec{}, 42);
  Batch x, y;
  std::vector<std::vector<float>> stream;
  a->Start(0, 0);
  b->Start(0, 0);
  for (int i = 0; i < 10; ++i) {  // crosses into epoch 1 at batch 7
    ASSERT_TRUE(a->Next(x));
    ASSERT_TRUE(b->Next(y));
    EXPECT_EQ(Floats(x.images), Floats(y.images)) << "batch " << i;
    EXPECT_EQ(Labels(x), Labels(y));
    stream.push_back(Floats(x.images));
  }
  // Resuming at epoch 1, batch 1 continues exactly where batch 8 of the stream was.
  auto c = MakeTrainSource(many, ShardSpec{}, 42);
  c->Start(1, 1);
  ASSERT_TRUE(c->Next(x));
  EXPECT_EQ(Floats(x.images), stream[8]);
  ASSERT_TRUE(c->Next(x));
  EXPECT_EQ(Floats(x.images), stream[9]);
  // Another seed, other batches.
  auto d = MakeTrainSource(one, ShardSpec{}, 43);
  ASSERT_TRUE(d->Next(x));
  EXPECT_NE(Floats(x.images), stream[0]);
}

TEST_F(LmdbSourceTest, RanksSplitTheEpoch) {
  DataOptions o = Options();
  o.batch_size = 5;
  o.flip = false;
  o.scale_min = o.scale_max = 1.0;  // whole-image crops, so identical records look identical
  o.ratio_min = 0.1;
  o.ratio_max = 10;
  // Each record's training image, keyed by its bytes, from an unsharded, unshuffled pass.
  o.shuffle = false;
  auto all = MakeTrainSource(o, ShardSpec{0, 1}, 3);
  std::set<std::vector<float>> everything;
  Batch batch;
  for (int b = 0; b < 12; ++b) {
    ASSERT_TRUE(all->Next(batch));
    for (int64_t i = 0; i < batch.size; ++i) {
      const float* p = batch.images.data<float>() + i * 3 * 32 * 32;
      everything.insert(std::vector<float>(p, p + 3 * 32 * 32));
    }
  }
  ASSERT_EQ(everything.size(), 60u);
  o.shuffle = true;
  std::set<std::vector<float>> seen;
  for (int rank = 0; rank < 3; ++rank) {
    auto source = MakeTrainSource(o, ShardSpec{rank, 3}, 3);
    EXPECT_EQ(source->batches_per_epoch(), 4);  // 60 / (5 * 3)
    for (int b = 0; b < 4; ++b) {
      ASSERT_TRUE(source->Next(batch));
      for (int64_t i = 0; i < batch.size; ++i) {
        const float* p = batch.images.data<float>() + i * 3 * 32 * 32;
        std::vector<float> img(p, p + 3 * 32 * 32);
        EXPECT_TRUE(everything.count(img));
        EXPECT_TRUE(seen.insert(img).second) << "a record on two ranks";
      }
    }
  }
  EXPECT_EQ(seen.size(), 60u);
}

TEST_F(LmdbSourceTest, EvaluationIsOnePassWithAShortLastBatch) {
  DataOptions o = Options();
  o.val_batch_size = 16;
  std::map<int, int> per_class;
  int64_t total = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto source = MakeEvalSource(o, ShardSpec{rank, 2});
    EXPECT_EQ(source->samples_per_epoch(), 30);
    EXPECT_EQ(source->batches_per_epoch(), 2);
    Batch batch;
    std::vector<int64_t> sizes;
    std::vector<float> first;
    while (source->Next(batch)) {
      sizes.push_back(batch.size);
      EXPECT_EQ(batch.images.dim(0), batch.size);
      if (first.empty()) first = Floats(batch.images);
      for (int32_t l : Labels(batch)) per_class[l]++;
      total += batch.size;
    }
    EXPECT_EQ(sizes, (std::vector<int64_t>{16, 14}));
    // Rewinds, and the validation transform has no randomness.
    source->Start(0, 0);
    ASSERT_TRUE(source->Next(batch));
    EXPECT_EQ(Floats(batch.images), first);
  }
  EXPECT_EQ(total, 60);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(per_class[c], 20);
}

// A database written record by record: good JPEGs with corrupt ones at 3 and 6.
class CorruptRecordsTest : public LmdbSourceTest {
 protected:
  static std::string Database() {
    const std::string db = *dir_ / "db_corrupt";
    if (std::filesystem::exists(db)) return db;
    std::filesystem::create_directories(db);
    LmdbWriter writer(db);
    for (int i = 0; i < 10; ++i) {
      DatumFields f;
      f.label = i % 2;
      f.encoded = true;
      f.channels = 3;
      std::string value;
      if (i == 3) {
        const std::string jpeg = EncodeJpeg(MakeImage(40, 40, 3, i), 90);
        value = SerializeDatum(f, jpeg.substr(0, 50));  // truncated inside the header
      } else if (i == 6) {
        value = "\xff\xff\xff garbage, not a protobuf";
      } else {
        value = SerializeDatum(f, EncodeJpeg(MakeImage(40 + i, 40, 3, i), 90));
      }
      char key[16];
      std::snprintf(key, sizeof(key), "%08d_x", i);
      writer.Put(key, value);
    }
    writer.Close();
    return db;
  }
  static DataOptions CorruptOptions() {
    DataOptions o = Options();
    o.train = o.val = Database();
    o.batch_size = 5;
    o.shuffle = false;
    return o;
  }
};

// Training keeps its batch size and step count: a corrupt record is replaced by the next one,
// and counted.
TEST_F(CorruptRecordsTest, TrainingReplacesThemAndCountsThem) {
  auto train = MakeTrainSource(CorruptOptions(), ShardSpec{}, 1);
  EXPECT_EQ(train->num_classes(), -1);  // no classes.txt
  Batch batch;
  for (int b = 0; b < 4; ++b) {
    ASSERT_TRUE(train->Next(batch));
    EXPECT_EQ(batch.size, 5);
    // Record 3 (label 1, position 3 of the first batch of each epoch) was replaced by record 4
    // (label 0).
    if (b % 2 == 0) {
      EXPECT_EQ(Labels(batch), (std::vector<int32_t>{0, 1, 0, 0, 0}));
    }
  }
  EXPECT_EQ(train->stats().skipped_records, 4);  // two per epoch, two epochs
}

// Evaluation scores every readable record exactly once and leaves the corrupt ones out (a
// substitute would be scored twice, on several ranks often a record of another rank's shard);
// they are counted and their keys named in a warning.
TEST_F(CorruptRecordsTest, EvaluationLeavesThemOutAndNamesThem) {
  // The labels of the records a pass must score, record by record: 0 1 2 4 5 7 8 9.
  const std::vector<int32_t> readable = {0, 1, 0, 0, 1, 1, 0, 1};
  ::testing::internal::CaptureStderr();
  auto eval = MakeEvalSource(CorruptOptions(), ShardSpec{});
  std::vector<int64_t> sizes;
  std::vector<int32_t> labels;
  std::vector<std::vector<float>> images;
  Batch batch;
  const int plane = 3 * 32 * 32;
  while (eval->Next(batch)) {
    sizes.push_back(batch.size);
    EXPECT_EQ(batch.images.dim(0), batch.size);
    for (int32_t l : Labels(batch)) labels.push_back(l);
    const std::vector<float> v = Floats(batch.images);
    for (int64_t i = 0; i < batch.size; ++i) {
      images.emplace_back(v.begin() + i * plane, v.begin() + (i + 1) * plane);
    }
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(labels, readable);
  EXPECT_EQ(std::set<std::vector<float>>(images.begin(), images.end()).size(), images.size())
      << "a record was scored twice";
  EXPECT_EQ(eval->stats().skipped_records, 2);
  EXPECT_NE(log.find("'00000003_x'"), std::string::npos) << log;
  EXPECT_NE(log.find("'00000006_x'"), std::string::npos) << log;
  EXPECT_NE(log.find("left out of the evaluation"), std::string::npos) << log;
  // A second pass counts them again, without repeating the warnings.
  ::testing::internal::CaptureStderr();
  eval->Start(0, 0);
  int64_t images_again = 0;
  while (eval->Next(batch)) images_again += batch.size;
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("00000003_x"), std::string::npos);
  EXPECT_EQ(images_again, 8);
  EXPECT_EQ(eval->stats().skipped_records, 4);

  // Two ranks: rank 0 has records 0 2 4 6 8, rank 1 has 1 3 5 7 9; each scores its own
  // readable ones, and together they score the eight once.
  int64_t total = 0, skipped = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto shard = MakeEvalSource(CorruptOptions(), ShardSpec{rank, 2});
    while (shard->Next(batch)) total += batch.size;
    EXPECT_EQ(shard->stats().skipped_records, 1) << "rank " << rank;
    skipped += shard->stats().skipped_records;
  }
  EXPECT_EQ(total, 8);
  EXPECT_EQ(skipped, 2);
}

// A batch whose records are all unreadable comes out empty, and the pass goes on.
TEST_F(CorruptRecordsTest, AnEvaluationBatchOfUnreadableRecordsIsEmpty) {
  DataOptions o = CorruptOptions();
  o.val_batch_size = 1;
  auto eval = MakeEvalSource(o, ShardSpec{});
  std::vector<int64_t> sizes;
  Batch batch;
  while (eval->Next(batch)) sizes.push_back(batch.size);
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 1, 1, 0, 1, 1, 0, 1, 1, 1}));
}

// Caffe's own records: raw uint8 BGR planes (encoded=false). They must give exactly what the
// same pixels stored losslessly as an encoded PNG give.
TEST_F(LmdbSourceTest, ReadsCaffeRawRecords) {
  const std::string raw_db = *dir_ / "db_raw", png_db = *dir_ / "db_png";
  std::filesystem::create_directories(raw_db);
  std::filesystem::create_directories(png_db);
  {
    LmdbWriter raw(raw_db), png(png_db);
    for (int i = 0; i < 6; ++i) {
      const int channels = i == 2 ? 1 : 3;
      const ImageU8 img = MakeImage(50 + 3 * i, 45, channels, i);
      std::string planes(static_cast<size_t>(channels) * img.width * img.height, '\0');
      const size_t hw = static_cast<size_t>(img.width) * img.height;
      for (size_t p = 0; p < hw; ++p) {
        for (int c = 0; c < channels; ++c) {
          // BGR planes: plane 0 is blue (RGB channel 2).
          const int src = channels == 3 ? 2 - c : 0;
          planes[c * hw + p] = static_cast<char>(img.pixels[p * channels + src]);
        }
      }
      char key[16];
      std::snprintf(key, sizeof(key), "%08d", i);
      raw.Put(key, CaffeRawDatum(channels, img.height, img.width, planes, i % 3));
      DatumFields f;
      f.encoded = true;
      f.label = i % 3;
      png.Put(key, SerializeDatum(f, EncodeWithOpenCV(img, ".png")));
    }
    raw.Close();
    png.Close();
  }
  for (bool train : {false, true}) {
    DataOptions o = Options();
    o.batch_size = 6;
    o.train = o.val = raw_db;
    auto a = train ? MakeTrainSource(o, ShardSpec{}, 5) : MakeEvalSource(o, ShardSpec{});
    o.train = o.val = png_db;
    auto b = train ? MakeTrainSource(o, ShardSpec{}, 5) : MakeEvalSource(o, ShardSpec{});
    Batch x, y;
    ASSERT_TRUE(a->Next(x));
    ASSERT_TRUE(b->Next(y));
    EXPECT_EQ(Floats(x.images), Floats(y.images)) << (train ? "train" : "val");
    EXPECT_EQ(Labels(x), Labels(y));
    EXPECT_EQ(a->stats().skipped_records, 0);
  }
}

TEST_F(LmdbSourceTest, LabelOutsideTheClassListStopsTraining) {
  const std::string db = *dir_ / "db_badlabel";
  std::filesystem::create_directories(db);
  {
    LmdbWriter writer(db);
    DatumFields f;
    f.encoded = true;
    f.label = 5;
    writer.Put("00000000_a", SerializeDatum(f, EncodeJpeg(MakeImage(40, 40, 3), 90)));
    writer.Close();
  }
  WriteFile(db + "/classes.txt", "a\nb\n");
  LmdbCompletion done;
  done.records = 1;
  WriteLmdbCompletion(db, done);
  DataOptions o = Options();
  o.val = db;
  auto eval = MakeEvalSource(o, ShardSpec{});
  EXPECT_EQ(eval->num_classes(), 2);
  Batch batch;
  try {
    eval->Next(batch);
    FAIL() << "label 5 of 2 classes must stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 5"), std::string::npos) << e.what();
  }
}

// A database that `cortado convert` did not finish (here: its completion record removed, as a
// conversion killed before the fix left it at --out) is refused with one line naming it and the
// command that rebuilds it; so is one whose record count disagrees with its completion record.
// Databases of other tools (no classes.txt, no completion record) are read: see
// ReadsCaffeRawRecords.
TEST_F(LmdbSourceTest, RefusesADatabaseWithoutItsCompletionRecord) {
  ConvertOptions c;
  c.root = *dir_ / "images";
  c.out = *dir_ / "db_unfinished";
  c.resize_width = c.resize_height = 40;
  ConvertImages(c);
  const std::string complete = c.out + "/" + kLmdbCompleteFile;
  const std::string record = testing::ReadFileBytes(complete);
  ASSERT_FALSE(record.empty());
  DataOptions o = Options();
  o.train = o.val = c.out;
  EXPECT_NO_THROW(MakeTrainSource(o, ShardSpec{}, 1));

  std::filesystem::remove(complete);
  for (bool train : {true, false}) {
    try {
      if (train) {
        MakeTrainSource(o, ShardSpec{}, 1);
      } else {
        MakeEvalSource(o, ShardSpec{});
      }
      FAIL() << "a database without its completion record must be refused";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("LMDB " + c.out + " is incomplete"), std::string::npos) << what;
      EXPECT_NE(what.find("cortado convert --root IMAGES --out " + c.out + " --overwrite"),
                std::string::npos)
          << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line";
    }
  }

  WriteFile(complete, record);
  const std::optional<LmdbCompletion> read = ReadLmdbCompletion(c.out);
  ASSERT_TRUE(read.has_value());
  LmdbCompletion wrong = *read;
  EXPECT_EQ(wrong.records, 60);
  wrong.records = 61;
  WriteLmdbCompletion(c.out, wrong);
  try {
    MakeEvalSource(o, ShardSpec{});
    FAIL() << "a record count that disagrees with the completion record must be refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("holds 60 records but its cortado-complete.json says 61"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("--root " + wrong.root + " --out " + c.out + " --overwrite"),
              std::string::npos)
        << what;
  }
}

TEST_F(LmdbSourceTest, OneEnvironmentPerDatabaseInAProcess) {
  // LMDB forbids opening one environment twice in a process; sources share the reader.
  auto a = LmdbReader::Open(*dir_ / "db");
  auto b = LmdbReader::Open(*dir_ / "images/../db");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->size(), 60);
  EXPECT_EQ(a->key(0), "00000000_class0/000.JPEG");
  a.reset();
  b.reset();
  auto c = LmdbReader::Open(*dir_ / "db");  // reopened once nobody held it
  EXPECT_EQ(c->size(), 60);
}

TEST_F(LmdbSourceTest, ConfigErrorsNameTheKey) {
  DataOptions o = Options();
  o.train = *dir_ / "no_such_db";
  EXPECT_THROW(MakeTrainSource(o, ShardSpec{}, 1), Error);
  o = Options();
  o.mean = {0.5, 0.5};
  try {
    MakeTrainSource(o, ShardSpec{}, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.mean"), std::string::npos) << e.what();
  }
  o = Options();
  o.val_resize = 16;  // below the crop
  EXPECT_THROW(MakeEvalSource(o, ShardSpec{}), Error);
}

// Detection sources: a VOC set converted here, read as SSD trains and evaluates on it.
class DetectionSourceTest : public ::testing::Test {
 protected:
  // 30 images of assorted sizes, each with 0..3 objects of classes a, b, c (some difficult).
  static void SetUpTestSuite() {
    SetNumThreads(2);
    dir_ = new TempDir();
    const std::string root = *dir_ / "VOC";
    std::string list;
    const char* const kNames[3] = {"a", "b", "c"};
    for (int i = 0; i < 30; ++i) {
      const int w = 40 + (i * 13) % 50, h = 30 + (i * 7) % 40;
      const std::string id = StrCat("img", i);
      WriteFile(root + "/JPEGImages/" + id + ".jpg", EncodeJpeg(MakeImage(w, h, 3, i), 90));
      std::string xml =
          StrCat("<annotation><size><width>", w, "</width><height>", h, "</height></size>");
      for (int k = 0; k < i % 4; ++k) {
        const int x0 = 1 + (k * 9 + i) % (w / 2), y0 = 1 + (k * 5 + i) % (h / 2);
        xml += StrCat("<object><name>", kNames[(i + k) % 3], "</name><difficult>",
                      (i + k) % 5 == 0 ? 1 : 0, "</difficult><bndbox><xmin>", x0, "</xmin><ymin>",
                      y0, "</ymin><xmax>", x0 + w / 3, "</xmax><ymax>", y0 + h / 3,
                      "</ymax></bndbox></object>");
      }
      WriteFile(root + "/Annotations/" + id + ".xml", xml + "</annotation>");
      list += id + "\n";
    }
    WriteFile(root + "/ImageSets/Main/trainval.txt", list);
    ConvertOptions o;
    o.root = root;
    o.split = "trainval";
    o.out = *dir_ / "db";
    ConvertImages(o);
  }
  static void TearDownTestSuite() { delete dir_; }

  static DataOptions Options() {
    DataOptions o;
    o.type = "lmdb";
    o.task = "detection";
    o.train = o.val = *dir_ / "db";
    o.batch_size = 4;
    o.resize = 48;
    o.threads = 2;
    o.prefetch = 2;
    o.flip = true;
    return o;
  }

  // A batch's images and boxes, copied (the source reuses its buffers).
  struct Copy {
    std::vector<float> images, boxes;
    std::vector<int32_t> counts;
  };
  static Copy CopyOf(const Batch& b) { return Copy{Floats(b.images), Floats(b.boxes), Labels(b)}; }

  // The image number i of record `record` (keys sort as "000000NN_VOC/JPEGImages/img<i>.jpg").
  static int RecordImage(int64_t record) {
    static const std::vector<int> images = [] {
      LmdbReader reader(*dir_ / "db");
      std::vector<int> out;
      for (int64_t r = 0; r < reader.size(); ++r) {
        const std::string key(reader.key(r));
        out.push_back(std::stoi(key.substr(key.rfind("img") + 3)));
      }
      return out;
    }();
    return images.at(static_cast<size_t>(record));
  }

  static TempDir* dir_;
};
TempDir* DetectionSourceTest::dir_ = nullptr;

TEST_F(DetectionSourceTest, TrainBatchesCarryTheirObjects) {
  auto source = MakeTrainSource(Options(), ShardSpec{}, 3);
  EXPECT_EQ(source->sample_shape(), (Shape{3, 48, 48}));
  EXPECT_EQ(source->num_classes(), 4);  // background, a, b, c
  EXPECT_EQ(source->batches_per_epoch(), 7);
  Batch batch;
  std::set<int64_t> object_counts;
  int64_t objects = 0, difficult = 0;
  for (int b = 0; b < 14; ++b) {  // two epochs
    ASSERT_TRUE(source->Next(batch));
    EXPECT_EQ(batch.images.shape(), (Shape{4, 3, 48, 48}));
    ASSERT_EQ(batch.boxes.ndim(), 4);
    ASSERT_EQ(batch.boxes.dim(3), 8);
    const int64_t g = batch.boxes.dim(2);
    object_counts.insert(g);
    // labels: the objects of each image; rows grouped by image in order.
    const std::vector<int32_t> counts = Labels(batch);
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), g);
    const float* r = batch.boxes.data<float>();
    std::vector<int32_t> seen(4, 0);
    for (int64_t i = 0; i < g; ++i, r += 8) {
      ASSERT_GE(r[0], 0);
      ASSERT_LT(r[0], 4);
      if (i > 0) {
        ASSERT_GE(r[0], r[-8]) << "rows in item order";
      }
      ++seen[static_cast<size_t>(r[0])];
      EXPECT_GE(r[1], 1);
      EXPECT_LE(r[1], 3);
      EXPECT_GE(r[2], 0);  // instance id
      EXPECT_GE(r[3], 0.0f);
      EXPECT_GE(r[4], 0.0f);
      EXPECT_LE(r[5], 1.0f);
      EXPECT_LE(r[6], 1.0f);
      EXPECT_GT(r[5], r[3]);
      EXPECT_GT(r[6], r[4]);
      EXPECT_TRUE(r[7] == 0 || r[7] == 1);
      difficult += r[7] == 1;
    }
    EXPECT_EQ(seen, counts);
    objects += g;
    // info: the record and its stored size (img<i>: 40 + 13i % 50 wide, 30 + 7i % 40 high).
    ASSERT_EQ(batch.info.shape(), (Shape{4, 3}));
    for (int64_t item = 0; item < 4; ++item) {
      const int32_t* info = batch.info.data<int32_t>() + 3 * item;
      const int i = RecordImage(info[0]);
      EXPECT_EQ(info[1], 40 + (i * 13) % 50) << "record " << info[0];
      EXPECT_EQ(info[2], 30 + (i * 7) % 40) << "record " << info[0];
    }
  }
  EXPECT_GT(object_counts.size(), 2u) << "batches of different object counts";
  EXPECT_GT(objects, 20);
  EXPECT_GT(difficult, 0);
  EXPECT_EQ(source->stats().skipped_records, 0);
}

TEST_F(DetectionSourceTest, SameBatchesWhateverTheThreadCountAndAfterResume) {
  DataOptions one = Options(), many = Options();
  one.threads = 1;
  many.prefetch = 4;
  auto a = MakeTrainSource(one, ShardSpec{}, 11);
  auto b = MakeTrainSource(many, ShardSpec{}, 11);
  auto resumed = MakeTrainSource(many, ShardSpec{}, 11);
  resumed->Start(1, 2);  // epoch 1, batch 2
  Batch ba, bb, br;
  for (int i = 0; i < 7 + 4; ++i) {
    ASSERT_TRUE(a->Next(ba));
    ASSERT_TRUE(b->Next(bb));
    const Copy ca = CopyOf(ba), cb = CopyOf(bb);
    EXPECT_EQ(ca.images, cb.images) << "batch " << i;
    EXPECT_EQ(ca.boxes, cb.boxes) << "batch " << i;
    EXPECT_EQ(ca.counts, cb.counts) << "batch " << i;
    if (i >= 7 + 2) {
      ASSERT_TRUE(resumed->Next(br));
      EXPECT_EQ(Floats(br.boxes), ca.boxes) << "batch " << i;
      EXPECT_EQ(Floats(br.images), ca.images) << "batch " << i;
    }
  }
  // Another seed augments differently.
  auto c = MakeTrainSource(one, ShardSpec{}, 12);
  Batch bc;
  ASSERT_TRUE(c->Next(bc));
  a->Start(0, 0);
  ASSERT_TRUE(a->Next(ba));
  EXPECT_NE(Floats(bc.images), Floats(ba.images));
}

TEST_F(DetectionSourceTest, EvaluationGivesTheRecordedObjects) {
  // The records' objects, read directly.
  LmdbReader reader(*dir_ / "db");
  auto txn = reader.BeginRead();
  AnnotatedDatumParser parser;
  std::string why;
  std::vector<std::vector<BoxAnnotation>> recorded;
  for (int64_t i = 0; i < reader.size(); ++i) {
    const std::string_view r = txn.Get(i);
    ASSERT_TRUE(parser.Parse(r.data(), r.size(), &why)) << why;
    recorded.push_back(parser.boxes());
  }
  DataOptions o = Options();
  o.val_batch_size = 7;
  auto source = MakeEvalSource(o, ShardSpec{});
  Batch batch;
  int64_t record = 0;
  while (source->Next(batch)) {
    const float* r = batch.boxes.data<float>();
    for (int64_t item = 0; item < batch.size; ++item, ++record) {
      ASSERT_EQ(Labels(batch)[static_cast<size_t>(item)],
                static_cast<int32_t>(recorded[static_cast<size_t>(record)].size()));
      for (const BoxAnnotation& b : recorded[static_cast<size_t>(record)]) {
        const std::vector<float> want = {
            float(item), float(b.label), float(b.instance_id),   b.xmin, b.ymin,
            b.xmax,      b.ymax,         b.difficult ? 1.f : 0.f};
        EXPECT_EQ(std::vector<float>(r, r + 8), want) << "record " << record;
        r += 8;
      }
    }
    EXPECT_EQ(r, batch.boxes.data<float>() + batch.boxes.numel());
  }
  EXPECT_EQ(record, 30);
}

TEST_F(DetectionSourceTest, RefusesTheOtherTasksRecords) {
  DataOptions o = Options();
  o.task = "classification";
  try {
    MakeTrainSource(o, ShardSpec{}, 1);
    FAIL() << "read detection records as classification ones";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds detection records (Caffe SSD AnnotatedDatum) but "
                                         "data.task is classification; set data.task: detection"),
              std::string::npos)
        << e.what();
  }
}

// Caffe SSD's convert_annoset writes no completion record, label map or class list beside its
// records; raw (BGR) records are read too. data.label_map gives the classes; an object outside
// them stops the run.
TEST_F(DetectionSourceTest, ReadsCaffeSsdDatabasesWithALabelMap) {
  const std::string db = *dir_ / "caffe_ssd";
  std::filesystem::create_directories(db);
  {
    LmdbWriter writer(db);
    for (int i = 0; i < 6; ++i) {
      DatumFields f;
      f.channels = 3;
      f.height = 8;
      f.width = 10;
      f.label = -1;
      std::string planes(3 * 8 * 10, static_cast<char>(20 * i));
      const std::vector<BoxAnnotation> boxes = {
          BoxAnnotation{1 + i % 2, 0, 0.1f, 0.2f, 0.6f, 0.9f, false}};
      writer.Put(StrCat("0000000", i, "_VOC2007/JPEGImages/x.jpg"),
                 SerializeAnnotatedDatum(f, planes, boxes));
    }
    writer.Close();
  }
  WriteFile(*dir_ / "map.prototxt",
            "item { name: \"none_of_the_above\" label: 0 display_name: \"background\" }\n"
            "item { name: \"cat\" label: 1 }\nitem { name: \"dog\" label: 2 }\n");
  DataOptions o = Options();
  o.val = db;
  o.label_map = *dir_ / "map.prototxt";
  o.mean = {0};
  o.std = {1.0 / 255};
  auto source = MakeEvalSource(o, ShardSpec{});
  EXPECT_EQ(source->num_classes(), 3);
  Batch batch;
  ASSERT_TRUE(source->Next(batch));
  ASSERT_EQ(batch.size, 4);
  EXPECT_EQ(batch.boxes.dim(2), 4);
  EXPECT_EQ(batch.boxes.data<float>()[8 + 1], 2.0f);                  // record 1's label
  EXPECT_NEAR(batch.images.data<float>()[3 * 48 * 48], 20.0f, 0.5f);  // record 1's grey 20
  // A label map of one class: record 1's dog is outside it.
  WriteFile(*dir_ / "cats.prototxt", "item { name: \"cat\" label: 1 }\n");
  o.label_map = *dir_ / "cats.prototxt";
  auto wrong = MakeEvalSource(o, ShardSpec{});
  try {
    while (wrong->Next(batch)) {
    }
    FAIL() << "an object outside the label map was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has an object of label 2, outside 1..1"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(DetectionSourceTest, CorruptRecordsAreReplacedInTrainingAndLeftOutOfEvaluation) {
  const std::string db = *dir_ / "corrupt";
  std::filesystem::create_directories(db);
  {
    LmdbReader good(*dir_ / "db");
    auto txn = good.BeginRead();
    LmdbWriter writer(db);
    for (int64_t i = 0; i < 8; ++i) {
      // Records 2 and 5: an image that does not decode, and a box that is not one.
      std::string value(txn.Get(i));
      if (i == 2) value = SerializeAnnotatedDatum(DatumFields{3, 4, 4, -1, true}, "junk", {});
      if (i == 5) {
        value =
            SerializeAnnotatedDatum(DatumFields{3, 4, 4, -1, true}, EncodeJpeg(MakeImage(8, 8, 3)),
                                    {BoxAnnotation{1, 0, 0.5f, 0.5f, 0.1f, 0.9f, false}});
      }
      writer.Put(std::string(good.key(i)), value);
    }
    writer.Close();
  }
  DataOptions o = Options();
  o.train = o.val = db;
  o.val_batch_size = 8;
  auto eval = MakeEvalSource(o, ShardSpec{});
  Batch batch;
  ASSERT_TRUE(eval->Next(batch));
  EXPECT_EQ(batch.size, 6);
  // Item ids follow the images that remain: records 3, 4, 6, 7 are items 2, 3, 4, 5.
  const float* r = batch.boxes.data<float>();
  std::vector<int32_t> per_item(6, 0);
  for (int64_t i = 0; i < batch.boxes.dim(2); ++i) ++per_item[static_cast<size_t>(r[8 * i])];
  EXPECT_EQ(per_item, Labels(batch));
  EXPECT_EQ(per_item, (std::vector<int32_t>{0, 1, 3, 0, 2, 3}));  // records 0 1 3 4 6 7: i % 4
  std::vector<int32_t> records;
  for (int64_t item = 0; item < batch.size; ++item)
    records.push_back(batch.info.data<int32_t>()[3 * item]);
  EXPECT_EQ(records, (std::vector<int32_t>{0, 1, 3, 4, 6, 7}));
  EXPECT_EQ(eval->stats().skipped_records, 2);
  o.batch_size = 8;
  auto train = MakeTrainSource(o, ShardSpec{}, 1);
  ASSERT_TRUE(train->Next(batch));
  EXPECT_EQ(batch.size, 8);
  EXPECT_EQ(train->stats().skipped_records, 2);
}

}  // namespace
}  // namespace cortado
