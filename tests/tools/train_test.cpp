// End-to-end tests of `cortado train` / `cortado eval` on a small slice of Fashion-MNIST:
// config errors, resume that reproduces an uninterrupted run bit for bit, interruption by
// signal, refusal of corrupt checkpoints.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "engine/base/error.h"
#include "engine/io/checkpoint.h"
#include "tests/support/errors.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tools/run_config.h"
#include "tools/trainer.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;
using testing::ReadFileBytes;

class TrainTest : public tooltest::FashionDirTest {
 protected:
  TrainTest() : FashionDirTest("cortado_train", 320, 100) {}

  // A small conv net as a YAML graph; dropout and flips exercise the counter-based randomness.
  std::string Config(const std::string& extra = "") {
    std::ostringstream y;
    y << "seed: 3\n"
      << "model:\n"
      << "  layers:\n"
      << "    - {name: conv, type: Convolution, inputs: data, outputs: conv, num_output: 4, "
         "kernel: 3}\n"
      << "    - {name: bn, type: BatchNorm, inputs: conv, outputs: bn}\n"
      << "    - {name: relu, type: ReLU, inputs: bn, outputs: relu}\n"
      << "    - {name: pool, type: Pooling, inputs: relu, outputs: pool, pool: max, kernel: 2}\n"
      << "    - {name: drop, type: Dropout, inputs: pool, outputs: drop, ratio: 0.2}\n"
      << "    - {name: logits, type: InnerProduct, inputs: drop, outputs: logits, num_output: 10}\n"
      << kLossAndAccuracy << IdxData() << "  batch_size: 32\n"
      << "  flip: true\n"
      << "solver: {base_lr: 0.05, max_epochs: 3, warmup_epochs: 0.5, eval_interval: 1}\n"
      << "checkpoint: {dir: " << (dir_ / "ckpt").string() << ", every: 1, keep: 2}\n"
      << "log: {interval: 2}\n"
      << extra;
    fs::path path = dir_ / "run.yaml";
    std::ofstream(path) << y.str();
    return path.string();
  }
};

// The message of the error loading the config at path (with --set sets) raises.
std::string ErrorOf(const std::string& path, const std::vector<std::string>& sets = {}) {
  return testing::ErrorOf([&] { LoadRunConfig(path, sets); });
}

TEST_F(TrainTest, BadConfigsStopWithTheKeyAndPlace) {
  std::string path = Config("bogus: 1\n");
  std::string m = ErrorOf(path);
  EXPECT_NE(m.find("unknown key 'bogus'"), std::string::npos) << m;
  EXPECT_NE(m.find("run.yaml:"), std::string::npos) << m;

  m = ErrorOf(Config(), {"data.batch_size=-4"});
  EXPECT_NE(m.find("data.batch_size: must be a positive integer"), std::string::npos) << m;
  EXPECT_NE(m.find("--set data.batch_size=-4"), std::string::npos) << m;

  m = ErrorOf(Config(), {"solver.base_lr=fast"});
  EXPECT_NE(m.find("solver.base_lr: expected a number, got 'fast'"), std::string::npos) << m;

  m = ErrorOf(Config(), {"data.train=/nonexistent/train-images-idx3-ubyte.gz"});
  EXPECT_NE(m.find("data.train: '/nonexistent/train-images-idx3-ubyte.gz' does not exist"),
            std::string::npos)
      << m;

  m = ErrorOf(Config(), {"solver.momentun=0.9"});
  EXPECT_NE(m.find("unknown key 'solver.momentun'"), std::string::npos) << m;
  EXPECT_NE(m.find("--set solver.momentun=0.9"), std::string::npos) << m;

  m = ErrorOf(Config(), {"solver"});
  EXPECT_NE(m.find("--set 'solver': expected key.path=value"), std::string::npos) << m;

  m = ErrorOf(Config(), {"solver.max_iter=100"});
  EXPECT_NE(m.find("exactly one of max_epochs or max_iter"), std::string::npos) << m;

  m = ErrorOf(Config(), {"solver.lr_policy=exponential"});
  EXPECT_NE(m.find("solver.lr_policy: must be one of fixed, step, multistep, cosine, poly"),
            std::string::npos)
      << m;

  m = ErrorOf(Config(), {"model.layout=chw"});
  EXPECT_NE(m.find("model.layout: must be auto, nchw or nhwc, got 'chw'"), std::string::npos) << m;

  m = ErrorOf(Config(), {"precision.compute=fp8"});
  EXPECT_NE(m.find("precision.compute: must be fp32, fp64, bf16 or fp16, got 'fp8'"),
            std::string::npos)
      << m;
  m = ErrorOf(Config(), {"precision.loss_scale=large"});
  EXPECT_NE(m.find("precision.loss_scale: must be dynamic or a positive number, got 'large'"),
            std::string::npos)
      << m;
  m = ErrorOf(Config(), {"precision.loss_scale=128", "precision.growth_interval=10"});
  EXPECT_NE(m.find("precision.loss_scale: is static ('128')"), std::string::npos) << m;
  m = ErrorOf(Config(), {"precision.compute=fp16", "precision.backoff_factor=2"});
  EXPECT_NE(m.find("precision.backoff_factor: must be in (0, 1)"), std::string::npos) << m;

  m = ErrorOf(Config(), {"distributed.bucket_mb=0"});
  EXPECT_NE(m.find("distributed.bucket_mb: must be in (0, 4096]"), std::string::npos) << m;

  m = ErrorOf(Config(), {"distributed.backend=nccl"});
  EXPECT_NE(m.find("distributed.backend: must be cortado or mpi, got 'nccl'"), std::string::npos)
      << m;
}

