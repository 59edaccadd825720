#include "tests/tools/user_run.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "data/jpeg.h"
#include "engine/base/error.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"

namespace cortado::tooltest {

namespace fs = std::filesystem;

void UserRun::SetUp() { dir_ = FreshTestDir("cortado_user"); }

void UserRun::TearDown() { fs::remove_all(dir_); }

std::string UserRun::Write(const std::string& name, const std::string& text) {
  const fs::path path = dir_ / name;
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  return path.string();
}

void UserRun::WriteImages(const std::string& folder, const std::vector<std::string>& classes,
                          int per_class) {
  JpegEncoder encoder;
  ImageU8 image;
  image.Reshape(12, 12, 3);
  for (size_t c = 0; c < classes.size(); ++c) {
    for (int i = 0; i < per_class; ++i) {
      for (size_t p = 0; p < image.pixels.size(); ++p) {
        image.pixels[p] = static_cast<uint8_t>((p * (c + 1) * 7 + i * 13) % 251);
      }
      std::string bytes;
      encoder.Encode(image, 90, false, &bytes);
      const fs::path path = dir_ / folder / classes[c] / StrCat("img", i, ".JPEG");
      fs::create_directories(path.parent_path());
      std::ofstream(path, std::ios::binary) << bytes;
    }
  }
}

std::string UserRun::Convert(const std::string& folder, const std::string& db,
                             const std::string& extra) {
  std::string out, err;
  const std::string path = (dir_ / db).string();
  EXPECT_EQ(Cortado("convert --root " + (dir_ / folder).string() + " --out " + path + " " + extra,
                    &out, &err),
            0)
      << err;
  return path;
}

std::string UserRun::LmdbConfig(const std::string& train, const std::string& val,
                                const std::string& extra) {
  return StrCat(
      "seed: 3\n", "model:\n", "  layers:\n",
      "    - {name: conv, type: Convolution, inputs: data, outputs: conv, num_output: 2, "
      "kernel: 3}\n",
      "    - {name: logits, type: InnerProduct, inputs: conv, outputs: logits, num_output: 3}\n",
      "    - {name: loss, type: SoftmaxWithLoss, inputs: [logits, label], outputs: loss}\n",
      "    - {name: top1, type: Accuracy, inputs: [logits, label], outputs: top1, top_k: 1}\n",
      "data:\n", "  type: lmdb\n", "  train: ", train, "\n", "  val: ", val, "\n",
      "  batch_size: 2\n", "  crop: 8\n", "  val_resize: 8\n", "solver: {max_iter: 2}\n",
      "checkpoint: {dir: ", (dir_ / "ckpt").string(), "}\n", extra);
}

int UserRun::Cortado(const std::string& args, std::string* out, std::string* err) {
  return RunShell("timeout 120 " + CortadoBinary() + " " + args, out, err);
}

pid_t UserRun::StartCortado(const std::string& args, const std::string& err_name) {
  const std::string err = (dir_ / err_name).string();
  const std::string command = "exec " + CortadoBinary() + " " + args;
  const pid_t pid = fork();
  if (pid == 0) {
    if (freopen(err.c_str(), "w", stderr) == nullptr ||
        freopen("/dev/null", "w", stdout) == nullptr) {
      _exit(126);
    }
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::string UserRun::Read(const std::string& name) const {
  return testing::ReadFileBytes(dir_ / name);
}

bool UserRun::WaitForText(const std::string& name, const std::string& text, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (Read(name).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > until) return false;
    usleep(50000);
  }
  return true;
}

int UserRun::WaitExit(pid_t pid, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(50000);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace cortado::tooltest
