// The command line of the `cortado` binary, driven as a user would (issue 13): the resume
// command a stopped training prints (every flag, shell-quoted, under `cortado launch` too),
// flag ranges, exit codes (0, 1, 2, 128 + signal) and one-line errors, unknown commands, help
// and version, eval from a checkpoint alone, folders where files are expected, a master port
// in use, inspect of checkpoints, configs and LMDBs, help defaults, the metrics file, the plot
// script and --dry-run.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <vector>

#include "data/datum.h"
#include "data/jpeg.h"
#include "data/lmdb.h"
#include "engine/graph/conv_onednn.h"
#include "engine/graph/gemm_lowp.h"
#include "engine/io/checkpoint.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tools/metrics.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;
using testing::ReadFileBytes;
using testing::SplitLines;
using tooltest::CortadoBinary;
using tooltest::RunShell;
using tooltest::WaitExit;
using tooltest::WaitFor;
using tooltest::WriteFashionSlice;

// One line, "cortado <command>: error: ...".
void ExpectOneLineError(const std::string& err, const std::string& command,
                        const std::string& context) {
  EXPECT_EQ(err.rfind("cortado " + command + ": error: ", 0), 0u) << context << "\n" << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << context << "\n" << err;
}

// Starts `sh -c "exec COMMAND"` with stderr to err_file; returns its pid.
pid_t Start(const std::string& command, const fs::path& err_file) {
  pid_t pid = fork();
  if (pid == 0) {
    freopen(err_file.c_str(), "w", stderr);
    freopen("/dev/null", "w", stdout);
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

class CliTest : public tooltest::FashionDirTest {
 protected:
  CliTest() : FashionDirTest("cortado_cli", 320, 100) {}

  // A small conv net: 10 iterations per epoch of 32.
  std::string Config(const std::string& extra = "", const std::string& name = "run.yaml") {
    std::ostringstream y;
    y << "seed: 3\n"
      << "model:\n"
      << "  layers:\n"
      << "    - {name: conv, type: Convolution, inputs: data, outputs: conv, num_output: 4, "
         "kernel: 3}\n"
      << "    - {name: relu, type: ReLU, inputs: conv, outputs: relu}\n"
      << "    - {name: pool, type: Pooling, inputs: relu, outputs: pool, pool: max, kernel: 2}\n"
      << "    - {name: logits, type: InnerProduct, inputs: pool, outputs: logits, num_output: 10}\n"
      << kLossAndAccuracy << IdxData() << "  batch_size: 32\n"
      << "solver: {base_lr: 0.05, max_epochs: 2, eval_interval: 1}\n"
      << "checkpoint: {dir: " << (dir_ / "ckpt").string() << ", every: 1, keep: 2}\n"
      << "log: {interval: 2}\n"
      << extra;
    fs::path path = dir_ / name;
    std::ofstream(path) << y.str();
    return path.string();
  }

  // `cortado ARGS` under a time limit.
  int Cortado(const std::string& args, std::string* out, std::string* err) {
    return RunShell("timeout 120 " + CortadoBinary() + " " + args, out, err);
  }
};

// The text after "Resume with: " on the line that says it.
std::string ResumeHint(const std::string& err) {
  const std::string key = "Resume with: ";
  const size_t at = err.find(key);
  if (at == std::string::npos) return "";
  const size_t end = err.find('\n', at);
  return err.substr(at + key.size(),
                    end == std::string::npos ? std::string::npos : end - at - key.size());
}

TEST_F(CliTest, TheResumeCommandKeepsEveryFlagQuotedAndResumesTheSameRun) {
  const std::string config = Config();
  const fs::path ckpt = dir_ / "my runs" / "sig";  // a space: must be quoted
  const fs::path metrics = dir_ / "sig.jsonl";
  std::string err;
  const std::string args = "train --config " + config + " --set 'checkpoint.dir=" + ckpt.string() +
                           "' --metrics " + metrics.string() +
                           " --threads 1 --no-progress --stop-at-iter 4";
  ASSERT_EQ(Cortado(args, nullptr, &err), 130) << err;
  const std::string hint = ResumeHint(err);
  EXPECT_EQ(hint, CortadoBinary() + " train --config " + config +
                      " --set 'checkpoint.dir=" + ckpt.string() + "' --metrics " +
                      metrics.string() + " --threads 1 --no-progress --resume auto")
      << err;
  // An earlier --resume is replaced, not repeated.
  ASSERT_EQ(Cortado("train --config " + config + " --set 'checkpoint.dir=" + ckpt.string() +
                        "' --metrics " + metrics.string() +
                        " --threads 1 --resume auto --no-progress --stop-at-iter 6",
                    nullptr, &err),
            130)
      << err;
  EXPECT_EQ(ResumeHint(err).find("--stop-at-iter"), std::string::npos) << err;
  size_t resumes = 0;
  for (size_t p = ResumeHint(err).find("--resume"); p != std::string::npos;
       p = ResumeHint(err).find("--resume", p + 1)) {
    ++resumes;
  }
  EXPECT_EQ(resumes, 1u) << err;
  // Pasted, it finishes the same run: same folder, same metrics file, no gap.
  ASSERT_EQ(RunShell("timeout 120 " + hint, nullptr, &err), 0) << err;
  EXPECT_NE(err.find("resumed from '" + (ckpt / "ckpt-00000006.cortado").string()),
            std::string::npos)
      << err;
  std::vector<int64_t> iters;
  for (const std::string& line : SplitLines(ReadFileBytes(metrics))) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["event"] == "train") iters.push_back(j["iter"].get<int64_t>());
  }
  std::vector<int64_t> want;
  for (int64_t i = 2; i <= 20; i += 2) want.push_back(i);
  EXPECT_EQ(iters, want);
}

TEST_F(CliTest, UnderLaunchTheResumeCommandIsTheLaunchCommand) {
  const std::string config = Config();
  std::string err;
  const std::string train =
      CortadoBinary() + " train --config " + config + " --threads 1 --no-progress --stop-at-iter 2";
  ASSERT_EQ(
      RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 2 -- " + train, nullptr, &err),
      130)
      << err;
  EXPECT_EQ(ResumeHint(err), CortadoBinary() + " launch --nproc 2 -- " + CortadoBinary() +
                                 " train --config " + config +
                                 " --threads 1 --no-progress --resume auto")
      << err;
}

TEST_F(CliTest, OutOfRangeValuesNameTheFlagAndTheRange) {
  const std::string config = Config();
  struct Case {
    std::string command, args, want;
  };
  const std::vector<Case> cases = {
      {"train", "--config " + config + " --stop-at-iter 0",
       "--stop-at-iter: must be an integer >= 1, got '0'"},
      {"train", "--config " + config + " --threads -3", "--threads: must be an integer >= 0"},
      {"train", "--config " + config + " --trace-iters -1",
       "--trace-iters: must be an integer >= 0"},
      {"train", "--config " + config + " --threads two", "--threads: must be an integer >= 0"},
      {"eval", "--checkpoint x --threads -1", "--threads: must be an integer >= 0"},
      {"launch", "--nproc 0 -- true", "--nproc: must be an integer >= 1, got '0'"},
      {"launch", "--grace -1 -- true", "--grace: must be a number >= 0"},
      {"launch", "--nnodes 2 --node-rank 2 --master 127.0.0.1:1 -- true",
       "--node-rank must be in 0..1"},
      {"convert", "--root . --out x --quality 101", "--quality: must be an integer from 1 to 100"},
      {"bench train", "--config " + config + " --iters 0", "--iters: must be an integer >= 1"},
      {"bench data", "--db . --seconds 0", "--seconds: must be a number > 0"},
      {"bench comm", "--iters -2", "--iters: must be an integer >= 0"},
      {"bench comm", "--op sum", "--op: must be one of allreduce, broadcast"},
      {"bench comm", "--sizes 4X", "--sizes: '4X' is not a byte size"},
      {"bench comm", "--codec auto --link fast", "--link fast: want a rate such as 100mbit"},
      {"bench codec", "--rounds 0", "--rounds: must be an integer >= 1"},
  };
  for (const Case& c : cases) {
    std::string err;
    EXPECT_EQ(Cortado(c.command + " " + c.args, nullptr, &err), 2) << c.args << "\n" << err;
    ExpectOneLineError(err, c.command, c.args);
    EXPECT_NE(err.find(c.want), std::string::npos) << err;
    EXPECT_EQ(err.find("179769"), std::string::npos) << err;
  }
}