TEST_F(TrainTest, BadLayerSettingNamesLayerAndLine) {
  RunConfig c = LoadRunConfig(Config(), {});
  c.model.layers[0].settings.Set("kernel", "three", "run.yaml:4:7");
  try {
    Trainer t(c);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'conv'"), std::string::npos) << m;
    EXPECT_NE(m.find("kernel"), std::string::npos) << m;
  }
}

// The train and eval records of a metrics file (a resumed run has a "resume" event more).
std::vector<std::string> Lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"start\"") == std::string::npos &&
        line.find("\"event\":\"resume\"") == std::string::npos) {
      out.push_back(line);
    }
  }
  return out;
}

// Timing fields differ from run to run; everything else must be identical.
std::string WithoutTiming(const std::string& line) {
  static const std::regex timing(
      ",\"(time|img_per_s|data_wait_s|compute_s|comm_wait_s|sync_bn_s|comm_cpu_s|comm_user_s|"
      "comm_system_s|comm_wakeups)\":[^,}]*");
  return std::regex_replace(line, timing, "");
}

// Trains the config uninterrupted into <dir>/a and interrupted at iteration 14 then resumed
// into <dir>/b, with `sets` applied to both, and expects the same metrics and final checkpoint
// bit for bit; returns the uninterrupted run's metrics lines.
std::vector<std::string> ExpectResumeBitForBit(const fs::path& dir_, const std::string& config,
                                               std::vector<std::string> sets) {
  auto with = [&](const std::string& folder) {
    std::vector<std::string> all = sets;
    all.push_back("checkpoint.dir=" + (dir_ / folder).string());
    return all;
  };
  // Uninterrupted.
  {
    Trainer t(LoadRunConfig(config, with("a")));
    TrainOptions o;
    o.metrics_path = (dir_ / "a.jsonl").string();
    EXPECT_EQ(t.Run(o), 0);
  }
  // Interrupted at iteration 14 (inside epoch 2), then resumed from the newest checkpoint.
  {
    Trainer t(LoadRunConfig(config, with("b")));
    TrainOptions o;
    o.metrics_path = (dir_ / "b.jsonl").string();
    o.stop_at = 14;
    EXPECT_EQ(t.Run(o), 130);
    EXPECT_EQ(t.iteration(), 14);
  }
  {
    Trainer t(LoadRunConfig(config, with("b")));
    TrainOptions o;
    o.metrics_path = (dir_ / "b.jsonl").string();
    o.resume = "auto";
    EXPECT_EQ(t.Run(o), 0);
  }
  std::vector<std::string> a = Lines(dir_ / "a.jsonl"), b = Lines(dir_ / "b.jsonl");
  EXPECT_EQ(a.size(), b.size());
  EXPECT_GT(a.size(), 10u);
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(WithoutTiming(a[i]), WithoutTiming(b[i])) << i;
  }
  // Same final weights, bit for bit.
  Checkpoint ca = LoadCheckpoint(ListCheckpoints((dir_ / "a").string())[0]);
  Checkpoint cb = LoadCheckpoint(ListCheckpoints((dir_ / "b").string())[0]);
  EXPECT_EQ(ca.tensors.size(), cb.tensors.size());
  for (size_t i = 0; i < std::min(ca.tensors.size(), cb.tensors.size()); ++i) {
    const Tensor& x = ca.tensors[i].second;
    const Tensor& y = cb.tensors[i].second;
    EXPECT_EQ(ca.tensors[i].first, cb.tensors[i].first);
    if (x.nbytes() != y.nbytes()) {
      ADD_FAILURE() << ca.tensors[i].first;
      continue;
    }
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << ca.tensors[i].first;
  }
  return a;
}

