#include "engine/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace cortado {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cortado_ckpt_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Checkpoint Sample() {
    Checkpoint c;
    c.meta["iteration"] = "42";
    c.meta["config"] = "seed: 1\n";
    Tensor w({2, 3}, DType::kF32);
    for (int i = 0; i < 6; ++i) w.data<float>()[i] = i * 0.5f;
    Tensor l({4}, DType::kI32);
    l.Fill(7);
    c.Add("param/w", w);
    c.Add("labels", l);
    return c;
  }
  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTrip) {
  std::string path = (dir_ / CheckpointFileName(42)).string();
  SaveCheckpoint(Sample(), path);
  Checkpoint c = LoadCheckpoint(path);
  EXPECT_EQ(c.MetaInt("iteration"), 42);
  EXPECT_EQ(c.Meta("config"), "seed: 1\n");
  ASSERT_NE(c.Find("param/w"), nullptr);
  EXPECT_EQ(c.Find("param/w")->shape(), (Shape{2, 3}));
  EXPECT_EQ(c.Find("param/w")->data<float>()[5], 2.5f);
  EXPECT_EQ(c.Find("labels")->data<int32_t>()[3], 7);
  // No temporary file is left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

std::string ErrorLoading(const std::string& path) {
  try {
    LoadCheckpoint(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(CheckpointTest, TruncatedAndCorruptAreRefused) {
  std::string path = (dir_ / "a.cortado").string();
  SaveCheckpoint(Sample(), path);
  auto size = fs::file_size(path);
  fs::copy_file(path, dir_ / "b.cortado");
  fs::resize_file(dir_ / "b.cortado", size - 5);
  EXPECT_NE(ErrorLoading((dir_ / "b.cortado").string()).find("truncated"), std::string::npos);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 3));
    f.put('\x55');
  }
  EXPECT_NE(ErrorLoading(path).find("CRC mismatch"), std::string::npos);
  std::ofstream(dir_ / "c.cortado") << "hello";
  EXPECT_NE(ErrorLoading((dir_ / "c.cortado").string()).find("not a Cortado checkpoint"),
            std::string::npos);
  EXPECT_NE(ErrorLoading((dir_ / "missing").string()).find("cannot open"), std::string::npos);
}

TEST_F(CheckpointTest, ListNewestFirstAndPrune) {
  for (int it : {5, 100, 20}) SaveCheckpoint(Sample(), (dir_ / CheckpointFileName(it)).string());
  std::vector<std::string> all = ListCheckpoints(dir_.string());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_NE(all[0].find(CheckpointFileName(100)), std::string::npos);
  EXPECT_NE(all[2].find(CheckpointFileName(5)), std::string::npos);
  PruneCheckpoints(dir_.string(), 2);
  all = ListCheckpoints(dir_.string());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_NE(all[1].find(CheckpointFileName(20)), std::string::npos);
}

}  // namespace
}  // namespace cortado
