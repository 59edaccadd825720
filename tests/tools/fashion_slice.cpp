#include "tests/tools/fashion_slice.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <vector>

#include "data/idx_source.h"
#include "tests/support/files.h"

namespace cortado::tooltest {
namespace {

void WriteGz(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(f);
}

void PutBE(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

}  // namespace

void WriteFashionSlice(const std::filesystem::path& dir, const std::string& prefix, int64_t n) {
  IdxDataset d = ReadIdxDataset(std::string(kFashionDir) + prefix + "-images-idx3-ubyte.gz");
  std::vector<uint8_t> img, lab;
  PutBE(img, 0x803);
  PutBE(img, static_cast<uint32_t>(n));
  PutBE(img, 28);
  PutBE(img, 28);
  img.insert(img.end(), d.pixels.begin(), d.pixels.begin() + n * 784);
  PutBE(lab, 0x801);
  PutBE(lab, static_cast<uint32_t>(n));
  lab.insert(lab.end(), d.labels.begin(), d.labels.begin() + n);
  WriteGz(dir / (prefix + "-images-idx3-ubyte.gz"), img);
  WriteGz(dir / (prefix + "-labels-idx1-ubyte.gz"), lab);
}

std::filesystem::path FreshTestDir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "_" + std::to_string(getpid()) + "_" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void FashionDirTest::SetUp() {
  dir_ = FreshTestDir(prefix_);
  WriteFashionSlice(dir_, "train", train_images_);
  WriteFashionSlice(dir_, "t10k", val_images_);
}

bool WaitFor(const std::function<bool()>& done, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    usleep(50000);
  }
  return done();
}

int WaitExit(pid_t pid, double seconds) {
  int status = 0;
  if (!WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, seconds)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string CortadoBinary() { return std::string(CORTADO_BINARY_DIR) + "/tools/cortado"; }

int RunShell(const std::string& command, std::string* out, std::string* err) {
  const std::string base =
      std::filesystem::temp_directory_path() / ("cortado_run_" + std::to_string(getpid()) + "_");
  const std::string out_file = base + "out", err_file = base + "err";
  int status = std::system((command + " >" + out_file + " 2>" + err_file).c_str());
  if (out != nullptr) *out = testing::ReadFileBytes(out_file);
  if (err != nullptr) *err = testing::ReadFileBytes(err_file);
  std::filesystem::remove(out_file);
  std::filesystem::remove(err_file);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace cortado::tooltest