TEST_F(TrainTest, ResumeReproducesAnUninterruptedRunBitForBit) {
  std::vector<std::string> a = ExpectResumeBitForBit(dir_, Config(), {});
  // keep: 2 prunes older checkpoints.
  EXPECT_EQ(ListCheckpoints((dir_ / "a").string()).size(), 2u);
  // Metrics are JSON lines with the documented fields.
  EXPECT_NE(WithoutTiming(a[0]).find("{\"event\":\"train\",\"iter\":2,\"epoch\":"),
            std::string::npos)
      << a[0];
  bool saw_eval = false;
  for (const std::string& line : a)
    saw_eval |= line.find("\"event\":\"eval\"") != std::string::npos &&
                line.find("\"top5\":") != std::string::npos;
  EXPECT_TRUE(saw_eval);
}

// Mixed precision resumes bit for bit too: the loss scaler's scale and counters are in the
// checkpoint (with growth every 3 clean steps the scale changes across the interruption).
TEST_F(TrainTest, MixedPrecisionResumeReproducesAnUninterruptedRunBitForBit) {
  for (const char* compute : {"fp16", "bf16"}) {
    SCOPED_TRACE(compute);
    fs::remove_all(dir_ / "a");
    fs::remove_all(dir_ / "b");
    fs::remove(dir_ / "a.jsonl");
    fs::remove(dir_ / "b.jsonl");
    std::vector<std::string> a = ExpectResumeBitForBit(
        dir_, Config(),
        {std::string("precision.compute=") + compute, "precision.loss_scale=dynamic",
         "precision.init_scale=1024", "precision.growth_interval=3"});
    std::string last_train;
    for (const std::string& line : a) {
      if (line.find("\"event\":\"train\"") != std::string::npos) last_train = line;
    }
    // The scale is in the metrics, and grew: 1024 * 2^k after 3k clean steps.
    EXPECT_NE(last_train.find("\"loss_scale\":"), std::string::npos) << last_train;
    EXPECT_EQ(last_train.find("\"loss_scale\":1024,"), std::string::npos) << last_train;
    Checkpoint c = LoadCheckpoint(ListCheckpoints((dir_ / "a").string())[0]);
    const Tensor* state = c.Find("loss_scaler/state");
    ASSERT_NE(state, nullptr);
    EXPECT_GT(state->data<double>()[0], 1024.0);
    // Master weights are f32 and finite.
    const Tensor* w = c.Find("param/conv.weight");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->dtype(), DType::kF32);
    for (int64_t i = 0; i < w->numel(); ++i) ASSERT_TRUE(std::isfinite(w->data<float>()[i]));
  }
}