TEST_F(CliTest, ExitCodesAreZeroOneTwoOr128PlusTheSignal) {
  const std::string config = Config();
  std::string err;
  // Usage errors: 2, naming the flag (not a missing --config).
  EXPECT_EQ(Cortado("train --bogus", nullptr, &err), 2);
  ExpectOneLineError(err, "train", "unknown option");
  EXPECT_NE(err.find("unknown option '--bogus'"), std::string::npos) << err;
  EXPECT_EQ(Cortado("train --confg " + config, nullptr, &err), 2);
  EXPECT_NE(err.find("unknown option '--confg' (did you mean '--config'?)"), std::string::npos)
      << err;
  EXPECT_EQ(Cortado("train", nullptr, &err), 2);
  ExpectOneLineError(err, "train", "missing --config");
  EXPECT_NE(err.find("--config is required"), std::string::npos) << err;
  EXPECT_EQ(Cortado("launch --nproc 2 -- ", nullptr, &err), 2);
  ExpectOneLineError(err, "launch", "no command");
  EXPECT_NE(err.find("no command to run"), std::string::npos) << err;
  EXPECT_EQ(Cortado("launch --nproc 2 cortado train --config " + config, nullptr, &err), 2);
  ExpectOneLineError(err, "launch", "no --");
  EXPECT_NE(err.find("the command to run goes after --"), std::string::npos) << err;
  // Runtime errors: 1.
  EXPECT_EQ(Cortado("train --config /missing.yaml", nullptr, &err), 1);
  ExpectOneLineError(err, "train", "missing config");
  EXPECT_EQ(Cortado("launch -- /no/such/program", nullptr, &err), 1);
  ExpectOneLineError(err, "launch", "no program");
  EXPECT_NE(err.find("cannot run '/no/such/program'"), std::string::npos) << err;
  // SIGTERM: 143, the training and the launcher and each of its ranks alike.
  const std::string long_run = CortadoBinary() + " train --no-progress --threads 1 --config " +
                               config + " --set solver.max_epochs=100000";
  const fs::path err_file = dir_ / "err.txt";
  pid_t pid = Start(long_run, err_file);
  ASSERT_TRUE(
      WaitFor([&] { return ReadFileBytes(err_file).find("train iter") != std::string::npos; }, 60))
      << ReadFileBytes(err_file);
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid, 60), 143) << ReadFileBytes(err_file);
  EXPECT_NE(ReadFileBytes(err_file).find("Resume with:"), std::string::npos)
      << ReadFileBytes(err_file);
  const std::string rank = "sh -c 'trap \"\" INT TERM; " + long_run +
                           " --set checkpoint.dir=" + (dir_ / "launched").string() +
                           "; code=$?; echo \"rank $CORTADO_RANK exit $code\" >&2; exit $code'";
  const fs::path launch_err = dir_ / "launch_err.txt";
  pid = Start(CortadoBinary() + " launch --nproc 2 -- " + rank, launch_err);
  ASSERT_TRUE(WaitFor(
      [&] { return ReadFileBytes(launch_err).find("train iter") != std::string::npos; }, 60))
      << ReadFileBytes(launch_err);
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid, 60), 143) << ReadFileBytes(launch_err);
  const std::string err2 = ReadFileBytes(launch_err);
  EXPECT_NE(err2.find("[0] rank 0 exit 143"), std::string::npos) << err2;
  EXPECT_NE(err2.find("[1] rank 1 exit 143"), std::string::npos) << err2;
  EXPECT_EQ(err2.find("error:"), std::string::npos) << err2;
}

TEST_F(CliTest, UnknownCommandsHelpVersionAndTorchrunsSpelling) {
  std::string out, err;
  EXPECT_EQ(Cortado("trian", &out, &err), 2);
  EXPECT_EQ(err, "cortado: error: unknown command 'trian' (did you mean 'train'?)\n");
  EXPECT_EQ(Cortado("bench trian", &out, &err), 2);
  EXPECT_EQ(err, "cortado bench: error: unknown benchmark 'trian' (did you mean 'train'?)\n");
  EXPECT_EQ(Cortado("", &out, &err), 2);
  EXPECT_EQ(err.rfind("cortado: error: a command is required: train, eval", 0), 0u) << err;
  EXPECT_EQ(Cortado("help", &out, &err), 0) << err;
  EXPECT_NE(out.find("Usage: cortado [OPTIONS] SUBCOMMAND"), std::string::npos) << out;
  EXPECT_NE(out.find("train"), std::string::npos) << out;
  EXPECT_EQ(Cortado("help train", &out, &err), 0) << err;
  EXPECT_NE(out.find("Usage: cortado train [OPTIONS]"), std::string::npos) << out;
  EXPECT_NE(out.find("--stop-at-iter"), std::string::npos) << out;
  EXPECT_EQ(Cortado("help bench comm", &out, &err), 0) << err;
  EXPECT_NE(out.find("Usage: cortado bench comm"), std::string::npos) << out;
  EXPECT_EQ(Cortado("help trian", &out, &err), 2);
  EXPECT_NE(err.find("did you mean 'train'"), std::string::npos) << err;
  EXPECT_EQ(Cortado("train --help", &out, &err), 0) << err;
  EXPECT_NE(out.find("Usage: cortado train"), std::string::npos) << out;
  EXPECT_EQ(Cortado("version", &out, &err), 0);
  EXPECT_EQ(out, "cortado 0.1.0\n");
  EXPECT_EQ(Cortado("--version", &out, &err), 0);
  EXPECT_EQ(out, "cortado 0.1.0\n");
  EXPECT_EQ(Cortado("launch --nproc-per-node 2 --no-prefix -- sh -c 'echo $CORTADO_WORLD_SIZE'",
                    &out, &err),
            0)
      << err;
  EXPECT_EQ(out, "2\n2\n");
  EXPECT_EQ(Cortado("launch --nproc_per_node=3 -- true", &out, &err), 0) << err;
}

