// Test data for the tool tests: small slices of Debian's Fashion-MNIST as IDX files, and a way
// to run the cortado binary.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>

namespace cortado::tooltest {

inline const char* kFashionDir = "/usr/share/datasets/fashion-mnist/";

// Writes the first n images of a Fashion-MNIST split (prefix "train" or "t10k") as
// <dir>/<prefix>-images-idx3-ubyte.gz and its labels beside it.
void WriteFashionSlice(const std::filesystem::path& dir, const std::string& prefix, int64_t n);

// A fresh, empty folder for the running test: <tmp>/<prefix>_<pid>_<test name> (a leftover of
// an earlier run is removed first). The fixture removes it in TearDown.
std::filesystem::path FreshTestDir(const std::string& prefix);

// A fixture whose tests each get dir_, a FreshTestDir(prefix) holding the first train_images of
// Fashion-MNIST's train split and the first val_images of its t10k split; removed afterwards.
class FashionDirTest : public ::testing::Test {
 protected:
  FashionDirTest(std::string prefix, int64_t train_images, int64_t val_images)
      : prefix_(std::move(prefix)), train_images_(train_images), val_images_(val_images) {}
  void SetUp() override;
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The last layers of the tests' small nets, on `logits` and `label`: softmax loss, top-1 and
  // top-5 accuracy (YAML list items under model.layers).
  static constexpr const char* kLossAndAccuracy =
      "    - {name: loss, type: SoftmaxWithLoss, inputs: [logits, label], outputs: loss}\n"
      "    - {name: top1, type: Accuracy, inputs: [logits, label], outputs: top1, top_k: 1}\n"
      "    - {name: top5, type: Accuracy, inputs: [logits, label], outputs: top5, top_k: 5}\n";
  // A data section reading dir_'s slices (type, train and val; the test adds the rest).
  std::string IdxData() const {
    return "data:\n  type: idx\n  train: " + (dir_ / "train-images-idx3-ubyte.gz").string() +
           "\n  val: " + (dir_ / "t10k-images-idx3-ubyte.gz").string() + "\n";
  }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
  int64_t train_images_;
  int64_t val_images_;
};

// Calls done() every 50 ms until it returns true (then true) or `seconds` have passed (then
// done()'s last answer).
bool WaitFor(const std::function<bool()>& done, double seconds);

// The exit code of child pid (128 + signal when killed), waiting at most `seconds`; -1 on
// timeout (the child is then killed).
int WaitExit(pid_t pid, double seconds);

// The cortado binary of this build.
std::string CortadoBinary();

// Runs a shell command line, capturing stdout and stderr to strings (either may be null);
// returns its exit status (128 + signal when killed).
int RunShell(const std::string& command, std::string* out, std::string* err);

}  // namespace cortado::tooltest