// A step whose gradients overflow is skipped (the weights and momentum stay as they were) and
// the scale halves; a static scale stops the run naming the iteration.
TEST_F(TrainTest, AnOverflowSkipsTheStepAndBacksOffTheScale) {
  const std::string config = Config();
  auto run = [&](const std::string& folder, int64_t stop_at, const std::string& scale) {
    Trainer t(LoadRunConfig(config, {"checkpoint.dir=" + (dir_ / folder).string(),
                                     "precision.compute=fp16", "precision.loss_scale=" + scale}));
    TrainOptions o;
    o.stop_at = stop_at;
    EXPECT_EQ(t.Run(o), 130);
    return LoadCheckpoint(ListCheckpoints((dir_ / folder).string())[0]);
  };
  Checkpoint before = run("before", 2, "dynamic");
  ::setenv("CORTADO_TEST_INF_GRADIENT", "0:2", 1);
  Checkpoint after = run("after", 3, "dynamic");
  const std::string err = testing::ErrorOf([&] { run("static", 3, "256"); });
  ::unsetenv("CORTADO_TEST_INF_GRADIENT");
  EXPECT_NE(err.find("the gradients are not finite at iteration 2 with the static loss scale 256"),
            std::string::npos)
      << err;
  for (const auto& [name, t] : before.tensors) {
    if (name.rfind("param/", 0) != 0 && name.rfind("momentum/", 0) != 0) continue;
    const Tensor* u = after.Find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(std::memcmp(t.raw_data(), u->raw_data(), t.nbytes()), 0) << name;
  }
  const double* s0 = before.Find("loss_scaler/state")->data<double>();
  const double* s1 = after.Find("loss_scaler/state")->data<double>();
  EXPECT_EQ(s1[0], s0[0] * 0.5);
  EXPECT_EQ(s1[2], s0[2] + 1);  // skipped steps
}

// An fp16 forward pass that overflows (inputs far beyond f16's range: data.std 1e-9) gives a
// non-finite loss. With a dynamic scale every such step is skipped and the scale backs off, as
// PyTorch's GradScaler does: the weights, momentum and batch-norm statistics stay as they were
// (the statistics forward moved to inf are put back). With loss_scale 1 the run stops naming
// the iteration.
TEST_F(TrainTest, AnOverflowingForwardPassSkipsTheStepWithADynamicScale) {
  const std::string model =
      "model:\n"
      "  layers:\n"
      "    - {name: conv, type: Convolution, inputs: data, outputs: conv, num_output: 4, "
      "kernel: 3}\n"
      "    - {name: relu, type: ReLU, inputs: conv, outputs: relu}\n"
      "    - {name: bn, type: BatchNorm, inputs: relu, outputs: bn}\n"
      "    - {name: logits, type: InnerProduct, inputs: bn, outputs: logits, num_output: 10}\n"
      "    - {name: loss, type: SoftmaxWithLoss, inputs: [logits, label], outputs: loss}\n";
  const fs::path path = dir_ / "overflow.yaml";
  std::ofstream(path) << "seed: 3\n"
                      << model << "data: {type: idx, train: "
                      << (dir_ / "train-images-idx3-ubyte.gz").string()
                      << ", batch_size: 16, std: [1.0e-9]}\n"
                      << "solver: {base_lr: 0.05, momentum: 0.9, max_iter: 3}\n"
                      << "checkpoint: {dir: " << (dir_ / "ckpt").string() << "}\n"
                      << "precision: {compute: fp16}\n";
  const RunConfig config = LoadRunConfig(path.string(), {});
  Checkpoint initial;
  Trainer(config).net().SaveState(initial);
  Trainer t(config);
  ASSERT_EQ(t.Run(TrainOptions{}), 0);
  const Checkpoint c = LoadCheckpoint(ListCheckpoints((dir_ / "ckpt").string())[0]);
  const double* state = c.Find("loss_scaler/state")->data<double>();
  EXPECT_EQ(state[2], 3) << "skipped steps";
  EXPECT_EQ(state[0], 65536.0 / 8);
  int compared = 0;
  for (const auto& [name, v] : initial.tensors) {
    if (name.rfind("param/", 0) != 0 && name.rfind("buffer/", 0) != 0) continue;
    const Tensor* u = c.Find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(std::memcmp(v.raw_data(), u->raw_data(), v.nbytes()), 0) << name;
    ++compared;
  }
  EXPECT_GE(compared, 8);  // conv, bn, logits parameters and bn's statistics
  const std::string err = testing::ErrorOf([&] {
    Trainer(LoadRunConfig(path.string(), {"precision.loss_scale=1",
                                          "checkpoint.dir=" + (dir_ / "unscaled").string()}))
        .Run(TrainOptions{});
  });
  EXPECT_NE(err.find("at iteration 0"), std::string::npos) << err;
}