// The profile counts each convolution's and fc's arithmetic (4 x 3x3 x 26x26 outputs x 32
// images for the conv, 4 x 13 x 13 x 10 x 32 for the fc) and reports rates against a
// measured GEMM peak; every run reports its peak memory.
TEST_F(CliTest, BenchTrainProfileReportsGflopsAgainstTheGemmPeakAndPeakMemory) {
  std::string out, err;
  ASSERT_EQ(Cortado("bench train --config " + Config() + " --iters 2 --warmup 1 --profile --json",
                    &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_GT(j["peak_rss_mb"].get<double>(), 1.0);
  EXPECT_GT(j["gemm_peak_gflops"].get<double>(), 0.1);
  // The activations' measured high-water mark is the memory plan's peak.
  EXPECT_GT(j["activation_planned_peak_mb"].get<double>(), 0.0);
  EXPECT_EQ(j["activation_measured_peak_mb"], j["activation_planned_peak_mb"]);
  bool conv = false, fc = false, relu = false;
  for (const auto& l : j["layers"]) {
    const std::string name = l["name"];
    if (name == "conv") {
      conv = true;
      const double flops = 2.0 * 32 * 4 * 1 * 9 * 26 * 26;
      EXPECT_NEAR(l["forward_gflops"].get<double>(),
                  flops / (l["forward_ms"].get<double>() / 1000) / 1e9,
                  1e-6 * l["forward_gflops"].get<double>());
      EXPECT_GT(l["backward_gflops"].get<double>(), 0.0);
    }
    if (name == "logits") fc = l.contains("forward_gflops");
    if (name == "relu") relu = !l.contains("forward_gflops");
  }
  EXPECT_TRUE(conv && fc && relu) << out;
  ASSERT_EQ(
      Cortado("bench train --config " + Config() + " --iters 2 --warmup 1 --profile", &out, &err),
      0)
      << err;
  EXPECT_NE(out.find("peak memory"), std::string::npos) << out;
  EXPECT_NE(out.find("matrix-multiply peak"), std::string::npos) << out;
  EXPECT_NE(out.find("of the GEMM peak"), std::string::npos) << out;
  // --infer: forward passes only.
  ASSERT_EQ(Cortado("bench train --config " + Config() + " --iters 2 --infer --json", &out, &err),
            0)
      << err;
  const nlohmann::json inference = nlohmann::json::parse(out);
  EXPECT_EQ(inference["mode"], "inference");
  EXPECT_GT(inference["img_per_s"].get<double>(), 0.0);
  EXPECT_EQ(inference["comm_wait_ms"].get<double>(), 0.0);
  // An inference net: no activation gradients, and its plan holds less than training's.
  EXPECT_EQ(inference["activation_grad_mb"].get<double>(), 0.0);
  EXPECT_EQ(inference["activation_measured_peak_mb"], inference["activation_planned_peak_mb"]);
  EXPECT_LT(inference["activation_planned_peak_mb"].get<double>(),
            j["activation_planned_peak_mb"].get<double>());
}

// `bench comm --codec auto`: the plan of distributed.codec: auto for a model and a link, from
// backward's timing measured here, alone (no launcher). On a 100 kbit/s link nothing hides:
// every bucket the plan chooses for travels in epgc8 (the first is the last layer's weights);
// at 100 Gbit/s the first-ready bucket keeps f32. Batch norm and biases stay f32 either way.
TEST_F(CliTest, BenchCommCodecAutoReportsThePlanForAModelAndALink) {
  auto plan = [&](const std::string& link) {
    std::string out, err;
    EXPECT_EQ(Cortado("bench comm --codec auto --model resnet20 --batch 2 --threads 1 --json "
                      "--link " +
                          link,
                      &out, &err),
              0)
        << err;
    EXPECT_NE(err.find("codec auto: plan 1"), std::string::npos) << err;
    return nlohmann::json::parse(out);
  };
  const nlohmann::json slow = plan("100kbit");
  ASSERT_GT(slow["buckets"].size(), 10u);
  EXPECT_EQ(slow["link_bytes_per_s"].get<double>(), 12500.0);
  EXPECT_EQ(slow["buckets"][0]["first"], "logits.weight");
  EXPECT_EQ(slow["buckets"][0]["codec"], "epgc8");
  int narrow = 0;
  for (const auto& b : slow["buckets"]) {
    const std::string first = b["first"];
    if (b["codec"] == "epgc8") ++narrow;
    if (first.find(".bias") != std::string::npos || first.find("bn") != std::string::npos) {
      EXPECT_EQ(b["codec"], "f32") << first;
    }
  }
  EXPECT_GT(narrow, 10);
  const nlohmann::json fast = plan("100gbit");
  EXPECT_EQ(fast["buckets"][0]["codec"], "f32");
  std::string out, err;
  ASSERT_EQ(Cortado("bench comm --codec auto --model resnet20 --batch 2 --threads 1 --link 1gbit",
                    &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("logits.weight .. logits.weight"), std::string::npos) << out;
}

TEST_F(CliTest, EvalNeedsOnlyTheCheckpoint) {
  const std::string config = Config();
  std::string out, err;
  ASSERT_EQ(Cortado("train --no-progress --config " + config + " --set solver.max_epochs=1",
                    nullptr, &err),
            0)
      << err;
  const std::string ckpt = (dir_ / "ckpt" / "ckpt-00000010.cortado").string();
  const std::regex json(
      R"(^\{"top1":[0-9.]+,"top5":[0-9.]+,"loss":[0-9.]+,"images":100,"skipped":0\}\n$)");
  // The stored config, with no --config.
  ASSERT_EQ(Cortado("eval --checkpoint " + ckpt + " --json --no-progress", &out, &err), 0) << err;
  EXPECT_TRUE(std::regex_search(out, json)) << out;
  const std::string stored = out;
  // --set overrides it: another validation file (here the training one, 320 images).
  ASSERT_EQ(Cortado("eval --checkpoint " + ckpt +
                        " --json --set data.val=" + (dir_ / "train-images-idx3-ubyte.gz").string(),
                    &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("\"images\":320"), std::string::npos) << out;
  // auto: the newest valid checkpoint of the config's checkpoint.dir; --config replaces the
  // stored one.
  ASSERT_EQ(Cortado("eval --checkpoint auto --config " + config + " --json", &out, &err), 0) << err;
  EXPECT_EQ(out, stored);
  EXPECT_EQ(Cortado("eval --checkpoint auto --json", &out, &err), 2);
  ExpectOneLineError(err, "eval", "auto without config");
  EXPECT_NE(err.find("--checkpoint auto needs --config"), std::string::npos) << err;
  EXPECT_EQ(Cortado("eval --checkpoint auto --config " + config +
                        " --set checkpoint.dir=" + (dir_ / "empty").string(),
                    &out, &err),
            1);
  EXPECT_NE(err.find("no valid checkpoint in '" + (dir_ / "empty").string() + "'"),
            std::string::npos)
      << err;
  // A stored data path that is gone names the key and where it came from.
  EXPECT_EQ(Cortado("eval --checkpoint " + ckpt + " --set data.val=/gone/t10k-images-idx3-ubyte.gz",
                    &out, &err),
            1);
  ExpectOneLineError(err, "eval", "gone val");
  EXPECT_NE(err.find("data.val: '/gone/t10k-images-idx3-ubyte.gz' does not exist"),
            std::string::npos)
      << err;
}

TEST_F(CliTest, AFolderOrAnEmptyFileWhereAFileIsExpectedIsNamed) {
  const std::string config = Config();
  fs::create_directories(dir_ / "configs");
  std::ofstream(dir_ / "configs" / "a.yaml") << "seed: 1\n";
  const std::string folder = (dir_ / "configs").string();
  struct Case {
    std::string command, args, want;
  };
  const std::vector<Case> cases = {
      {"train", "--config " + folder,
       "config '" + folder + "' is a folder; expected a YAML config file such as " + folder +
           "/a.yaml"},
      {"train", "--config /dev/null", "config file '/dev/null' is empty; expected a YAML mapping"},
      {"inspect", "--config " + folder, "is a folder; expected a YAML config file"},
      {"eval", "--checkpoint " + folder,
       "--checkpoint '" + folder + "' is a folder; expected a checkpoint file"},
      {"inspect", "--checkpoint " + folder, "--checkpoint '" + folder + "' is a folder"},
      {"train", "--config " + config + " --resume " + folder,
       "--resume '" + folder + "' is a folder; expected a checkpoint file"},
      {"train", "--config " + config + " --metrics " + folder,
       "--metrics '" + folder + "' is a folder; expected a file path"},
      {"train", "--config " + config + " --trace " + folder,
       "--trace '" + folder + "' is a folder"},
      {"inspect", "--db " + config,
       "--db '" + config + "' is a file, not a folder; expected an LMDB folder"},
      {"convert", "--root " + config + " --out " + (dir_ / "db").string(),
       "--root '" + config + "' is a file, not a folder"},
  };
  for (const Case& c : cases) {
    std::string err;
    EXPECT_EQ(Cortado(c.command + " " + c.args, nullptr, &err), 1) << c.args;
    ExpectOneLineError(err, c.command, c.args);
    EXPECT_NE(err.find(c.want), std::string::npos) << err;
    EXPECT_EQ(err.find("basic_filebuf"), std::string::npos) << err;
  }
}

// A socket listening on 127.0.0.1 at a free port, held while the test runs.
class BusyPort {
 public:
  BusyPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 4);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~BusyPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST_F(CliTest, AMasterPortInUseFromTheEnvironmentFailsAtOnceNamingIt) {
  BusyPort busy;
  const std::string port = std::to_string(busy.port());
  const std::string config = Config();
  for (const std::string var : {"CORTADO_MASTER_PORT", "MASTER_PORT"}) {
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(RunShell("env " + var + "=" + port + " timeout 100 " + CortadoBinary() +
                           " launch --nproc 2 -- " + CortadoBinary() + " train --config " + config,
                       nullptr, &err),
              1)
        << err;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
    ExpectOneLineError(err, "launch", var);
    EXPECT_NE(err.find("127.0.0.1:" + port), std::string::npos) << err;
    EXPECT_NE(err.find("from " + var), std::string::npos) << err;
  }
  // A rank 0 started by hand (or by another launcher) that cannot bind the port says so too.
  std::string err;
  EXPECT_EQ(RunShell("env CORTADO_RANK=0 CORTADO_WORLD_SIZE=2 CORTADO_JOB_TOKEN=t "
                     "CORTADO_MASTER_PORT=" +
                         port + " timeout 100 " + CortadoBinary() +
                         " train --no-progress --config " + config,
                     nullptr, &err),
            1)
      << err;
  ExpectOneLineError(err, "train", "rank 0");
  EXPECT_NE(err.find(":" + port), std::string::npos) << err;
  EXPECT_NE(err.find("port from CORTADO_MASTER_PORT"), std::string::npos) << err;
}

// An LMDB of `raw` raw 8x6 records and `jpeg` JPEG 16x12 records over 3 classes.
void WriteDb(const fs::path& db, int raw, int jpeg, bool complete) {
  fs::create_directories(db);
  {
    LmdbWriter w(db.string());
    int n = 0;
    for (int i = 0; i < raw; ++i, ++n) {
      DatumFields f;
      f.channels = 3;
      f.height = 6;
      f.width = 8;
      f.label = n % 3;
      w.Put(StrCat(n < 10 ? "0000000" : "000000", n, "_raw"),
            SerializeDatum(f, std::string(3 * 6 * 8, static_cast<char>(n))));
    }
    JpegEncoder encoder;
    ImageU8 image;
    image.Reshape(16, 12, 3);
    for (int i = 0; i < jpeg; ++i, ++n) {
      std::fill(image.pixels.begin(), image.pixels.end(), static_cast<uint8_t>(10 * i));
      std::string bytes;
      encoder.Encode(image, 90, false, &bytes);
      DatumFields f;
      f.encoded = true;
      f.label = n % 3;
      w.Put(StrCat(n < 10 ? "0000000" : "000000", n, "_jpeg"), SerializeDatum(f, bytes));
    }
    w.Close();
  }
  std::ofstream(db / "classes.txt") << "cat\ndog\nowl\n";
  if (complete) {
    LmdbCompletion c;
    c.records = raw + jpeg;
    c.classes = 3;
    c.channels = 3;
    c.root = "/photos";
    WriteLmdbCompletion(db.string(), c);
  }
}

TEST_F(CliTest, InspectShowsTheStoredConfigTensorsDataAndDatabases) {
  // A long layer name stays out of the type column; 47 records in batches of 8 are 40 samples.
  WriteFashionSlice(dir_, "train", 47);
  const std::string long_name = "a_convolution_with_a_name_longer_than_its_column";
  std::string config = Config("", "long.yaml");
  std::string text = ReadFileBytes(config);
  text = std::regex_replace(text, std::regex("name: conv,"), "name: " + long_name + ",");
  text = std::regex_replace(text, std::regex("batch_size: 32"), "batch_size: 8");
  std::ofstream(config) << text;
  std::string out, err;
  ASSERT_EQ(Cortado("inspect --config " + config, &out, &err), 0) << err;
  EXPECT_NE(out.find(long_name + "  Convolution"), std::string::npos) << out;
  EXPECT_NE(out.find("data.train: 47 records"), std::string::npos) << out;
  EXPECT_NE(out.find("an epoch is 5 batches of 8 = 40 samples (drop_last leaves 7 records out"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("data.val: 100 records"), std::string::npos) << out;
  EXPECT_NE(out.find("train fwd  train bwd  inference"), std::string::npos) << out;
  EXPECT_NE(out.find("planned activation peak: training "), std::string::npos) << out;

  ASSERT_EQ(Cortado("train --no-progress --config " + config + " --stop-at-iter 3", nullptr, &err),
            130)
      << err;
  const std::string ckpt = (dir_ / "ckpt" / "ckpt-00000003.cortado").string();
  ASSERT_EQ(Cortado("inspect --checkpoint " + ckpt, &out, &err), 0) << err;
  EXPECT_NE(out.find("iteration"), std::string::npos) << out;
  EXPECT_NE(out.find("stored config"), std::string::npos) << out;
  EXPECT_NE(out.find("  solver:"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("name +shape +dtype +values\n"))) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("param/" + long_name + "\\.weight +\\[4, 1, 3, 3\\] +f32 +36\n")))
      << out;

  WriteDb(dir_ / "db", 10, 2, true);
  ASSERT_EQ(Cortado("inspect --db " + (dir_ / "db").string(), &out, &err), 0) << err;
  EXPECT_NE(out.find("records    12"), std::string::npos) << out;
  EXPECT_NE(out.find("classes    3 (classes.txt: cat, dog, owl)"), std::string::npos) << out;
  EXPECT_NE(out.find("complete   yes"), std::string::npos) << out;
  EXPECT_NE(out.find("2 encoded (JPEG), 10 raw, 0 unreadable"), std::string::npos) << out;
  EXPECT_NE(out.find("8x6x3 (10), 16x12x3 (2)"), std::string::npos) << out;
  EXPECT_NE(out.find("keys       00000000_raw, 00000001_raw"), std::string::npos) << out;
  WriteDb(dir_ / "partial", 3, 0, false);
  ASSERT_EQ(Cortado("inspect --db " + (dir_ / "partial").string(), &out, &err), 0) << err;
  EXPECT_NE(out.find("complete   NO: LMDB " + (dir_ / "partial").string() + " is incomplete"),
            std::string::npos)
      << out;
}

// The shipped ImageNet recipe on a machine without ImageNet: inspect still shows the net, built
// from the model section (num_classes) and the data section (3 x crop x crop), and says that
// the data is missing; train --dry-run shows the same net and then fails on the data, as
// training would. IDX files carry their image size, so without them there is no net to show.
TEST_F(CliTest, InspectAndDryRunShowTheNetWhenTheDataIsMissing) {
  const std::string recipe = std::string(CORTADO_SOURCE_DIR) + "/configs/resnet50.yaml";
  const std::string gone = " --set data.train=" + (dir_ / "no_train_lmdb").string() +
                           " --set data.val=" + (dir_ / "no_val_lmdb").string() +
                           " --set data.batch_size=1";
  std::string out, err;
  ASSERT_EQ(Cortado("inspect --config " + recipe + gone, &out, &err), 0) << err;
  EXPECT_TRUE(
      std::regex_search(out, std::regex(R"(\nlogits +InnerProduct +\[1, 1000\] +2049000\n)")))
      << out;
  EXPECT_NE(out.find("total parameters: 25557032"), std::string::npos) << out;
  EXPECT_NE(out.find("note: --set data.train=" + (dir_ / "no_train_lmdb").string() +
                     ": data.train: '" + (dir_ / "no_train_lmdb").string() + "' does not exist"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("input [3, 224, 224]"), std::string::npos) << out;

  EXPECT_EQ(Cortado("train --dry-run --config " + recipe + gone, &out, &err), 1);
  EXPECT_NE(out.find("total parameters: 25557032"), std::string::npos) << out;
  EXPECT_EQ(out.find("dry run: the config"), std::string::npos) << out;
  ExpectOneLineError(err, "train", "dry run without data");
  EXPECT_NE(err.find("data.train: '" + (dir_ / "no_train_lmdb").string() + "' does not exist"),
            std::string::npos)
      << err;

  // Without num_classes the data would have to say: the error of the data stands.
  EXPECT_EQ(Cortado("inspect --config " + recipe + gone + " --set model.num_classes=0", &out, &err),
            1);
  ExpectOneLineError(err, "inspect", "no classes");
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
  // IDX: the files say the image size.
  EXPECT_EQ(Cortado("inspect --config " + Config() +
                        " --set data.train=" + (dir_ / "gone-images-idx3-ubyte.gz").string(),
                    &out, &err),
            1);
  EXPECT_NE(err.find("gone-images-idx3-ubyte.gz' does not exist"), std::string::npos) << err;
}

TEST_F(CliTest, HelpShowsEveryDefault) {
  std::string out, err;
  ASSERT_EQ(Cortado("help bench train", &out, &err), 0);
  EXPECT_TRUE(std::regex_search(out, std::regex("--iters INT .*\\(>= 1\\) \\[default: 50\\]")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("--warmup INT .*\\[default: 5\\]"))) << out;
  ASSERT_EQ(Cortado("help launch", &out, &err), 0);
  EXPECT_TRUE(std::regex_search(out, std::regex("--nproc-per-node[^\\[]*\\[default: 1\\]"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("--grace FLOAT .*\\[default: 5"))) << out;
  ASSERT_EQ(Cortado("help bench comm", &out, &err), 0);
  EXPECT_TRUE(std::regex_search(out, std::regex("--sizes TEXT .*\\[default: 4K:128M\\]"))) << out;
  ASSERT_EQ(Cortado("help train", &out, &err), 0);
  EXPECT_TRUE(std::regex_search(out, std::regex("--trace-iters INT .*\\[default: 20\\]"))) << out;
  // Every option that takes a value has a default shown, unless it is required or has none.
  for (const char* command : {"train", "eval", "convert", "launch", "inspect", "bench train",
                              "bench data", "bench comm", "bench codec"}) {
    ASSERT_EQ(Cortado(std::string("help ") + command, &out, &err), 0) << command;
    for (const std::string& line : SplitLines(out)) {
      if (!std::regex_search(line, std::regex("^  --[a-z-]+ (INT|FLOAT|UINT)"))) continue;
      EXPECT_NE(line.find("[default: "), std::string::npos) << command << ": " << line;
    }
  }
}

// Significant digits of a number's text: "0.000120" -> 2, "1.5e-07" -> 2, "300.0" -> 1.
size_t Significant(const std::string& text) {
  std::string digits;
  for (char c : text.substr(0, text.find_first_of("eE"))) {
    if (c >= '0' && c <= '9') digits += c;
  }
  const size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return 1;
  return digits.find_last_not_of('0') - first + 1;
}

// Whether a JSON number token has no more digits than the shortest text that reads back as
// the same double (std::to_chars), and does read back as it.
bool Shortest(const std::string& token) {
  const double v = std::strtod(token.c_str(), nullptr);
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  return Significant(token) == Significant(std::string(buf, r.ptr));
}

TEST_F(CliTest, ExportEvalWeightsAndTrainWeightsAgreeWithTheCheckpoint) {
  const std::string config = Config();
  std::string out, err;
  ASSERT_EQ(Cortado("train --no-progress --config " + config, nullptr, &err), 0) << err;
  const std::string ckpt = (dir_ / "ckpt" / "ckpt-00000020.cortado").string();
  const std::string weights = (dir_ / "w.safetensors").string();
  ASSERT_EQ(Cortado("export --checkpoint " + ckpt + " --out " + weights, &out, &err), 0) << err;
  EXPECT_NE(out.find("wrote 4 tensors"), std::string::npos) << out;
  // An existing file is kept unless --overwrite.
  EXPECT_EQ(Cortado("export --checkpoint " + ckpt + " --out " + weights, nullptr, &err), 2);
  ExpectOneLineError(err, "export", "existing --out");
  EXPECT_NE(err.find("give --overwrite"), std::string::npos) << err;
  EXPECT_EQ(
      Cortado("export --checkpoint " + ckpt + " --out " + weights + " --overwrite", nullptr, &err),
      0)
      << err;

  std::string from_ckpt, from_weights;
  ASSERT_EQ(Cortado("eval --json --checkpoint " + ckpt, &from_ckpt, &err), 0) << err;
  ASSERT_EQ(
      Cortado("eval --json --weights " + weights + " --config " + config, &from_weights, &err), 0)
      << err;
  EXPECT_EQ(from_ckpt, from_weights);
  EXPECT_EQ(Cortado("eval --weights " + weights, nullptr, &err), 2);
  ExpectOneLineError(err, "eval", "--weights without --config");
  EXPECT_EQ(Cortado("eval --checkpoint " + ckpt + " --weights " + weights, nullptr, &err), 2);
  ExpectOneLineError(err, "eval", "both");
  EXPECT_NE(err.find("give --checkpoint or --weights, not both"), std::string::npos) << err;

  // A fresh run in another folder starts from the weights, and says what it loaded.
  ASSERT_EQ(Cortado("train --no-progress --config " + config + " --weights " + weights +
                        " --set checkpoint.dir=" + (dir_ / "ft").string() + " --stop-at-iter 2",
                    nullptr, &err),
            130)
      << err;
  EXPECT_NE(err.find("weights: 4 tensor(s) loaded from '" + weights + "'"), std::string::npos)
      << err;
  // The file is part of the run's config, so a resume sees it and keeps the checkpoint's.
  ASSERT_EQ(Cortado("train --no-progress --config " + config + " --weights " + weights +
                        " --set checkpoint.dir=" + (dir_ / "ft").string() + " --resume auto",
                    nullptr, &err),
            0)
      << err;
  EXPECT_NE(err.find("is not loaded: the checkpoint's weights continue the run"), std::string::npos)
      << err;
  EXPECT_EQ(
      Cortado("train --config " + config + " --weights " + (dir_ / "none").string(), nullptr, &err),
      1);
  EXPECT_NE(err.find("--weights"), std::string::npos) << err;
}

TEST(DumpShortest, WritesEveryFloatInItsShortestFormAndKeepsTheRest) {
  // 0.014226514 is one of the values nlohmann's Grisu2 writes long (0.014226513999999999).
  nlohmann::ordered_json j;
  j["event"] = "x\x01\"";
  j["a"] = 0.014226514;
  j["b"] = 2.0;
  j["c"] = 1e300;
  j["d"] = int64_t{-7};
  j["e"] = std::vector<double>{0.1, 0.2 + 0.1};
  j["f"] = std::numeric_limits<double>::infinity();
  j["g"] = nlohmann::ordered_json::object({{"h", true}, {"i", nullptr}});
  EXPECT_EQ(DumpShortest(j), R"({"event":"x\u0001\"","a":0.014226514,"b":2.0,"c":1e+300,"d":-7,)"
                             R"("e":[0.1,0.30000000000000004],"f":null,"g":{"h":true,"i":null}})");
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    const double v = std::uniform_real_distribution<double>(0, 1)(rng) *
                     std::pow(10.0, std::uniform_int_distribution<int>(-12, 12)(rng));
    const std::string text = DumpShortest(nlohmann::ordered_json(v));
    ASSERT_TRUE(Shortest(text)) << text;
    ASSERT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
}

TEST_F(CliTest, TheMetricsFileHasShortestNumbersTimesAndStartAndResumeEvents) {
  const std::string config = Config();
  const fs::path metrics = dir_ / "m.jsonl";
  std::string err;
  const auto before = std::chrono::system_clock::now();
  ASSERT_EQ(Cortado("train --no-progress --config " + config + " --metrics " + metrics.string() +
                        " --stop-at-iter 6",
                    nullptr, &err),
            130)
      << err;
  ASSERT_EQ(Cortado("train --no-progress --config " + config + " --metrics " + metrics.string() +
                        " --resume auto",
                    nullptr, &err),
            0)
      << err;
  const double t0 = std::chrono::duration<double>(before.time_since_epoch()).count();
  const std::vector<std::string> lines = SplitLines(ReadFileBytes(metrics));
  ASSERT_GT(lines.size(), 10u);
  std::vector<std::string> starts;
  std::string hash;
  const std::regex number(R"(:(-?[0-9][0-9.eE+-]*))");
  for (const std::string& line : lines) {
    nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("time")) << line;
    EXPECT_GE(j["time"].get<double>(), t0 - 1) << line;
    EXPECT_LT(j["time"].get<double>(), t0 + 600) << line;
    EXPECT_EQ(line.find("\"event\":"), 1u) << line;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), number);
         it != std::sregex_iterator(); ++it) {
      EXPECT_TRUE(Shortest((*it)[1])) << (*it)[1] << " in " << line;
    }
    if (j["event"] == "start" || j["event"] == "resume") {
      starts.push_back(StrCat(j["event"].get<std::string>(), "@", j["iter"].get<int64_t>()));
      EXPECT_NE(j["command"].get<std::string>().find(" train --no-progress --config " + config),
                std::string::npos)
          << line;
      EXPECT_EQ(j["config_hash"].get<std::string>().size(), 16u) << line;
      if (hash.empty()) hash = j["config_hash"];
      EXPECT_EQ(j["config_hash"], hash) << line;
    }
    // 2 of 10 batches: 0.2, not 0.20000000000000001.
    if (j["event"] == "train" && j["iter"] == 2) {
      EXPECT_NE(line.find("\"epoch\":0.2,"), std::string::npos) << line;
    }
  }
  EXPECT_EQ(starts, (std::vector<std::string>{"start@0", "resume@6"}));
}

