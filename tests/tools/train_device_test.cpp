// `cortado train --device`: the guarded test device trains LeNet on Fashion-MNIST through the
// device code path with the CPU's losses, and a device that cannot be used (unknown, absent, or
// past the last device for a rank of a data-parallel job) stops the run with one line saying why.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "engine/tensor/device_runtime.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tools/trainer.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;

const char* kFashion = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

struct Result {
  int code = -1;
  std::string err, out;
};

Result Cortado(const std::string& args) {
  const std::string bin = std::string(CORTADO_BINARY_DIR) + "/tools/cortado";
  const std::string base =
      fs::temp_directory_path() / ("cortado_device_" + std::to_string(getpid()));
  const int status =
      std::system((bin + " " + args + " >" + base + ".out 2>" + base + ".err").c_str());
  Result r;
  r.err = testing::ReadFileBytes(base + ".err");
  r.out = testing::ReadFileBytes(base + ".out");
  fs::remove(base + ".err");
  fs::remove(base + ".out");
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The "loss" values of a metrics file's train records, in order.
std::vector<std::string> TrainLosses(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<std::string> out;
  static const std::regex loss("\"loss\":([-0-9.e+]+)");
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"train\"") == std::string::npos) continue;
    std::smatch m;
    if (std::regex_search(line, m, loss)) out.push_back(m[1]);
  }
  return out;
}

class TrainOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kFashion))
      GTEST_SKIP() << "Fashion-MNIST is not installed (" << kFashion << ")";
    dir_ = fs::temp_directory_path() / ("cortado_train_device_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Six iterations of configs/fashion_lenet.yaml on `device`, at batch 16 (the test device's
  // convolutions are reference bodies, one sum per element: slow on purpose); returns its train
  // losses.
  std::vector<std::string> Train(const std::string& device) {
    const fs::path metrics = dir_ / (device + ".jsonl");
    const Result r = Cortado(
        "train --config " + std::string(CORTADO_SOURCE_DIR) + "/configs/fashion_lenet.yaml" +
        " --device " + device + " --threads 1 --no-progress --stop-at-iter 6 --metrics " +
        metrics.string() + " --set log.interval=1 --set data.batch_size=16 --set checkpoint.dir=" +
        (dir_ / device).string());
    EXPECT_EQ(r.code, 130) << r.err;  // stopped at the iteration asked for, as documented
    return TrainLosses(metrics);
  }

  fs::path dir_;
};

TEST_F(TrainOnDevice, TheTestDeviceGivesTheCpusLosses) {
  const std::vector<std::string> cpu = Train("cpu");
  const std::vector<std::string> test = Train("test");
  ASSERT_EQ(cpu.size(), 6u);
  ASSERT_EQ(test.size(), cpu.size());
  // The test device's convolutions are reference bodies that add the CPU's terms in another
  // order (net_on_test_device_test.cpp bounds LeNet's trajectory the same way): equal in Release
  // at AVX-512 when this was written, 1e-7 apart at forced AVX2.
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double a = std::stod(cpu[i]), b = std::stod(test[i]);
    EXPECT_NEAR(a, b, 1e-5 * std::abs(a)) << "step " << i;
  }

  // The checkpoint the test device saved evaluates alike on the CPU and on the test device, on
  // the first 256 test images.
  tooltest::WriteFashionSlice(dir_, "t10k", 256);
  const std::string eval = "eval --config " + std::string(CORTADO_SOURCE_DIR) +
                           "/configs/fashion_lenet.yaml --checkpoint auto --threads 1 "
                           "--no-progress --set data.batch_size=16 --set data.val=" +
                           (dir_ / "t10k-images-idx3-ubyte.gz").string() +
                           " --set checkpoint.dir=" + (dir_ / "test").string();
  const Result on_cpu = Cortado(eval + " --device cpu");
  const Result on_test = Cortado(eval + " --device test");
  EXPECT_EQ(on_cpu.code, 0) << on_cpu.err;
  EXPECT_EQ(on_test.code, 0) << on_test.err;
  EXPECT_NE(on_cpu.out.find("top1 "), std::string::npos) << on_cpu.out;
  // The same counts of correct images; the mean loss (4 decimals) within a unit of its last.
  static const std::regex figures("top1 ([0-9.]+)%  top5 ([0-9.]+)%  loss ([0-9.]+)");
  std::smatch c, t;
  ASSERT_TRUE(std::regex_search(on_cpu.out, c, figures)) << on_cpu.out;
  ASSERT_TRUE(std::regex_search(on_test.out, t, figures)) << on_test.out;
  EXPECT_EQ(c[1], t[1]);
  EXPECT_EQ(c[2], t[2]);
  EXPECT_NEAR(std::stod(c[3]), std::stod(t[3]), 1.5e-4);
}

TEST(TrainDeviceErrors, AnUnusableOrUnknownDeviceIsOneLineNamingTheKey) {
  std::string why;
  std::vector<std::string> bad = {"gpu", "test:99"};
  if (!DeviceUsable(Device{DeviceType::kCUDA, 0}, &why)) bad.push_back("cuda");
  for (const std::string& device : bad) {
    const Result r = Cortado("train --config " + std::string(CORTADO_SOURCE_DIR) +
                             "/configs/fashion_lenet.yaml --device " + device + " --dry-run");
    EXPECT_EQ(r.code, 1) << device << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("device"), std::string::npos) << r.err;
  }
}

// With several ranks each takes its own device, the config's index plus its local rank; a rank
// past the last device stops with one line naming the device it would take and why not.
TEST(TrainDeviceErrors, ARankPastTheLastDeviceIsRefusedNamingTheDevice) {
  World world;
  world.rank = world.local_rank = 2;
  world.size = world.local_size = 3;
  try {
    Trainer trainer(LoadRunConfig(std::string(CORTADO_SOURCE_DIR) + "/configs/fashion_lenet.yaml",
                                  {"device=test:2"}, /*need_train=*/true, /*check_data=*/false),
                    std::move(world));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("device: test:2 with 3 ranks on this machine gives local rank 2 test:4"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("one device per rank"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace cortado