// bf16 has no loss scale by default, and its gradients are checked all the same: a non-finite
// one stops the run naming the iteration, instead of reaching the weights.
TEST_F(TrainTest, WithoutALossScaleANonFiniteGradientStopsTheRunNamingTheIteration) {
  const std::string config = Config();
  ::setenv("CORTADO_TEST_INF_GRADIENT", "0:2", 1);
  const std::string err = testing::ErrorOf([&] {
    Trainer t(LoadRunConfig(config, {"precision.compute=bf16"}));
    TrainOptions o;
    o.stop_at = 4;
    t.Run(o);
  });
  ::unsetenv("CORTADO_TEST_INF_GRADIENT");
  EXPECT_NE(err.find("the gradients are not finite at iteration 2 without loss scaling"),
            std::string::npos)
      << err;
}

TEST_F(TrainTest, ResumeAutoWithoutCheckpointsStartsFresh) {
  Trainer t(LoadRunConfig(Config(), {"solver.max_epochs=1"}));
  TrainOptions o;
  o.resume = "auto";
  EXPECT_EQ(t.Run(o), 0);
  EXPECT_EQ(t.iteration(), 10);
}

TEST_F(TrainTest, ResumeSkipsACorruptNewestCheckpoint) {
  std::string config = Config();
  {
    Trainer t(LoadRunConfig(config, {}));
    TrainOptions o;
    o.stop_at = 20;
    ASSERT_EQ(t.Run(o), 130);
  }
  // Corrupt the newest (iteration 20); auto-resume falls back to iteration 10's checkpoint.
  std::vector<std::string> all = ListCheckpoints((dir_ / "ckpt").string());
  ASSERT_GE(all.size(), 2u);
  fs::resize_file(all[0], fs::file_size(all[0]) / 2);
  Trainer t(LoadRunConfig(config, {}));
  TrainOptions o;
  o.resume = "auto";
  o.stop_at = 11;
  EXPECT_EQ(t.Run(o), 130);
  EXPECT_EQ(t.iteration(), 11);
  // An explicit path to the corrupt file is refused.
  Trainer t2(LoadRunConfig(config, {}));
  TrainOptions o2;
  o2.resume = all[0];
  try {
    t2.Run(o2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

std::string RunError(Trainer& t, const TrainOptions& o) {
  try {
    t.Run(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A folder belongs to one run: a second fresh run there is refused before it writes anything
// (naming the folder, how the configs differ and the two ways on), and --overwrite starts over.
TEST_F(TrainTest, ASecondRunInTheSameFolderIsRefusedUnlessItStartsOver) {
  const std::string config = Config();
  const fs::path metrics = dir_ / "m.jsonl";
  TrainOptions o;
  o.metrics_path = metrics.string();
  {
    Trainer a(LoadRunConfig(config, {"solver.max_epochs=1"}));
    ASSERT_EQ(a.Run(o), 0);
  }
  const fs::path ckpt = dir_ / "ckpt" / CheckpointFileName(10);
  const std::string before = ReadFileBytes(ckpt), metrics_before = ReadFileBytes(metrics);
  {
    Trainer b(LoadRunConfig(config, {"solver.max_epochs=1", "seed=4"}));
    const std::string m = RunError(b, o);
    EXPECT_NE(m.find("checkpoint.dir '" + (dir_ / "ckpt").string() + "' holds 1 checkpoint(s)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("differs in seed"), std::string::npos) << m;
    EXPECT_NE(m.find("--resume auto"), std::string::npos) << m;
    EXPECT_NE(m.find("--overwrite"), std::string::npos) << m;
    EXPECT_EQ(b.iteration(), 0);
  }
  {
    Trainer b(LoadRunConfig(config, {"solver.max_epochs=1"}));
    EXPECT_NE(RunError(b, o).find("the same config as this run"), std::string::npos);
  }
  {
    // Its own checkpoint folder, but the earlier run's metrics file.
    Trainer b(LoadRunConfig(
        config, {"solver.max_epochs=1", "checkpoint.dir=" + (dir_ / "other").string()}));
    const std::string m = RunError(b, o);
    EXPECT_NE(m.find("--metrics '" + metrics.string() + "' already holds"), std::string::npos) << m;
  }
  EXPECT_EQ(ReadFileBytes(ckpt), before);
  EXPECT_EQ(ReadFileBytes(metrics), metrics_before);
  std::string first_run;
  {
    Trainer b(LoadRunConfig(config, {"solver.max_epochs=1", "seed=4"}));
    first_run = ReadCheckpointMeta(ckpt.string()).at("run_id");
    TrainOptions over = o;
    over.overwrite = true;
    ASSERT_EQ(b.Run(over), 0);
    EXPECT_NE(b.run_id(), first_run);
    EXPECT_EQ(ReadCheckpointMeta(ckpt.string()).at("run_id"), b.run_id());
    EXPECT_EQ(ReadCheckpointMeta(ckpt.string()).at("seed"), "4");
  }
  const std::string after = ReadFileBytes(metrics);
  EXPECT_EQ(testing::CountOf(after, "\"event\":\"start\""), 1u) << after;
}

// `keep` prunes the run's own checkpoints only: files of older Cortado versions (no run id)
// stay, and a continued run refuses a folder that holds another run's files.
TEST_F(TrainTest, KeepPrunesOnlyThisRunsCheckpoints) {
  const std::string config = Config();
  {
    Trainer a(LoadRunConfig(config, {}));
    TrainOptions o;
    o.stop_at = 10;
    ASSERT_EQ(a.Run(o), 130);
  }
  const std::string start = (dir_ / "ckpt" / CheckpointFileName(10)).string();
  const fs::path shared = dir_ / "shared";
  Checkpoint legacy = LoadCheckpoint(start);
  legacy.meta.erase("run_id");
  SaveCheckpoint(legacy, (shared / CheckpointFileName(5)).string());
  {
    Trainer b(LoadRunConfig(config, {"checkpoint.dir=" + shared.string(), "checkpoint.keep=1"}));
    TrainOptions o;
    o.resume = start;
    ASSERT_EQ(b.Run(o), 0);  // writes 20, then 30 and prunes 20
  }
  EXPECT_TRUE(fs::exists(shared / CheckpointFileName(5)));
  EXPECT_FALSE(fs::exists(shared / CheckpointFileName(20)));
  EXPECT_TRUE(fs::exists(shared / CheckpointFileName(30)));

  Checkpoint foreign = LoadCheckpoint(start);
  foreign.meta["run_id"] = "0123456789abcdef";
  SaveCheckpoint(foreign, (shared / CheckpointFileName(1)).string());
  Trainer c(LoadRunConfig(config, {"checkpoint.dir=" + shared.string()}));
  TrainOptions o;
  o.resume = start;
  const std::string m = RunError(c, o);
  EXPECT_NE(m.find("also holds checkpoints of another run (" + CheckpointFileName(1)),
            std::string::npos)
      << m;
}

// An unwritable checkpoint folder stops the run before its first step, not at its first
// checkpoint.
TEST_F(TrainTest, AnUnwritableCheckpointFolderStopsTheRunAtItsStart) {
  std::ofstream(dir_ / "a-file") << "x";
  const std::string bad = (dir_ / "a-file" / "ckpt").string();
  Trainer t(LoadRunConfig(Config(), {"checkpoint.dir=" + bad}));
  const std::string m = RunError(t, TrainOptions{});
  EXPECT_NE(m.find("checkpoint.dir '" + bad + "'"), std::string::npos) << m;
  EXPECT_EQ(t.iteration(), 0);
}

// Resuming with a changed config works, and says which keys changed from what to what.
TEST_F(TrainTest, ResumeWithAChangedConfigWarnsNamingTheKeys) {
  const std::string config = Config();
  {
    Trainer a(LoadRunConfig(config, {}));
    TrainOptions o;
    o.stop_at = 10;
    ASSERT_EQ(a.Run(o), 130);
  }
  Trainer b(LoadRunConfig(config, {"solver.base_lr=0.02", "solver.max_epochs=2"}));
  TrainOptions o;
  o.resume = "auto";
  ::testing::internal::CaptureStderr();
  const int code = b.Run(o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(code, 0) << err;
  EXPECT_NE(err.find("resuming with a config that differs"), std::string::npos) << err;
  EXPECT_NE(err.find("2 key(s)"), std::string::npos) << err;
  EXPECT_NE(err.find("solver.base_lr: 0.05 -> 0.02"), std::string::npos) << err;
  EXPECT_NE(err.find("solver.max_epochs: 3 -> 2"), std::string::npos) << err;
}

// Every shipped config parses (its data need not be on this machine), and the ImageNet
// recipes say what they claim.
TEST(ShippedConfigs, ParseAndTheImageNetRecipesHoldTheirSettings) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(CORTADO_SOURCE_DIR) / "configs")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    // Synthetic data: the datasets of the ImageNet configs are not on this machine. Detection
    // reads LMDBs only: its paths are taken as written.
    const bool detection = ReadFileBytes(e.path()).find("task: detection") != std::string::npos;
    if (detection) {
      EXPECT_NO_THROW(LoadRunConfig(e.path().string(), {}, true, /*check_data=*/false));
    } else {
      EXPECT_NO_THROW(LoadRunConfig(e.path().string(), {"data.type=synthetic"}, false));
    }
    ++n;
  }
  EXPECT_GE(n, 5);
  // SSD300 on VOC07+12: Caffe SSD's ssd_pascal.py recipe.
  const RunConfig ssd =
      LoadRunConfig(std::string(CORTADO_SOURCE_DIR) + "/configs/ssd300_voc.yaml", {}, true, false);
  EXPECT_EQ(ssd.model.builder, "ssd300_vgg16");
  EXPECT_EQ(ssd.model.num_classes, 21);
  EXPECT_EQ(ssd.data.task, "detection");
  EXPECT_EQ(ssd.data.batch_size, 32);
  EXPECT_EQ(ssd.data.resize, 300);
  EXPECT_DOUBLE_EQ(ssd.solver.schedule.base_lr, 1e-3);
  EXPECT_DOUBLE_EQ(ssd.solver.sgd.momentum, 0.9);
  EXPECT_DOUBLE_EQ(ssd.solver.sgd.weight_decay, 5e-4);
  EXPECT_EQ(ssd.solver.max_iter, 120000);
  EXPECT_EQ(ssd.solver.schedule.policy, LrPolicy::kMultistep);
  EXPECT_EQ(ssd.solver.schedule.milestones, (std::vector<double>{80000, 100000}));
  const RunConfig r50 = LoadRunConfig(std::string(CORTADO_SOURCE_DIR) + "/configs/resnet50.yaml",
                                      {"data.type=synthetic"}, false);
  EXPECT_EQ(r50.model.builder, "resnet50");
  EXPECT_DOUBLE_EQ(r50.model.label_smoothing, 0.1);
  EXPECT_TRUE(r50.model.zero_init_residual);
  EXPECT_DOUBLE_EQ(r50.solver.sgd.momentum, 0.875);
  EXPECT_DOUBLE_EQ(r50.solver.sgd.weight_decay, 3.0517578125e-05);
  EXPECT_TRUE(r50.solver.sgd.no_decay_bn_bias);
  EXPECT_EQ(r50.solver.schedule.policy, LrPolicy::kCosine);
  EXPECT_EQ(r50.solver.max_epochs, 90);
  // 0.256 per 256 images at the documented 8 ranks x 32.
  EXPECT_DOUBLE_EQ(r50.solver.schedule.base_lr, 0.256 * (8 * r50.data.batch_size) / 256.0);
  EXPECT_EQ(r50.data.crop, 224);
  EXPECT_EQ(r50.data.val_resize, 256);
  const RunConfig vgg = LoadRunConfig(std::string(CORTADO_SOURCE_DIR) + "/configs/vgg16.yaml",
                                      {"data.type=synthetic"}, false);
  EXPECT_EQ(vgg.model.builder, "vgg16");
  EXPECT_DOUBLE_EQ(vgg.solver.schedule.base_lr, 0.01 * (8 * vgg.data.batch_size) / 256.0);
}

// Runs the cortado binary; returns the exit code and captures stderr.
int RunCortado(const std::string& args, std::string* err) {
  std::string bin = std::string(CORTADO_BINARY_DIR) + "/tools/cortado";
  std::string errfile = fs::temp_directory_path() / ("cortado_err_" + std::to_string(getpid()));
  int status = std::system((bin + " " + args + " >/dev/null 2>" + errfile).c_str());
  *err = ReadFileBytes(errfile);
  fs::remove(errfile);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(TrainTest, CommandLineErrorsAreOneLine) {
  std::string config = Config();
  std::string err;
  for (const std::string& bad : std::vector<std::string>{
           "train --config " + config + " --set data.batch_size=-1",
           "train --config " + config + " --set nonsense",
           "train --config " + config + " --set data.train=/missing/train-images-idx3-ubyte.gz",
           std::string("train --config /missing.yaml"),
           "eval --config " + config + " --checkpoint /missing"}) {
    EXPECT_EQ(RunCortado(bad, &err), 1) << bad;
    EXPECT_EQ(err.rfind("cortado ", 0), 0u) << err;
    EXPECT_NE(err.find("error:"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST_F(TrainTest, SigintCheckpointsAndSaysHowToResume) {
  std::string config = Config();
  std::string bin = std::string(CORTADO_BINARY_DIR) + "/tools/cortado";
  std::string errfile = (dir_ / "err.txt").string();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen(errfile.c_str(), "w", stderr);
    freopen("/dev/null", "w", stdout);
    execl(bin.c_str(), bin.c_str(), "train", "--config", config.c_str(), "--set",
          "solver.max_epochs=100000", "--threads", "1", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait for training to start, then interrupt.
  for (int i = 0; i < 200; ++i) {
    if (ReadFileBytes(errfile).find("train iter") != std::string::npos) break;
    usleep(50000);
  }
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string err = ReadFileBytes(errfile);
  EXPECT_NE(err.find("--resume auto"), std::string::npos) << err;
  EXPECT_FALSE(ListCheckpoints((dir_ / "ckpt").string()).empty());
}

TEST_F(TrainTest, EvalCommandPrintsJson) {
  std::string config = Config();
  {
    Trainer t(LoadRunConfig(config, {"solver.max_epochs=1"}));
    ASSERT_EQ(t.Run(TrainOptions{}), 0);
  }
  std::string ckpt = ListCheckpoints((dir_ / "ckpt").string())[0];
  std::string bin = std::string(CORTADO_BINARY_DIR) + "/tools/cortado";
  FILE* p =
      popen((bin + " eval --config " + config + " --checkpoint " + ckpt + " --json").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512] = {0};
  ASSERT_NE(fgets(buf, sizeof(buf), p), nullptr);
  EXPECT_EQ(pclose(p), 0);
  std::string out = buf;
  if (!out.empty() && out.back() == '\n') out.pop_back();
  EXPECT_TRUE(std::regex_search(
      out,
      std::regex(R"(^\{"top1":[0-9.]+,"top5":[0-9.]+,"loss":[0-9.]+,"images":100,"skipped":0\}$)")))
      << out;
}

}  // namespace
}  // namespace cortado