// A database with an unreadable record (record 4 of 10, a truncated JPEG). Evaluation scores
// each readable record once and counts the other: on one rank and on two, where rank 0's
// substitute used to be record 5 of rank 1's shard, scored twice; "skipped" in --json, a
// warning naming the key, and in a training run's eval log and metrics. Training substitutes
// the next record and counts how often in its log and metrics.
TEST_F(CliTest, EvalSkipsAndCountsUnreadableRecordsAndTrainingCountsItsSubstitutes) {
  const std::string db = (dir_ / "db").string();
  {
    fs::create_directories(db);
    LmdbWriter writer(db);
    JpegEncoder encoder;
    ImageU8 image;
    image.Reshape(40, 36, 3);
    for (int i = 0; i < 10; ++i) {
      for (size_t p = 0; p < image.pixels.size(); ++p) {
        image.pixels[p] = static_cast<uint8_t>((p * (i + 3) * 7) % 251);
      }
      std::string jpeg;
      encoder.Encode(image, 90, false, &jpeg);
      if (i == 4) jpeg.resize(50);  // cut inside the header
      DatumFields f;
      f.label = i % 3;
      f.encoded = true;
      f.channels = 3;
      writer.Put(StrCat("rec", i), SerializeDatum(f, jpeg));
    }
    writer.Close();
  }
  const std::string config = (dir_ / "lmdb.yaml").string();
  std::ofstream(config)
      << "seed: 3\n"
      << "model:\n"
      << "  num_classes: 3\n"
      << "  layers:\n"
      << "    - {name: conv, type: Convolution, inputs: data, outputs: conv, num_output: 4, "
         "kernel: 3, stride: 2}\n"
      << "    - {name: logits, type: InnerProduct, inputs: conv, outputs: logits, num_output: 3}\n"
      << "    - {name: loss, type: SoftmaxWithLoss, inputs: [logits, label], outputs: loss}\n"
      << "    - {name: top1, type: Accuracy, inputs: [logits, label], outputs: top1, top_k: 1}\n"
      << "    - {name: top5, type: Accuracy, inputs: [logits, label], outputs: top5, top_k: 2}\n"
      << "data: {type: lmdb, train: " << db << ", val: " << db
      << ", batch_size: 4, val_batch_size: 3, crop: 16, val_resize: 20, shuffle: false}\n"
      << "solver: {base_lr: 0.01, max_iter: 4}\n"
      << "checkpoint: {dir: " << (dir_ / "ckpt").string() << "}\n"
      << "log: {interval: 2}\n";
  const fs::path metrics = dir_ / "m.jsonl";
  std::string out, err;
  ASSERT_EQ(Cortado("train --no-progress --threads 2 --config " + config + " --metrics " +
                        metrics.string(),
                    nullptr, &err),
            0)
      << err;
  // An epoch is records 0-7 (shuffle off, drop_last): record 4 is replaced once per epoch.
  EXPECT_NE(err.find("2 corrupt record(s) replaced"), std::string::npos) << err;
  EXPECT_NE(err.find("9 images, 1 unreadable record(s) skipped"), std::string::npos) << err;
  int64_t last_replaced = -1, eval_skipped = -1, eval_images = -1;
  for (const std::string& line : SplitLines(ReadFileBytes(metrics))) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["event"] == "train") last_replaced = j.value("replaced_records", int64_t{-1});
    if (j["event"] == "eval") {
      eval_skipped = j.value("skipped", int64_t{-1});
      eval_images = j.value("images", int64_t{-1});
    }
  }
  EXPECT_EQ(last_replaced, 2);
  EXPECT_EQ(eval_images, 9);
  EXPECT_EQ(eval_skipped, 1);

  const std::string ckpt = (dir_ / "ckpt" / "ckpt-00000004.cortado").string();
  ASSERT_EQ(Cortado("eval --json --threads 1 --checkpoint " + ckpt, &out, &err), 0) << err;
  const nlohmann::json one = nlohmann::json::parse(out);
  EXPECT_EQ(one["images"].get<int64_t>(), 9) << out;
  EXPECT_EQ(one["skipped"].get<int64_t>(), 1) << out;
  EXPECT_NE(err.find("'rec4'"), std::string::npos) << err;
  // Two ranks split the records (rank 0 has rec0, rec2, rec4, ...) and add up to the same
  // counts and the same accuracy: no record scored twice.
  ASSERT_EQ(Cortado("launch --nproc 2 -- " + CortadoBinary() +
                        " eval --json --threads 1 --checkpoint " + ckpt,
                    &out, &err),
            0)
      << err;
  // Rank 0 prints the totals (its lines prefixed "[0] " by the launcher).
  ASSERT_NE(out.find('{'), std::string::npos) << out;
  const nlohmann::json two = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(two["images"].get<int64_t>(), 9) << out;
  EXPECT_EQ(two["skipped"].get<int64_t>(), 1) << out;
  EXPECT_EQ(two["top1"], one["top1"]) << out;
  EXPECT_EQ(two["top5"], one["top5"]) << out;
}

