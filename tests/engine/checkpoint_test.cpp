#include "engine/io/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
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

Checkpoint OfRun(const Checkpoint& base, const std::string& run_id) {
  Checkpoint c = base;
  c.meta["run_id"] = run_id;
  return c;
}

// A shape that asks for more bytes than the file holds is refused before anything is
// allocated (found by the checkpoint fuzz target under ASan: a CRC-valid file declaring a
// 2 TB tensor).
TEST_F(CheckpointTest, AShapeLargerThanTheFileIsRefusedBeforeAllocating) {
  Checkpoint c;
  c.meta["iteration"] = "1";
  c.Add("param/w", Tensor({2}, DType::kF32));
  std::string file = SerializeCheckpoint(c);
  // Payload: u32 n_meta, meta, u32 n_tensors, str name, u8 dtype, u32 ndim, i64 dims...
  const std::string name = "param/w";
  const size_t at = file.find(name) + name.size() + 1 + 4;  // the first dimension
  const int64_t huge = int64_t{1} << 39;
  std::memcpy(&file[at], &huge, 8);
  const std::string payload = file.substr(24);
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  std::memcpy(&file[12], &crc, 4);
  try {
    ParseCheckpoint(file, "x.cortado");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'param/w' declares 2199023255552 bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CheckpointTest, ListNewestFirstAndPruneOnlyThisRun) {
  for (int it : {5, 100, 20}) {
    SaveCheckpoint(OfRun(Sample(), "ours"), (dir_ / CheckpointFileName(it)).string());
  }
  // Another run's newer files, one without a run id (older Cortado), and a damaged one.
  SaveCheckpoint(OfRun(Sample(), "theirs"), (dir_ / CheckpointFileName(200)).string());
  SaveCheckpoint(Sample(), (dir_ / CheckpointFileName(300)).string());
  std::ofstream(dir_ / CheckpointFileName(400)) << "damaged";
  std::vector<std::string> all = ListCheckpoints(dir_.string());
  ASSERT_EQ(all.size(), 6u);
  EXPECT_NE(all[0].find(CheckpointFileName(400)), std::string::npos);
  EXPECT_NE(all[5].find(CheckpointFileName(5)), std::string::npos);
  PruneCheckpoints(dir_.string(), 2, "ours");
  all = ListCheckpoints(dir_.string());
  ASSERT_EQ(all.size(), 5u);  // only ours at 5 went
  for (int it : {400, 300, 200, 100, 20}) {
    EXPECT_TRUE(fs::exists(dir_ / CheckpointFileName(it))) << it;
  }
}

// Past 10^8 iterations the names grow a digit ("ckpt-100000000" sorts before "ckpt-99999999"
// as text): the order, what --resume auto takes and what pruning keeps follow the number.
TEST_F(CheckpointTest, NamesPastTenToTheEighthSortByIteration) {
  for (int64_t it : {99999999LL, 100000000LL, 100000010LL, 7LL}) {
    SaveCheckpoint(OfRun(Sample(), "ours"), (dir_ / CheckpointFileName(it)).string());
  }
  // Not a checkpoint name, though it starts like one: never listed.
  std::ofstream(dir_ / "ckpt-latest.cortado") << "x";
  std::vector<std::string> all = ListCheckpoints(dir_.string());
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(fs::path(all[0]).filename(), CheckpointFileName(100000010));
  EXPECT_EQ(fs::path(all[1]).filename(), CheckpointFileName(100000000));
  EXPECT_EQ(fs::path(all[2]).filename(), CheckpointFileName(99999999));
  EXPECT_EQ(fs::path(all[3]).filename(), CheckpointFileName(7));
  Checkpoint newest;
  EXPECT_EQ(fs::path(NewestLoadableCheckpoint(dir_.string(), &newest)).filename(),
            CheckpointFileName(100000010));
  PruneCheckpoints(dir_.string(), 2, "ours");
  EXPECT_TRUE(fs::exists(dir_ / CheckpointFileName(100000010)));
  EXPECT_TRUE(fs::exists(dir_ / CheckpointFileName(100000000)));
  EXPECT_FALSE(fs::exists(dir_ / CheckpointFileName(99999999)));
  EXPECT_FALSE(fs::exists(dir_ / CheckpointFileName(7)));
}

TEST_F(CheckpointTest, MetaIsReadWithoutTheTensors) {
  Checkpoint c = OfRun(Sample(), "abc");
  c.meta["config"] = std::string(300000, 'y');  // metadata longer than the first read
  Tensor big({1 << 20}, DType::kF32);
  big.Fill(1.0f);
  c.Add("param/big", big);
  const std::string path = (dir_ / CheckpointFileName(7)).string();
  SaveCheckpoint(c, path);
  auto meta = ReadCheckpointMeta(path);
  EXPECT_EQ(meta.at("run_id"), "abc");
  EXPECT_EQ(meta.at("config").size(), 300000u);
  // Damage in the tensors does not stop the metadata from being read; damage in the
  // metadata does.
  fs::resize_file(path, fs::file_size(path) - 1000);
  EXPECT_EQ(ReadCheckpointMeta(path).at("run_id"), "abc");
  fs::resize_file(path, 1000);
  EXPECT_THROW(ReadCheckpointMeta(path), Error);
  std::ofstream(dir_ / "x.cortado") << "hello";
  EXPECT_THROW(ReadCheckpointMeta((dir_ / "x.cortado").string()), Error);
}

// A process killed (SIGKILL) at any point of writing a checkpoint leaves the previous one
// loadable, and what --resume auto picks (NewestLoadableCheckpoint) is a complete checkpoint:
// the old one, or the new one once it was renamed into place.
TEST_F(CheckpointTest, KilledWhileWritingLeavesTheLastCheckpoint) {
  Checkpoint base = Sample();
  Tensor big({5 << 20}, DType::kF32);  // 20 MiB: written in several pieces
  for (int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] = static_cast<float>(i % 977);
  base.Add("param/big", big);
  const std::string old_path = (dir_ / CheckpointFileName(10)).string();
  const std::string new_path = (dir_ / CheckpointFileName(20)).string();
  SaveCheckpoint(OfRun(base, "r"), old_path);
  const size_t size = fs::file_size(old_path);
  struct Point {
    const char* stage;
    size_t offset;
    bool new_survives;
  };
  const Point points[] = {
      {"write", 0, false},    {"write", size_t{8} << 20, false}, {"write", size_t{16} << 20, false},
      {"fsync", size, false}, {"rename", size, false},           {"renamed", size, true}};
  for (const Point& p : points) {
    SCOPED_TRACE(std::string(p.stage) + " at " + std::to_string(p.offset));
    fs::remove(new_path);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      SetCheckpointWriteHookForTesting([p](const char* stage, size_t offset) {
        if (std::string(stage) == p.stage && offset == p.offset) ::raise(SIGKILL);
        return 0;
      });
      Checkpoint next = OfRun(base, "r");
      next.meta["iteration"] = "20";
      SaveCheckpoint(next, new_path);
      ::_exit(0);  // the kill point was not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    EXPECT_EQ(fs::exists(new_path), p.new_survives);
    Checkpoint resumed;
    const std::string picked = NewestLoadableCheckpoint(dir_.string(), &resumed);
    EXPECT_EQ(picked, p.new_survives ? new_path : old_path);
    EXPECT_EQ(resumed.MetaInt("iteration"), p.new_survives ? 20 : 42);
    ASSERT_NE(resumed.Find("param/big"), nullptr);
    EXPECT_EQ(resumed.Find("param/big")->data<float>()[(5 << 20) - 1],
              static_cast<float>(((5 << 20) - 1) % 977));
    EXPECT_NO_THROW(LoadCheckpoint(old_path));
  }
}

// A full disk (ENOSPC) or a failing fsync: an error naming the file and the reason, no
// temporary file left, the previous checkpoint untouched.
TEST_F(CheckpointTest, FailedWriteNamesTheFileAndKeepsThePrevious) {
  const std::string old_path = (dir_ / CheckpointFileName(10)).string();
  SaveCheckpoint(OfRun(Sample(), "r"), old_path);
  for (const char* stage : {"write", "fsync", "rename"}) {
    SCOPED_TRACE(stage);
    SetCheckpointWriteHookForTesting(
        [stage](const char* at, size_t) { return std::string(at) == stage ? ENOSPC : 0; });
    std::string message;
    try {
      SaveCheckpoint(OfRun(Sample(), "r"), (dir_ / CheckpointFileName(20)).string());
    } catch (const Error& e) {
      message = e.what();
    }
    SetCheckpointWriteHookForTesting(nullptr);
    EXPECT_NE(message.find(CheckpointFileName(20)), std::string::npos) << message;
    EXPECT_NE(message.find(std::strerror(ENOSPC)), std::string::npos) << message;
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
    EXPECT_EQ(files, 1);
    EXPECT_NO_THROW(LoadCheckpoint(old_path));
  }
}

}  // namespace
}  // namespace cortado