// The ImageNet guide's validation step: a flat folder plus Kaggle's label file -> a list file
// -> a database whose labels are the training database's class indices.
TEST_F(CliTest, ImageNetValidationListKeepsTheTrainingLabels) {
  JpegEncoder encoder;
  ImageU8 image;
  image.Reshape(8, 8, 3);
  auto write_jpeg = [&](const fs::path& path, uint8_t value) {
    fs::create_directories(path.parent_path());
    std::fill(image.pixels.begin(), image.pixels.end(), value);
    std::string bytes;
    encoder.Encode(image, 90, false, &bytes);
    std::ofstream(path, std::ios::binary) << bytes;
  };
  write_jpeg(dir_ / "train" / "n02" / "a.JPEG", 10);
  write_jpeg(dir_ / "train" / "n01" / "b.JPEG", 20);
  write_jpeg(dir_ / "train" / "n03" / "c.JPEG", 30);
  for (int i = 1; i <= 3; ++i) {
    write_jpeg(dir_ / "val" / StrCat("ILSVRC2012_val_0000000", i, ".JPEG"), 40);
  }
  std::ofstream(dir_ / "LOC_val_solution.csv")
      << "ImageId,PredictionString\n"
      << "ILSVRC2012_val_00000002,n01 1 2 3 4 n01 5 6 7 8\n"
      << "ILSVRC2012_val_00000001,n03 1 2 3 4\n"
      << "ILSVRC2012_val_00000003,n02 1 2 3 4\n";
  std::string out, err;
  const std::string train_db = (dir_ / "train_db").string();
  ASSERT_EQ(
      Cortado("convert --root " + (dir_ / "train").string() + " --out " + train_db, &out, &err), 0)
      << err;
  const std::string script = std::string(CORTADO_SOURCE_DIR) + "/scripts/imagenet_val_list.py";
  const std::string list = (dir_ / "val_list.txt").string();
  const std::string make_list = "timeout 60 python3 " + script + " --labels " +
                                (dir_ / "LOC_val_solution.csv").string() + " --classes " +
                                train_db + "/classes.txt --out " + list;
  ASSERT_EQ(RunShell(make_list, &out, &err), 0) << err;
  EXPECT_EQ(ReadFileBytes(list),
            "ILSVRC2012_val_00000001.JPEG 2\nILSVRC2012_val_00000002.JPEG 0\n"
            "ILSVRC2012_val_00000003.JPEG 1\n");
  EXPECT_NE(RunShell(make_list, nullptr, &err), 0) << "an existing list is not overwritten";
  EXPECT_NE(err.find("exists"), std::string::npos) << err;
  const std::string val_db = (dir_ / "val_db").string();
  ASSERT_EQ(Cortado("convert --root " + (dir_ / "val").string() + " --list " + list +
                        " --classes " + train_db + "/classes.txt --out " + val_db,
                    &out, &err),
            0)
      << err;
  LmdbReader reader(val_db);
  auto txn = reader.BeginRead();
  ASSERT_EQ(reader.size(), 3);
  DatumParser parser;
  std::vector<int> labels;
  for (int64_t i = 0; i < reader.size(); ++i) {
    const std::string value(txn.Get(i));
    ASSERT_TRUE(parser.Parse(value.data(), value.size()));
    labels.push_back(parser.fields().label);
  }
  EXPECT_EQ(labels, (std::vector<int>{2, 0, 1}));  // n03, n01, n02 in classes n01 n02 n03
  // A synset the training set does not have is named.
  std::ofstream(dir_ / "bad.txt") << "ILSVRC2012_val_00000001 n99\n";
  EXPECT_NE(
      RunShell("python3 " + script + " --labels " + (dir_ / "bad.txt").string() + " --classes " +
                   train_db + "/classes.txt --out " + (dir_ / "l2.txt").string(),
               nullptr, &err),
      0);
  EXPECT_NE(err.find("has synset n99"), std::string::npos) << err;
}

// The shipped ImageNet recipe trains on a converted ImageNet-layout LMDB, as the guide says
// (here a reduced-width ResNet-50 at 32x32 on a few photos, 2 epochs), and its checkpoint and
// exported weights evaluate to the same top-1 and top-5.
TEST_F(CliTest, TheResNet50RecipeTrainsOnAConvertedLmdbAndItsWeightsEvaluate) {
  JpegEncoder encoder;
  ImageU8 image;
  image.Reshape(48, 40, 3);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 6; ++i) {
      for (size_t p = 0; p < image.pixels.size(); ++p) {
        image.pixels[p] = static_cast<uint8_t>((p * (c + 1) * 7 + i * 13) % 251);
      }
      std::string bytes;
      encoder.Encode(image, 90, false, &bytes);
      const fs::path path = dir_ / "imagenet" / StrCat("n0", c) / StrCat("img", i, ".JPEG");
      fs::create_directories(path.parent_path());
      std::ofstream(path, std::ios::binary) << bytes;
    }
  }
  std::string out, err;
  const std::string db = (dir_ / "train_lmdb").string();
  ASSERT_EQ(Cortado("convert --root " + (dir_ / "imagenet").string() + " --out " + db +
                        " --resize-shorter 40",
                    &out, &err),
            0)
      << err;
  const std::string recipe = std::string(CORTADO_SOURCE_DIR) + "/configs/resnet50.yaml";
  const std::string ckpt_dir = (dir_ / "r50").string();
  const std::string sets = " --set data.train=" + db + " --set data.val=" + db +
                           " --set model.num_classes=3 --set model.base_width=4"
                           " --set data.batch_size=6 --set data.val_batch_size=9"
                           " --set data.crop=32 --set data.val_resize=36"
                           " --set solver.max_epochs=2 --set solver.warmup_epochs=1"
                           " --set checkpoint.dir=" +
                           ckpt_dir;
  ASSERT_EQ(Cortado("train --no-progress --threads 2 --config " + recipe + sets, &out, &err), 0)
      << err;
  EXPECT_NE(err.find("done: top1"), std::string::npos) << err;
  const std::string ckpt = (fs::path(ckpt_dir) / "ckpt-00000006.cortado").string();
  std::string from_ckpt, from_weights;
  ASSERT_EQ(Cortado("eval --json --checkpoint " + ckpt, &from_ckpt, &err), 0) << err;
  const nlohmann::json j = nlohmann::json::parse(from_ckpt);
  EXPECT_EQ(j["images"].get<int64_t>(), 18);
  EXPECT_GE(j["top5"].get<double>(), j["top1"].get<double>());
  const std::string weights = (dir_ / "r50.safetensors").string();
  ASSERT_EQ(Cortado("export --checkpoint " + ckpt + " --out " + weights, &out, &err), 0) << err;
  ASSERT_EQ(Cortado("eval --json --weights " + weights + " --config " + recipe + sets,
                    &from_weights, &err),
            0)
      << err;
  EXPECT_EQ(from_ckpt, from_weights);
}

TEST_F(CliTest, PlotScriptDrawsRunsAndWritesATable) {
  if (RunShell("/usr/bin/python3 -c 'import matplotlib'", nullptr, nullptr) != 0) {
    GTEST_SKIP() << "python3-matplotlib is not installed (scripts/setup.sh installs it)";
  }
  // Two runs; the second from an older version: no time, no lr, a line that is not JSON.
  std::ofstream(dir_ / "a.jsonl")
      << R"({"event":"start","time":1.5,"iter":0,"command":"cortado train","config_hash":"0"})"
         "\n"
      << R"({"event":"train","time":2,"iter":2,"epoch":0.2,"loss":2.1,"lr":0.1,"img_per_s":300})"
         "\n"
      << R"({"event":"train","time":3,"iter":4,"epoch":0.4,"loss":1.9,"lr":0.09,"img_per_s":310})"
         "\n"
      << R"({"event":"resume","time":9,"iter":4})"
         "\n"
      << R"({"event":"eval","time":4,"iter":10,"epoch":1,"top1":0.5,"top5":0.9,"loss":1.5,"images":100})"
         "\n";
  std::ofstream(dir_ / "b.jsonl") << R"({"event":"train","iter":2,"epoch":0.2,"loss":2.3})"
                                     "\n"
                                  << "garbage\n"
                                  << R"({"event":"eval","iter":10,"top1":0.4})"
                                     "\n";
  const std::string script = std::string(CORTADO_SOURCE_DIR) + "/scripts/plot_metrics.py";
  const fs::path png = dir_ / "curves.png", csv = dir_ / "table.csv";
  std::string err;
  ASSERT_EQ(RunShell("timeout 120 /usr/bin/python3 " + script + " " + (dir_ / "a.jsonl").string() +
                         " " + (dir_ / "b.jsonl").string() + " --out " + png.string() + " --csv " +
                         csv.string(),
                     nullptr, &err),
            0)
      << err;
  EXPECT_EQ(ReadFileBytes(png).substr(0, 4), "\x89PNG");
  const std::vector<std::string> rows = SplitLines(ReadFileBytes(csv));
  ASSERT_EQ(rows.size(), 6u) << ReadFileBytes(csv);
  EXPECT_EQ(rows[0].rfind("run,event,iter,epoch,time,loss,lr,img_per_s,top1,top5", 0), 0u);
  EXPECT_EQ(rows[1].rfind("a,train,2,0.2,2,2.1,0.1,300,", 0), 0u) << rows[1];
  EXPECT_EQ(rows[5].rfind("b,eval,10,,,,,,0.4,", 0), 0u) << rows[5];
  EXPECT_NE(err.find("skipped 1 line"), std::string::npos) << err;
  // Against the epoch; a folder is refused naming it.
  EXPECT_EQ(RunShell("/usr/bin/python3 " + script + " " + (dir_ / "a.jsonl").string() +
                         " --x epoch --out " + png.string(),
                     nullptr, &err),
            0)
      << err;
  EXPECT_EQ(RunShell("/usr/bin/python3 " + script + " " + dir_.string(), nullptr, &err), 1);
  EXPECT_NE(err.find("is a folder"), std::string::npos) << err;
}

// inspect says the net's layout and lists the reorders it inserted: in NHWC one before the
// inner product on the pooled (N, 4, 13, 13) map, which also shows as a row of the table;
// none in NCHW. auto is NHWC where oneDNN's convolutions are built in.
TEST_F(CliTest, InspectShowsTheLayoutAndItsReorders) {
  WriteFashionSlice(dir_, "train", 40);
  const std::string config = Config();
  std::string out, err;
  ASSERT_EQ(Cortado("inspect --config " + config + " --set model.layout=nhwc", &out, &err), 0)
      << err;
  EXPECT_NE(out.find("layout: nhwc (model.layout: nhwc); reorders: pool.to_nchw (pool nhwc -> "
                     "nchw, before layer 'logits' (InnerProduct))"),
            std::string::npos)
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("pool\\.to_nchw +Reorder +\\[32, 4, 13, 13\\]")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("convolutions: 1 on (oneDNN|im2col)"))) << out;
  ASSERT_EQ(Cortado("inspect --config " + config + " --set model.layout=nchw", &out, &err), 0)
      << err;
  EXPECT_NE(out.find("layout: nchw (model.layout: nchw); reorders: none"), std::string::npos)
      << out;
  EXPECT_FALSE(std::regex_search(out, std::regex(" Reorder "))) << out;
  ASSERT_EQ(Cortado("inspect --config " + config, &out, &err), 0) << err;
  EXPECT_NE(out.find(ChannelsLastConv::Built() ? "layout: nhwc (model.layout: auto)"
                                               : "layout: nchw (model.layout: auto)"),
            std::string::npos)
      << out;
}

// Where 16-bit compute is slower than fp32 (no dot product for it on this CPU: fp16 anywhere,
// bf16 without AVX512_BF16, as CORTADO_CPU_ISA=avx2 makes it here) the log says so and points
// at fp32; where bf16 runs natively it does not.
TEST_F(CliTest, TheLogSaysWhen16BitComputeIsSlowerThanFp32) {
  WriteFashionSlice(dir_, "train", 40);
  const std::string config = Config();
  const std::string warning = "computes slower than fp32 here";
  std::string err;
  for (const char* isa : {"", "CORTADO_CPU_ISA=avx2 "}) {
    for (const char* compute : {"bf16", "fp16"}) {
      SCOPED_TRACE(StrCat(isa, compute));
      const bool slow =
          std::string(compute) == "fp16" || *isa != '\0' || !NativeBF16GemmAvailable();
      ASSERT_EQ(
          RunShell(StrCat(isa, "timeout 120 ", CortadoBinary(), " train --no-progress --config ",
                          config, " --set precision.compute=", compute, " --set checkpoint.dir=",
                          (dir_ / StrCat(compute, *isa != '\0' ? "_avx2" : "")).string(),
                          " --stop-at-iter 1"),
                   nullptr, &err),
          130)
          << err;
      EXPECT_EQ(err.find(warning) != std::string::npos, slow) << err;
      if (slow) {
        EXPECT_NE(err.find("use precision.compute: fp32"), std::string::npos) << err;
      }
    }
  }
}

TEST_F(CliTest, DryRunChecksEverythingAndLeavesNothingBehind) {
  const std::string config = Config();
  const fs::path ckpt = dir_ / "new" / "deeper" / "ckpt";
  const fs::path metrics = dir_ / "m" / "metrics.jsonl";
  std::string out, err;
  ASSERT_EQ(Cortado("train --dry-run --config " + config +
                        " --set checkpoint.dir=" + ckpt.string() + " --metrics " +
                        metrics.string() + " --trace " + (dir_ / "t" / "trace.json").string(),
                    &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("# resolved config"), std::string::npos) << out;
  EXPECT_NE(out.find(ckpt.string()), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("layer +type +output +params\n"))) << out;
  EXPECT_NE(out.find("total parameters: "), std::string::npos) << out;
  EXPECT_NE(out.find("data.train: 320 records"), std::string::npos) << out;
  EXPECT_NE(out.find("training: from iteration 0 to 20"), std::string::npos) << out;
  EXPECT_NE(out.find("dry run: "), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "new"));
  EXPECT_FALSE(fs::exists(dir_ / "m"));
  EXPECT_FALSE(fs::exists(dir_ / "t"));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt"));
  // An existing metrics file is left as it was: a fresh start would refuse it (as training
  // would), a continued run would append to it.
  fs::create_directories(dir_ / "m");
  std::ofstream(metrics) << "{\"event\":\"train\"}\n";
  EXPECT_EQ(
      Cortado("train --dry-run --config " + config + " --metrics " + metrics.string(), &out, &err),
      1);
  EXPECT_NE(err.find("--metrics '" + metrics.string() + "' already holds"), std::string::npos)
      << err;
  ASSERT_EQ(Cortado("train --dry-run --config " + config + " --metrics " + metrics.string() +
                        " --resume auto",
                    &out, &err),
            0)
      << err;
  EXPECT_EQ(ReadFileBytes(metrics), "{\"event\":\"train\"}\n");
  // What would fail in training fails here.
  std::ofstream(dir_ / "file") << "x";
  EXPECT_EQ(Cortado("train --dry-run --config " + config +
                        " --set checkpoint.dir=" + (dir_ / "file" / "ckpt").string(),
                    &out, &err),
            1);
  ExpectOneLineError(err, "train", "unwritable");
  EXPECT_NE(err.find("checkpoint.dir"), std::string::npos) << err;
  EXPECT_EQ(
      Cortado("train --dry-run --config " + config + " --set model.num_classes=3", &out, &err), 1);
  EXPECT_NE(err.find("model.num_classes is 3 but the data has labels up to 9"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace cortado
