// Data-parallel training end to end, ranks as processes under `cortado launch` over TCP:
//   - W ranks with per-rank batch b change the parameters as one process with batch W*b and
//     the same global data order does, compared relative to that change (w_after - w_before):
//     LeNet, ResNet-20 with synchronized batch norm and a graph with dropout, flips and batch
//     norm in f64 within 1e-11; LeNet and ResNet-20 in f32 as near the f64 update as one
//     process in f32 is (kF32Flips, a bound that holds whichever kernels the CPU runs);
//   - an inf in one rank's reduced gradients skips the step on every rank (the one-word vote),
//     leaving weights, momentum, statistics and error-feedback residuals as they were; without
//     a loss scale it stops every rank naming the iteration;
//   - distributed.codec_overrides from the config file, in its written order;
//   - distributed.codec: auto plans alike on 2 and 3 ranks, re-plans at the same step on every
//     rank, and resumes bitwise;
//   - batch-norm groups of all ranks, of one rank and of two;
//   - overlap on and off give bitwise identical parameters, and so do the TCP and UCX transports;
//   - ranks on the test device (--device test, rank r on test:r) give the CPU's within 0.1 of the
//     update (its convolutions sum in another order, which epgc8's 8-bit levels amplify);
//   - mpirun (TCP and MPI backends) and srun's variables run the job `cortado launch` runs;
//   - evaluation over 3 ranks equals one process's, image for image;
//   - a config that differs between ranks stops every rank naming the rank and the line;
//   - a resumed run may change the rank count when the global batch is kept, and says why not
//     otherwise;
//   - a rank killed mid-training stops the others within 10 s naming it, and the newest
//     checkpoint resumes; SIGINT to the launcher checkpoints once and every rank exits 130;
//   - SIGINT to the launcher during the final evaluation stops every rank at the same batch,
//     with the training saved before it (and the log says its counts are per rank).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cortado/dist/ucx_transport.h"
#include "engine/io/checkpoint.h"
#include "engine/io/yaml_config.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tools/trainer.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;
using testing::ReadFileBytes;
using tooltest::CortadoBinary;
using tooltest::RunShell;
using tooltest::WaitExit;
using tooltest::WaitFor;

// ||a - b|| / ||b - start|| over every tensor whose name starts with `prefix` ("param/",
// "buffer/"), as one vector: the difference relative to what the run changed from `start` (the
// state both runs began in), so that a gradient that is wrong shows at its own scale and does
// not hide under the parameters' norm (a few steps move the weights by a small part of it).
// Without `start`, relative to ||b||. A per-element measure would be meaningless here: a ReLU
// whose input sits within rounding of zero switches on in one run and off in the other, which
// moves single gradient elements by percents (one process at another thread count does the
// same), while the update as a whole agrees to float precision.
double RelativeDifference(const Checkpoint& a, const Checkpoint& b, const std::string& prefix,
                          const Checkpoint* start = nullptr, std::string* worst = nullptr) {
  double diff = 0, norm = 0, worst_rel = -1;
  for (const auto& [name, t] : b.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    const Tensor* u = a.Find(name);
    if (u == nullptr || u->shape() != t.shape()) return INFINITY;
    const Tensor* s = start != nullptr ? start->Find(name) : nullptr;
    if (start != nullptr && (s == nullptr || s->shape() != t.shape())) return INFINITY;
    double d = 0, n = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = ElementAsDouble(*u, i), y = ElementAsDouble(t, i);
      const double moved = s != nullptr ? y - ElementAsDouble(*s, i) : y;
      d += (x - y) * (x - y);
      n += moved * moved;
    }
    diff += d;
    norm += n;
    const double rel = std::sqrt(d / std::max(n, 1e-300));
    if (worst != nullptr && rel > worst_rel) {
      worst_rel = rel;
      char text[32];
      std::snprintf(text, sizeof(text), " %.3g", rel);
      *worst = name + text;
    }
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

class DataParallelTest : public tooltest::FashionDirTest {
 protected:
  DataParallelTest() : FashionDirTest("cortado_dp", 480, 150) {}

  // A config with the given model section; flips and shuffling on, so the data order and the
  // augmentation must follow the global batch for the runs to agree.
  std::string Config(const std::string& model, const std::string& extra = "",
                     const std::string& lr = "base_lr: 0.05") {
    std::ostringstream y;
    y << "seed: 5\n"
      << model << IdxData() << "  flip: true\n"
      << "solver: {" << lr
      << ", momentum: 0.9, weight_decay: 1.0e-4, max_iter: 6, "
         "eval_interval: 0}\n"
      << "checkpoint: {every: 0}\n"
      << "log: {interval: 2}\n"
      << extra;
    fs::path path = dir_ / ("run" + std::to_string(configs_++) + ".yaml");
    std::ofstream(path) << y.str();
    return path.string();
  }

  // Trains with `ranks` ranks of per-rank batch `batch` into <dir>/<name>; returns the final
  // checkpoint. Extra arguments go to `cortado train`.
  // `env`: variables set for the run ("NAME=value ...").
  Checkpoint Train(const std::string& config, int ranks, int batch, const std::string& name,
                   const std::string& extra = "", std::string* log = nullptr,
                   const std::string& env = "") {
    const fs::path out = dir_ / name;
    std::string train = CortadoBinary() + " train --no-progress --threads 1 --config " + config +
                        " --set data.batch_size=" + std::to_string(batch) +
                        " --set checkpoint.dir=" + out.string() + " " + extra;
    std::string command =
        ranks == 1 ? train
                   : CortadoBinary() + " launch --nproc " + std::to_string(ranks) + " -- " + train;
    std::string err;
    const int code =
        RunShell((env.empty() ? "" : env + " ") + "timeout 300 " + command, nullptr, &err);
    EXPECT_EQ(code, 0) << command << "\n" << err;
    if (log) *log = err;
    std::vector<std::string> all = ListCheckpoints(out.string());
    if (all.empty()) {
      ADD_FAILURE() << "no checkpoint in " << out << "\n" << err;
      return Checkpoint{};
    }
    return LoadCheckpoint(all[0]);
  }

  // The parameters and batch-norm statistics a run of `config` starts from (every rank starts
  // from rank 0's, which are these).
  Checkpoint InitialState(const std::string& config) {
    Checkpoint c;
    Trainer(LoadRunConfig(config, {"checkpoint.dir=" + (dir_ / "initial").string()}))
        .net()
        .SaveState(c);
    return c;
  }

  // What run a changed from `start` (parameters and batch-norm statistics) within rel_tol of
  // what run b changed; with `momentum`, the momentum too (it starts at 0, so it is all
  // update: after one step it is the first gradient, weight decay included, the most direct
  // check of one data-parallel step).
  static void ExpectClose(const Checkpoint& a, const Checkpoint& b, const Checkpoint& start,
                          double rel_tol, bool momentum = false) {
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    ASSERT_FALSE(a.tensors.empty());
    const double params = RelativeDifference(a, b, "param/", &start);
    const double buffers = RelativeDifference(a, b, "buffer/", &start);
    std::string worst;
    const double moms = RelativeDifference(a, b, "momentum/", nullptr, &worst);
    EXPECT_LE(params, rel_tol);
    EXPECT_LE(buffers, rel_tol);
    if (momentum) {
      EXPECT_LE(moms, rel_tol);
    }
    std::printf(
        "difference relative to the update: parameters %.3g, buffers %.3g, momentum %.3g "
        "(most: %s)\n",
        params, buffers, moms, worst.c_str());
  }

  static void ExpectBitwiseEqual(const Checkpoint& a, const Checkpoint& b) {
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      const Tensor& x = a.tensors[i].second;
      const Tensor& y = b.tensors[i].second;
      ASSERT_EQ(x.nbytes(), y.nbytes()) << a.tensors[i].first;
      EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << a.tensors[i].first;
    }
  }

  int configs_ = 0;
};

const char* kLeNet = "model: {builder: lenet, num_classes: 10}\n";
const char* kResNet20 = "model: {builder: resnet20, num_classes: 10}\n";
// Batch norm, dropout and flips: everything whose randomness or statistics must follow the
// global batch.
const char* kGraph =
    "model:\n"
    "  layers:\n"
    "    - {name: conv, type: Convolution, inputs: data, outputs: conv, num_output: 6, kernel: 3}\n"
    "    - {name: bn, type: BatchNorm, inputs: conv, outputs: bn}\n"
    "    - {name: relu, type: ReLU, inputs: bn, outputs: relu}\n"
    "    - {name: pool, type: Pooling, inputs: relu, outputs: pool, pool: max, kernel: 2}\n"
    "    - {name: drop, type: Dropout, inputs: pool, outputs: drop, ratio: 0.3}\n"
    "    - {name: logits, type: InnerProduct, inputs: drop, outputs: logits, num_output: 10}\n"
    "    - {name: loss, type: SoftmaxWithLoss, inputs: [logits, label], outputs: loss}\n"
    "    - {name: top1, type: Accuracy, inputs: [logits, label], outputs: top1, top_k: 1}\n"
    "    - {name: top5, type: Accuracy, inputs: [logits, label], outputs: top5, top_k: 5}\n";

// Mixed precision across ranks: an inf put into rank 1's gradients after the all-reduce (so
// that rank 0's are finite and only the one-word vote can tell it) makes every rank skip the
// step. Nothing of it remains: rank 0's checkpoint after the skipped step has the weights,
// momentum and batch-norm statistics of the one before it, bitwise, the scale halved, and the
// error-feedback residuals of both ranks as they were (halved with the scale, which is exact).
TEST_F(DataParallelTest, AnOverflowOnOneRanksReducedGradientsSkipsTheStepOnEveryRank) {
  // init_scale 1024: no overflow of its own in these steps, so the skip is the injected one.
  const std::string config =
      Config(kGraph,
             "distributed: {codec: epgc8, rounding: stochastic, error_feedback: true, "
             "codec_keep_f32: []}\n"
             "precision: {compute: fp16, init_scale: 1024}\n");
  auto stopped_at = [&](int64_t iteration, const std::string& name) {
    const std::string ckpt_dir = (dir_ / name).string();
    std::string err;
    EXPECT_EQ(RunShell("timeout 300 " + CortadoBinary() + " launch --nproc 2 -- " +
                           CortadoBinary() + " train --no-progress --threads 1 --config " + config +
                           " --set data.batch_size=8 --set checkpoint.dir=" + ckpt_dir +
                           " --stop-at-iter " + std::to_string(iteration),
                       nullptr, &err),
              130)
        << err;
    return LoadCheckpoint(ListCheckpoints(ckpt_dir)[0]);
  };
  const Checkpoint before = stopped_at(3, "before");
  ::setenv("CORTADO_TEST_INF_GRADIENT", "1:3:reduced", 1);
  const Checkpoint after = stopped_at(4, "after");
  ::unsetenv("CORTADO_TEST_INF_GRADIENT");
  ASSERT_EQ(after.MetaInt("iteration"), 4);
  const double* s0 = before.Find("loss_scaler/state")->data<double>();
  const double* s1 = after.Find("loss_scaler/state")->data<double>();
  EXPECT_EQ(s0[2], 0) << "skipped steps before the injection";
  EXPECT_EQ(s1[2], 1) << "rank 0 did not skip the step whose gradients were finite on it";
  EXPECT_EQ(s1[0], s0[0] * 0.5);
  int residuals = 0;
  for (const auto& [name, t] : before.tensors) {
    const Tensor* u = after.Find(name);
    ASSERT_NE(u, nullptr) << name;
    if (name.rfind("error_feedback/", 0) == 0) {
      ++residuals;
      double norm = 0;
      for (int64_t i = 0; i < t.numel(); ++i) {
        norm += std::fabs(t.data<float>()[i]);
        ASSERT_EQ(u->data<float>()[i], t.data<float>()[i] * 0.5f) << name << " element " << i;
      }
      EXPECT_GT(norm, 0.0) << name << " is all zero: nothing to keep";
    } else if (name.rfind("param/", 0) == 0 || name.rfind("momentum/", 0) == 0 ||
               name.rfind("buffer/", 0) == 0) {
      EXPECT_EQ(std::memcmp(t.raw_data(), u->raw_data(), t.nbytes()), 0) << name;
    }
  }
  EXPECT_EQ(residuals, 2);

  // An inf before the all-reduce (overlap off: nothing is sent during backward) survives the
  // codec to every rank, and the step is skipped too.
  ::setenv("CORTADO_TEST_INF_GRADIENT", "1:3", 1);
  Checkpoint c8 = Train(config, 2, 8, "inf8", "--set distributed.overlap=false");
  ::unsetenv("CORTADO_TEST_INF_GRADIENT");
  EXPECT_EQ(c8.Find("loss_scaler/state")->data<double>()[2], 1.0);
  for (const auto& [name, t] : c8.tensors) {
    if (name.rfind("param/", 0) != 0 && name.rfind("error_feedback/", 0) != 0) continue;
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_TRUE(std::isfinite(ElementAsDouble(t, i))) << name;
  }
}

// bf16 without a loss scale: the same inf on rank 1 alone stops every rank, each naming the
// iteration (rank 0 learns it from the vote), instead of rank 1 updating with it.
TEST_F(DataParallelTest, WithoutALossScaleAnOverflowOnOneRankStopsEveryRankNamingTheIteration) {
  const std::string config = Config(kGraph, "precision: {compute: bf16}\n");
  ::setenv("CORTADO_TEST_INF_GRADIENT", "1:3:reduced", 1);
  std::string err;
  const int code =
      RunShell("timeout 300 " + CortadoBinary() + " launch --nproc 2 -- " + CortadoBinary() +
                   " train --no-progress --threads 1 --config " + config +
                   " --set data.batch_size=8 --set checkpoint.dir=" + (dir_ / "bf16").string(),
               nullptr, &err);
  ::unsetenv("CORTADO_TEST_INF_GRADIENT");
  EXPECT_NE(code, 0);
  for (const char* rank : {"[0] cortado train: error: ", "[1] cortado train: error: rank 1: "}) {
    EXPECT_NE(err.find(std::string(rank) + "the gradients are not finite at iteration 3"),
              std::string::npos)
        << err;
  }
}

// The exact comparison runs in f64 (precision.compute: fp64): rounding is 1e-16 there, and the
// runs' updates agree to about 1e-14 of their size, which checks what data parallelism
// promises: the same samples, augmentations, statistics and averages.
//
// In f32 no two runs are exact: other GEMM shapes and kernels (oneDNN's AVX2 and AVX-512 sets
// sum in other orders) round differently, and a ReLU input within rounding of zero then
// switches on in one run and off in the other, moving the gradients of every layer before it.
// So the f32 runs are held to the exact update: one process and W ranks alike within
// kF32Flips of f64's first momentum (the first gradient, weight decay included). Measured on
// this slice: one flipped ReLU moves it by 9e-4 (3 ranks, AVX2 kernels) to 3.5e-3 (one
// process, AVX-512 kernels), no flip by 1e-6; the bound allows several flips and stays 20x
// below what per-rank batch statistics do (0.66 on 2 ranks, 0.86 on 3), which the test
// asserts, so that it shows the bound can fail.
constexpr double kF32Flips = 3e-2;

// LeNet has no batch norm: the exact claim in f64, and f32 held to f64's update as below.
TEST_F(DataParallelTest, LeNetOnTwoAndThreeRanksEqualsOneProcessWithTheCombinedBatch) {
  const std::string f32 = Config(kLeNet);
  const std::string f64 = Config(kLeNet, "precision: {compute: fp64}\n");
  const Checkpoint start = InitialState(f64);
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    const std::string tag = std::to_string(ranks);
    Checkpoint one = Train(f64, 1, 8 * ranks, "one" + tag);
    Checkpoint many = Train(f64, ranks, 8, "many" + tag);
    ExpectClose(many, one, start, 1e-11);
    Checkpoint one32 = Train(f32, 1, 8 * ranks, "one32_" + tag);
    Checkpoint many32 = Train(f32, ranks, 8, "many32_" + tag);
    const double own = RelativeDifference(one32, one, "param/", &start);
    const double parallel = RelativeDifference(many32, one, "param/", &start);
    EXPECT_LE(own, kF32Flips);
    EXPECT_LE(parallel, kF32Flips);
    std::printf("f32 update after 6 steps against f64's: one process %.3g, %d ranks %.3g\n", own,
                ranks, parallel);
  }
}

TEST_F(DataParallelTest, ResNet20WithSyncBatchNormEqualsOneProcess) {
  const std::string f64 = Config(
      kResNet20, "distributed: {sync_bn: true}\nprecision: {compute: fp64}\n", "base_lr: 0.02");
  const std::string f32 = Config(kResNet20, "distributed: {sync_bn: true}\n", "base_lr: 0.02");
  const std::string f32_local =
      Config(kResNet20, "distributed: {sync_bn: false}\n", "base_lr: 0.02");
  const Checkpoint start64 = InitialState(f64);
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    const std::string tag = std::to_string(ranks);
    Checkpoint one = Train(f64, 1, 4 * ranks, "one" + tag, "--set solver.max_iter=3");
    Checkpoint many = Train(f64, ranks, 4, "many" + tag, "--set solver.max_iter=3");
    ExpectClose(many, one, start64, 1e-11, true);
    // f32, one step, against the exact (f64) update: within kF32Flips, as one process in f32.
    Checkpoint one32 = Train(f32, 1, 4 * ranks, "one32_" + tag, "--set solver.max_iter=1");
    Checkpoint many32 = Train(f32, ranks, 4, "many32_" + tag, "--set solver.max_iter=1");
    Checkpoint one64 = Train(f64, 1, 4 * ranks, "one64_" + tag, "--set solver.max_iter=1");
    const double own = RelativeDifference(one32, one64, "momentum/");
    const double parallel = RelativeDifference(many32, one64, "momentum/");
    EXPECT_LE(own, kF32Flips) << "one process in f32 is farther from f64 than the bound assumes";
    EXPECT_LE(parallel, kF32Flips);
    // What the bound must catch: per-rank batch statistics (sync_bn off) move the update by
    // most of itself.
    Checkpoint local32 = Train(f32_local, ranks, 4, "local32_" + tag, "--set solver.max_iter=1");
    const double local = RelativeDifference(local32, one64, "momentum/");
    EXPECT_GT(local, 10 * kF32Flips);
    std::printf(
        "f32 first update against f64's: one process %.3g, %d ranks %.3g, %d ranks without "
        "sync_bn %.3g (bound %.3g)\n",
        own, ranks, parallel, ranks, local, kF32Flips);
  }
}

TEST_F(DataParallelTest, DropoutFlipsAndSyncBatchNormFollowTheGlobalBatch) {
  const std::string k = "--set solver.max_iter=3";
  const std::string config =
      Config(kGraph, "distributed: {sync_bn: true}\nprecision: {compute: fp64}\n", "base_lr: 0.02");
  const Checkpoint start = InitialState(config);
  Checkpoint one = Train(config, 1, 12, "one", k);
  Checkpoint three = Train(config, 3, 4, "three", k);
  ExpectClose(three, one, start, 1e-11, true);
  // Without synchronization each rank normalizes with its own statistics: no longer equal,
  // which shows the test above can fail.
  const std::string local = Config(
      kGraph, "distributed: {sync_bn: false}\nprecision: {compute: fp64}\n", "base_lr: 0.02");
  Checkpoint three_local = Train(local, 3, 4, "three_local", k);
  EXPECT_GT(RelativeDifference(three_local, one, "momentum/"), 1e-3);
}

// sync_bn_group: groups of all ranks are one process's statistics, groups of one are per-rank
// statistics (the same as sync_bn: false, bit for bit), and groups of two are neither.
TEST_F(DataParallelTest, SyncBatchNormGroupsSpanTheirRanksOnly) {
  const std::string k = "--set solver.max_iter=2";
  auto config = [&](const std::string& distributed) {
    return Config(kGraph, "distributed: {" + distributed + "}\nprecision: {compute: fp64}\n",
                  "base_lr: 0.02");
  };
  const Checkpoint start = InitialState(config("sync_bn: true"));
  Checkpoint one = Train(config("sync_bn: true"), 1, 8, "one", k);
  Checkpoint all = Train(config("sync_bn: true, sync_bn_group: 4"), 4, 2, "all", k);
  Checkpoint pairs = Train(config("sync_bn: true, sync_bn_group: 2"), 4, 2, "pairs", k);
  Checkpoint singles = Train(config("sync_bn: true, sync_bn_group: 1"), 4, 2, "singles", k);
  Checkpoint local = Train(config("sync_bn: false"), 4, 2, "local", k);
  ExpectClose(all, one, start, 1e-11, true);
  ExpectBitwiseEqual(singles, local);
  EXPECT_GT(RelativeDifference(pairs, one, "momentum/"), 1e-4);
  EXPECT_GT(RelativeDifference(pairs, local, "momentum/"), 1e-4);
  // A group size that does not divide the world is refused before training.
  std::string err;
  const std::string bad = config("sync_bn: true, sync_bn_group: 3");
  EXPECT_NE(RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 4 -- " + CortadoBinary() +
                         " train --no-progress --threads 1 --config " + bad +
                         " --set checkpoint.dir=" + (dir_ / "bad").string(),
                     nullptr, &err),
            0);
  EXPECT_NE(err.find("distributed.sync_bn_group is 3, which does not divide the world size 4"),
            std::string::npos)
      << err;
}

TEST_F(DataParallelTest, OverlapOnAndOffGiveBitwiseIdenticalParameters) {
  // Small buckets, so that many all-reduces overlap backward.
  const std::string config =
      Config(kResNet20, "distributed: {sync_bn: true, bucket_mb: 0.1, first_bucket_mb: 0.02}\n");
  Checkpoint on = Train(config, 3, 4, "on", "--set distributed.overlap=true");
  Checkpoint off = Train(config, 3, 4, "off", "--set distributed.overlap=false");
  ExpectBitwiseEqual(on, off);
}

// `cortado launch` with --device test: rank r trains on test:r, its buckets copied through
// pinned host staging while backward runs, and the job equals the same ranks on the CPU, through
// rank 0's start-up broadcast and a codec with error feedback to the checkpoint: within 0.1 of the
// update. The test device's convolutions and inner products sum in another order than the CPU's
// GEMMs (tests/engine/net_on_test_device_test.cpp), and epgc8 turns the few gradient elements
// that this rounding puts on either side of an 8-bit level into one level's difference (1.8e-3 of
// the update on the parameters, 1.5e-2 on the momentum when this was written); an error of the
// device path (a bucket from the wrong place) is of the order of the update itself.
TEST_F(DataParallelTest, RanksOnTheTestDeviceTrainAsOnTheCpu) {
  const std::string config =
      Config(kLeNet,
             "distributed: {bucket_mb: 0.1, first_bucket_mb: 0.02, codec: epgc8, "
             "error_feedback: true}\n");
  Checkpoint cpu = Train(config, 2, 4, "cpu");
  Checkpoint test = Train(config, 2, 4, "test", "--device test");
  ASSERT_NE(test.Find("error_feedback/rank1"), nullptr);
  ExpectClose(cpu, test, InitialState(config), 0.1, /*momentum=*/true);
}

// The transport carries bytes; it must not change one bit of the result (the reductions run in
// the same order whatever carries their chunks). Small buckets run halving-doubling on both;
// with the default buckets, the first (about 1 MB) runs the ring over TCP and, over UCX on one
// host, the direct all-reduce on the shared gradient block, which adds in the ring's order.
TEST_F(DataParallelTest, UcxAndTcpTransportsGiveBitwiseIdenticalParameters) {
  if (!dist::HasUcxTransport()) {
    GTEST_SKIP() << "the UCX transport is not built (libucx-dev was not found at configure time)";
  }
  const std::string small =
      Config(kResNet20, "distributed: {sync_bn: true, bucket_mb: 0.1, first_bucket_mb: 0.02}\n");
  Checkpoint tcp = Train(small, 3, 4, "tcp", "--set distributed.transport=tcp");
  Checkpoint ucx = Train(small, 3, 4, "ucx", "--set distributed.transport=ucx");
  ExpectBitwiseEqual(tcp, ucx);
  const std::string large = Config(kResNet20, "distributed: {sync_bn: true}\n");
  std::string tcp_log, ucx_log;
  Checkpoint tcp_ring = Train(large, 3, 4, "tcp-ring", "--set distributed.transport=tcp", &tcp_log);
  Checkpoint ucx_direct =
      Train(large, 3, 4, "ucx-direct", "--set distributed.transport=ucx", &ucx_log);
  EXPECT_NE(tcp_log.find("all-reduce ring"), std::string::npos) << tcp_log;
  EXPECT_NE(ucx_log.find("all-reduce direct"), std::string::npos) << ucx_log;
  ExpectBitwiseEqual(tcp_ring, ucx_direct);
}

// A TCP port that was free a moment ago (bound to port 0 and released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// The same job started by Open MPI's mpirun (over Cortado's TCP transport and over the MPI
// backend) and by Slurm's srun (its variables, set here by hand: no Slurm on this machine) ends
// where `cortado launch` ends.
TEST_F(DataParallelTest, MpirunAndSrunRunTheSameJobAsCortadoLaunch) {
  const std::string config =
      Config(kGraph, "distributed: {sync_bn: true}\nprecision: {compute: fp64}\n", "base_lr: 0.02");
  const std::string k = "--set solver.max_iter=3";
  const Checkpoint start = InitialState(config);
  Checkpoint launched = Train(config, 2, 4, "launch", k);
  auto train = [&](const std::string& name, const std::string& extra) {
    return CortadoBinary() + " train --no-progress --threads 1 --config " + config +
           " --set data.batch_size=4 --set checkpoint.dir=" + (dir_ / name).string() + " " + k +
           " " + extra;
  };
  auto final_checkpoint = [&](const std::string& name) {
    std::vector<std::string> all = ListCheckpoints((dir_ / name).string());
    return all.empty() ? Checkpoint{} : LoadCheckpoint(all[0]);
  };
  const std::string mpirun = "timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 ";
  for (const char* backend : {"tcp", "mpi"}) {
    SCOPED_TRACE(backend);
    const std::string name = std::string("mpirun_") + backend;
    std::string err;
    ASSERT_EQ(RunShell(mpirun + train(name, std::string("--set distributed.backend=") + backend),
                       nullptr, &err),
              0)
        << err;
    EXPECT_NE(err.find(std::string("data-parallel: 2 ranks (") + backend + ")"), std::string::npos)
        << err;
    ExpectClose(final_checkpoint(name), launched, start, 1e-12, true);
  }
  // The MPI backend outside mpirun would make each process a job of one: refused.
  {
    std::string err;
    EXPECT_NE(RunShell("timeout 60 " + CortadoBinary() + " launch --nproc 2 -- " +
                           train("launch_mpi", "--set distributed.backend=mpi"),
                       nullptr, &err),
              0);
    EXPECT_NE(err.find("this process is a 1-rank MPI job while its launcher (cortado) started 2 "
                       "ranks"),
              std::string::npos)
        << err;
    EXPECT_TRUE(ListCheckpoints((dir_ / "launch_mpi").string()).empty());
  }
  // srun sets these for every task; rank 0's store is on the first node of the list (the port
  // Cortado would derive from the job id could be taken on a shared machine: pick a free one).
  const int port = FreePort();
  ASSERT_GT(port, 0);
  std::string srun;
  for (int r = 0; r < 2; ++r) {
    srun += "SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID=" + std::to_string(r) +
            " SLURM_NTASKS=2 SLURM_LOCALID=" + std::to_string(r) +
            " SLURM_NTASKS_PER_NODE=2 SLURM_JOB_NODELIST=localhost CORTADO_MASTER_PORT=" +
            std::to_string(port) + " " + train("srun", "") + " & ";
  }
  std::string err;
  ASSERT_EQ(RunShell("timeout 120 sh -c '" + srun + "wait'", nullptr, &err), 0) << err;
  EXPECT_NE(err.find("data-parallel: 2 ranks (tcp)"), std::string::npos) << err;
  ExpectClose(final_checkpoint("srun"), launched, start, 1e-12, true);
}

// --trace: one Chrome trace per rank with every layer's forward and backward, the buckets'
// all-reduces, the solver's wait, the data wait, the update and synchronized batch norm, on
// one clock (the ranks' iterations overlap in time).
TEST_F(DataParallelTest, TraceRecordsEveryRanksStepsOnOneClock) {
  const std::string config =
      Config(kGraph,
             "distributed: {sync_bn: true, bucket_mb: 0.001, first_bucket_mb: 0.001, "
             "last_bucket_mb: 0.001}\n");
  Train(config, 2, 4, "run",
        "--trace " + (dir_ / "t.json").string() + " --trace-iters 3 --metrics " +
            (dir_ / "m.jsonl").string());
  EXPECT_FALSE(fs::exists(dir_ / "t.json"));
  double first_begin[2] = {0, 0}, last_end[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const fs::path path = dir_ / ("t.rank" + std::to_string(r) + ".json");
    ASSERT_TRUE(fs::exists(path));
    nlohmann::json doc = nlohmann::json::parse(ReadFileBytes(path));
    std::map<std::string, int> count;  // "category/name"
    first_begin[r] = 1e300;
    double bucket_cpu_ms = 0;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      count[e["cat"].get<std::string>() + "/" + e["name"].get<std::string>()] += 1;
      // Each bucket's span carries what it cost the communicator's thread.
      if (e["name"].get<std::string>().rfind("all-reduce bucket", 0) == 0) {
        for (const char* key : {"cpu_ms", "user_ms", "system_ms", "wakeups"}) {
          EXPECT_TRUE(e["args"].contains(key)) << key;
          EXPECT_GE(e["args"].value(key, -1.0), 0.0) << key;
        }
        bucket_cpu_ms += e["args"].value("cpu_ms", 0.0);
      }
      first_begin[r] = std::min(first_begin[r], e["ts"].get<double>());
      last_end[r] = std::max(last_end[r], e["ts"].get<double>() + e["dur"].get<double>());
      EXPECT_EQ(e["pid"], r);
    }
    // The ReLU after bn runs inside it (the net's fusion rewrite, engine/graph/net.h).
    EXPECT_EQ(count["forward/relu"], 0);
    for (const char* layer : {"conv", "bn", "pool", "drop", "logits", "loss"}) {
      EXPECT_EQ(count[std::string("forward/") + layer], 3) << layer;
    }
    for (const char* layer : {"conv", "bn", "logits"}) {
      EXPECT_EQ(count[std::string("backward/") + layer], 3) << layer;
    }
    EXPECT_EQ(count["data/data wait"], 3);
    EXPECT_EQ(count["solver/update"], 3);
    EXPECT_EQ(count["comm/wait for gradients"], 3);
    EXPECT_EQ(count["comm/batch-norm statistics"], 6);  // forward and backward, each step
    // Tiny buckets: several all-reduces per step, each recorded once per step.
    EXPECT_EQ(count["comm/all-reduce bucket 0"], 3);
    EXPECT_EQ(count["comm/all-reduce bucket 1"], 3);
    EXPECT_GT(bucket_cpu_ms, 0.0);
  }
  // The metrics (rank 0's) carry the communicator thread's CPU time and wake-ups per interval.
  int train_records = 0;
  std::ifstream metrics(dir_ / "m.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    nlohmann::json m = nlohmann::json::parse(line);
    if (m["event"] != "train") continue;
    ++train_records;
    for (const char* key : {"comm_cpu_s", "comm_user_s", "comm_system_s", "comm_wakeups"}) {
      ASSERT_TRUE(m.contains(key)) << key << " in " << line;
      EXPECT_GE(m[key].get<double>(), 0.0) << key;
    }
    EXPECT_GT(m["comm_cpu_s"].get<double>(), 0.0) << line;
  }
  EXPECT_GT(train_records, 0);
  // The two ranks ran the same steps at the same time: their spans overlap.
  EXPECT_LT(std::max(first_begin[0], first_begin[1]), std::min(last_end[0], last_end[1]));
  // A trace that cannot be written stops the run before training, naming the path.
  std::string err;
  EXPECT_NE(
      RunShell("timeout 60 " + CortadoBinary() + " train --no-progress --config " + config +
                   " --set checkpoint.dir=" + (dir_ / "bad").string() + " --trace /proc/no/t.json",
               nullptr, &err),
      0);
  EXPECT_NE(err.find("--trace: cannot write trace file '/proc/no/t.json'"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("train iter"), std::string::npos) << err;
}

// Parses the JSON line that `cortado eval --json` prints (after the launcher's "[0] ").
std::map<std::string, double> EvalJson(const std::string& out) {
  std::smatch m;
  std::map<std::string, double> r;
  static const std::regex field("\"(top1|top5|loss|images)\":([0-9.e+-]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), field); it != std::sregex_iterator();
       ++it) {
    r[(*it)[1]] = std::stod((*it)[2]);
  }
  return r;
}

TEST_F(DataParallelTest, EvaluationOverThreeRanksEqualsOneProcess) {
  const std::string config = Config(kLeNet);
  Train(config, 1, 16, "model");
  const std::string ckpt = ListCheckpoints((dir_ / "model").string())[0];
  // 150 images: 50 per rank in batches of 16, with a short last batch on every rank.
  const std::string eval = CortadoBinary() + " eval --threads 1 --json --config " + config +
                           " --checkpoint " + ckpt + " --set data.batch_size=16";
  std::string out1, out3, err;
  ASSERT_EQ(RunShell("timeout 120 " + eval, &out1, &err), 0) << err;
  ASSERT_EQ(
      RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 3 -- " + eval, &out3, &err), 0)
      << err;
  auto a = EvalJson(out1), b = EvalJson(out3);
  ASSERT_EQ(a.size(), 4u) << out1;
  ASSERT_EQ(b.size(), 4u) << out3;
  EXPECT_EQ(a["images"], 150);
  EXPECT_EQ(b["images"], 150);
  EXPECT_EQ(a["top1"], b["top1"]);
  EXPECT_EQ(a["top5"], b["top5"]);
  EXPECT_NEAR(a["loss"], b["loss"], 1e-5 * a["loss"]);
  // Only rank 0 prints the result.
  EXPECT_EQ(std::count(out3.begin(), out3.end(), '\n'), 1) << out3;
}

TEST_F(DataParallelTest, ADifferentConfigOnOneRankStopsEveryRankNamingIt) {
  const std::string config = Config(kLeNet);
  // Rank 1 gets another learning rate through its environment.
  std::string err;
  const int code = RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 2 -- sh -c '" +
                                CortadoBinary() + " train --no-progress --threads 1 --config " +
                                config + " --set checkpoint.dir=" + (dir_ / "x").string() +
                                " --set solver.base_lr=0.0$((5 + CORTADO_RANK))'",
                            nullptr, &err);
  EXPECT_NE(code, 0);
  EXPECT_NE(err.find("rank(s) 1 do not run the same job as rank 0"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 1 has 'config: solver.base_lr: 0.06'"), std::string::npos) << err;
  EXPECT_NE(err.find("where rank 0 has 'config: solver.base_lr: 0.05'"), std::string::npos) << err;
  EXPECT_TRUE(ListCheckpoints((dir_ / "x").string()).empty());
}

TEST_F(DataParallelTest, ResumeOnOtherRankCountsKeepsTheGlobalBatch) {
  const std::string config = Config(kLeNet);
  const std::string ckpt_dir = (dir_ / "run").string();
  auto train = [&](int ranks, int batch, const std::string& extra, std::string* err) {
    std::string t = CortadoBinary() + " train --no-progress --threads 1 --config " + config +
                    " --set checkpoint.dir=" + ckpt_dir +
                    " --set data.batch_size=" + std::to_string(batch) + " " + extra;
    return RunShell(
        "timeout 120 " + CortadoBinary() + " launch --nproc " + std::to_string(ranks) + " -- " + t,
        nullptr, err);
  };
  std::string err;
  ASSERT_EQ(train(2, 12, "--stop-at-iter 3", &err), 130) << err;
  // 3 ranks x 8 = 24 = 2 x 12: resumes and finishes.
  ASSERT_EQ(train(3, 8, "--resume auto", &err), 0) << err;
  EXPECT_EQ(LoadCheckpoint(ListCheckpoints(ckpt_dir)[0]).MetaInt("iteration"), 6);
  // 3 ranks x 12 = 36: refused, saying what would work.
  EXPECT_NE(train(3, 12, "--resume " + ListCheckpoints(ckpt_dir)[0], &err), 0);
  EXPECT_NE(err.find("global batch of 24 (3 rank(s) x 8), this run's is 36 (3 x 12)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("--set data.batch_size=8"), std::string::npos) << err;
}

// Compressed gradients: an f16 run stays within rounding of the f32 run, epgc8 further away
// but still close (and not equal: the codec is really used); the log says what travels.
TEST_F(DataParallelTest, CompressedGradientsTrainCloseToF32) {
  const std::string config = Config(kLeNet);
  const Checkpoint start = InitialState(config);
  Checkpoint f32 = Train(config, 2, 8, "f32");
  Checkpoint f16 = Train(config, 2, 8, "f16", "--set distributed.codec=f16");
  Checkpoint e8 = Train(config, 2, 8, "epgc8", "--set distributed.codec=epgc8");
  const double d16 = RelativeDifference(f16, f32, "param/", &start);
  const double d8 = RelativeDifference(e8, f32, "param/", &start);
  std::printf("difference from f32 relative to the update after 6 steps: f16 %.3g, epgc8 %.3g\n",
              d16, d8);
  EXPECT_GT(d16, 0.0);
  EXPECT_LT(d16, 2e-3);
  EXPECT_GT(d8, d16);
  EXPECT_LT(d8, 0.2);
  std::string out, err;
  ASSERT_EQ(RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 2 -- " + CortadoBinary() +
                         " train --no-progress --threads 1 --config " + config +
                         " --set checkpoint.dir=" + (dir_ / "log").string() +
                         " --set distributed.codec=epgc9 --set distributed.rounding=stochastic",
                     &out, &err),
            0)
      << err;
  EXPECT_NE((out + err).find("codecs epgc9, f32 (stochastic)"), std::string::npos) << out << err;
  EXPECT_NE((out + err).find("sent per step instead of"), std::string::npos) << out << err;
}

// Error feedback with stochastic rounding: the residuals are checkpointed per rank, so a run
// stopped and resumed ends bitwise where the uninterrupted run ends.
TEST_F(DataParallelTest, ErrorFeedbackResumesBitwise) {
  const std::string config = Config(
      kResNet20, "distributed: {codec: epgc8, rounding: stochastic, error_feedback: true}\n");
  Checkpoint whole = Train(config, 2, 8, "whole");
  const std::string ckpt_dir = (dir_ / "parts").string();
  const std::string train = CortadoBinary() + " launch --nproc 2 -- " + CortadoBinary() +
                            " train --no-progress --threads 1 --config " + config +
                            " --set data.batch_size=8 --set checkpoint.dir=" + ckpt_dir;
  std::string err;
  ASSERT_EQ(RunShell("timeout 300 " + train + " --stop-at-iter 3", nullptr, &err), 130) << err;
  Checkpoint half = LoadCheckpoint(ListCheckpoints(ckpt_dir)[0]);
  ASSERT_EQ(half.Meta("error_feedback_ranks"), "2");
  ASSERT_NE(half.Find("error_feedback/rank1"), nullptr);
  double norm = 0;
  for (int64_t i = 0; i < half.Find("error_feedback/rank1")->numel(); ++i) {
    norm += std::fabs(ElementAsDouble(*half.Find("error_feedback/rank1"), i));
  }
  EXPECT_GT(norm, 0.0) << "the residual of rank 1 is all zero";
  ASSERT_EQ(RunShell("timeout 300 " + train + " --resume auto", nullptr, &err), 0) << err;
  Checkpoint resumed = LoadCheckpoint(ListCheckpoints(ckpt_dir)[0]);
  ASSERT_EQ(resumed.MetaInt("iteration"), 6);
  ExpectBitwiseEqual(resumed, whole);
}

// distributed.codec: auto over 2 and 3 ranks, with the link fixed by CORTADO_AUTO_LINK so that
// the plans are known: 10 KB/s until iteration 3 (nothing hides: every auto bucket in epgc8
// after the 2 warmup steps in f32), then 1 TB/s (the check after iteration 3 sees the rate
// move and plans again: the first-ready bucket goes back to f32). Each rank's trace shows the
// same codec for every bucket at every step, so the codecs changed at the same step
// everywhere; rank 0 logs both plans, and its metrics carry the plan.
TEST_F(DataParallelTest, AutoCodecsPlanAlikeOnEveryRankAndReplanAtTheSameStep) {
  const std::string config =
      Config(kResNet20,
             "distributed: {codec: auto, auto_warmup_steps: 2, auto_interval: 2, "
             "auto_max_residual_ratio: 1.0e9, bucket_mb: 0.05, first_bucket_mb: 0.01, "
             "last_bucket_mb: 0.01}\n");
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(ranks);
    const std::string name = "auto" + std::to_string(ranks);
    std::string log;
    Train(config, ranks, 4, name,
          "--trace " + (dir_ / (name + ".json")).string() + " --trace-iters 6 --metrics " +
              (dir_ / (name + ".jsonl")).string(),
          &log, "CORTADO_AUTO_LINK=1e4,3:1e12");
    EXPECT_NE(log.find("codec auto: plan 1 at iteration 2, after the warmup"), std::string::npos)
        << log;
    EXPECT_NE(log.find("codec auto: plan 2 at iteration 4, the link's rate moved"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("codec auto: plan 3"), std::string::npos) << log;
    // Per rank: the codec bits of each bucket at each step, and the plans' names.
    std::vector<std::map<int, std::vector<int>>> bits(ranks);
    std::vector<std::vector<std::string>> plans(ranks);
    for (int r = 0; r < ranks; ++r) {
      const fs::path path = dir_ / (name + ".rank" + std::to_string(r) + ".json");
      ASSERT_TRUE(fs::exists(path)) << path;
      nlohmann::json doc = nlohmann::json::parse(ReadFileBytes(path));
      for (const auto& e : doc["traceEvents"]) {
        if (e["ph"] != "X") continue;
        const std::string event = e["name"].get<std::string>();
        if (event.rfind("all-reduce bucket", 0) == 0) {
          // "all-reduce bucket B", or "all-reduce buckets B-L" for f32 buckets issued as one.
          const size_t space = event.rfind(' ');
          const size_t dash = event.find('-', space);
          const int first = std::stoi(event.substr(space + 1));
          const int last = dash == std::string::npos ? first : std::stoi(event.substr(dash + 1));
          for (int b = first; b <= last; ++b) {
            bits[r][b].push_back(static_cast<int>(e["args"].value("codec_bits", -1.0)));
          }
        } else if (event.rfind("codec plan: ", 0) == 0) {
          plans[r].push_back(event + " @" +
                             std::to_string(static_cast<int>(e["args"].value("iteration", -1.0))));
        }
      }
      ASSERT_EQ(plans[r].size(), 2u);
      EXPECT_NE(plans[r][0].find("@2"), std::string::npos) << plans[r][0];
      EXPECT_NE(plans[r][1].find("@4"), std::string::npos) << plans[r][1];
      EXPECT_EQ(bits[r], bits[0]) << "rank " << r << " travelled in other codecs than rank 0";
      EXPECT_EQ(plans[r], plans[0]);
    }
    // Bucket 0 (logits.weight, ready first): f32 in the warmup, epgc8 in the first plan, f32
    // again in the second.
    EXPECT_EQ(bits[0][0], (std::vector<int>{32, 32, 8, 8, 32, 32}));
    // Every bucket that was epgc8 under the first plan changed at iteration 4 or not at all.
    for (const auto& [bucket, seq] : bits[0]) {
      ASSERT_EQ(seq.size(), 6u) << bucket;
      EXPECT_EQ(seq[2], seq[3]) << bucket;
      EXPECT_EQ(seq[4], seq[5]) << bucket;
    }
    int with_plan = 0;
    std::ifstream metrics(dir_ / (name + ".jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      nlohmann::json m = nlohmann::json::parse(line);
      if (m["event"] == "train" && m.contains("codec_plan")) ++with_plan;
    }
    EXPECT_GT(with_plan, 0);
  }
}

// With auto the plan and its measurements are in the checkpoint: a run stopped after the plan
// and resumed ends bitwise where the uninterrupted run ends (parameters, momentum, the
// error-feedback residuals), in the same plan.
TEST_F(DataParallelTest, AutoCodecsResumeBitwise) {
  const std::string config =
      Config(kResNet20,
             "distributed: {codec: auto, auto_warmup_steps: 2, auto_interval: 2, "
             "auto_max_residual_ratio: 1.0e9, bucket_mb: 0.05, first_bucket_mb: 0.01, "
             "last_bucket_mb: 0.01}\n");
  const std::string env = "CORTADO_AUTO_LINK=1e4 ";
  Checkpoint whole = Train(config, 2, 8, "whole", "", nullptr, "CORTADO_AUTO_LINK=1e4");
  const std::string ckpt_dir = (dir_ / "parts").string();
  const std::string train = CortadoBinary() + " launch --nproc 2 -- " + CortadoBinary() +
                            " train --no-progress --threads 1 --config " + config +
                            " --set data.batch_size=8 --set checkpoint.dir=" + ckpt_dir;
  std::string err;
  ASSERT_EQ(RunShell(env + "timeout 300 " + train + " --stop-at-iter 3", nullptr, &err), 130)
      << err;
  Checkpoint half = LoadCheckpoint(ListCheckpoints(ckpt_dir)[0]);
  ASSERT_EQ(half.Meta("codec_auto_plan"), whole.Meta("codec_auto_plan"));
  EXPECT_NE(half.Meta("codec_auto_plan").find("epgc8"), std::string::npos);
  ASSERT_NE(half.Find("codec_auto/measurements"), nullptr);
  ASSERT_EQ(RunShell(env + "timeout 300 " + train + " --resume auto", nullptr, &err), 0) << err;
  EXPECT_EQ(err.find("codec auto: plan"), std::string::npos) << "the resumed run planned again";
  EXPECT_NE(err.find("codecs auto, as planned before the checkpoint: epgc8"), std::string::npos)
      << err;
  Checkpoint resumed = LoadCheckpoint(ListCheckpoints(ckpt_dir)[0]);
  ASSERT_EQ(resumed.MetaInt("iteration"), 6);
  EXPECT_EQ(resumed.Meta("codec_auto_plan"), whole.Meta("codec_auto_plan"));
  // The measurements are timing, run by run: everything else is bitwise the same.
  for (Checkpoint* c : {&resumed, &whole}) {
    c->tensors.erase(
        std::remove_if(c->tensors.begin(), c->tensors.end(),
                       [](const auto& t) { return t.first == "codec_auto/measurements"; }),
        c->tensors.end());
  }
  ExpectBitwiseEqual(resumed, whole);
}

TEST_F(DataParallelTest, CodecConfigErrorsNameTheKey) {
  const std::string config = Config(kLeNet);
  std::string err;
  auto train = [&](const std::string& set) {
    return RunShell("timeout 60 " + CortadoBinary() + " train --no-progress --config " + config +
                        " --set checkpoint.dir=" + (dir_ / "bad").string() + " " + set,
                    nullptr, &err);
  };
  EXPECT_NE(train("--set distributed.codec=fp12"), 0);
  EXPECT_NE(err.find("distributed.codec"), std::string::npos) << err;
  EXPECT_NE(err.find("fp12"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.rounding=up"), 0);
  EXPECT_NE(err.find("distributed.rounding"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.codec_keep_f32=[norms]"), 0);
  EXPECT_NE(err.find("unknown parameter kind 'norms'"), std::string::npos) << err;
  // distributed.codec: auto and its keys.
  EXPECT_NE(train("--set distributed.codec=auto --set distributed.codec_candidates=[epgc8,f32]"),
            0);
  EXPECT_NE(err.find("distributed.codec_candidates"), std::string::npos) << err;
  EXPECT_NE(err.find("widest to narrowest, but epgc8 comes before f32"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.codec=auto --set distributed.codec_candidates=[f32,fp12]"), 0);
  EXPECT_NE(err.find("fp12"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.codec=auto --set distributed.auto_warmup_steps=0"), 0);
  EXPECT_NE(err.find("distributed.auto_warmup_steps"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.codec=auto --set distributed.auto_max_residual_ratio=0"), 0);
  EXPECT_NE(err.find("distributed.auto_max_residual_ratio"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.codec=auto --set distributed.auto_hiding_fraction=1.5"), 0);
  EXPECT_NE(err.find("distributed.auto_hiding_fraction"), std::string::npos) << err;
  EXPECT_NE(err.find("must be in (0, 1]"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.codec=auto --set distributed.auto_trial_steps=-1"), 0);
  EXPECT_NE(err.find("distributed.auto_trial_steps"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.auto_trial_steps=2"), 0);
  EXPECT_NE(err.find("is for distributed.codec: auto"), std::string::npos) << err;
  EXPECT_NE(train("--set distributed.auto_interval=10"), 0);
  EXPECT_NE(err.find("distributed.auto_interval"), std::string::npos) << err;
  EXPECT_NE(err.find("is for distributed.codec: auto"), std::string::npos) << err;
}

// distributed.codec_overrides as a user writes it in the config file: a YAML map taken in its
// written order (the first pattern that matches wins: "logits.weight" before "logits.*" gives
// the weight bf16, the other order f16), kept so through the resolved config that checkpoints
// store, applied on every rank and reported in the start-up log; a key that is not a pattern,
// and a pattern that matches no parameter, stop the run naming them.
TEST_F(DataParallelTest, CodecOverridesInTheConfigFileApplyInTheirWrittenOrder) {
  const std::string config = Config(kLeNet,
                                    "distributed:\n"
                                    "  codec: epgc8\n"
                                    "  codec_overrides:\n"
                                    "    \"logits.weight\": bf16\n"
                                    "    \"logits.*\": f16\n"
                                    "    conv1.weight: f32\n");
  const RunConfig c = LoadRunConfig(config, {});
  const std::vector<std::pair<std::string, std::string>> want = {
      {"logits.weight", "bf16"}, {"logits.*", "f16"}, {"conv1.weight", "f32"}};
  EXPECT_EQ(c.distributed.codec.overrides, want);
  YamlConfig resolved = YamlConfig::FromString(c.resolved_yaml, "stored");
  const RunConfig stored = ParseRunConfig(resolved, /*need_train=*/false);
  EXPECT_EQ(stored.distributed.codec.overrides, want);
  Net net(MakeNetSpec(c, {1, 28, 28}, 10, 8), 1);
  ApplyCodecPolicy(net, c.distributed.codec);
  std::map<std::string, std::string> codecs;
  for (Param* p : net.params()) codecs[p->name] = p->codec;
  const std::map<std::string, std::string> expected = {
      {"conv1.weight", "f32"},   {"conv1.bias", "f32"},   {"conv2.weight", "epgc8"},
      {"conv2.bias", "f32"},     {"fc1.weight", "epgc8"}, {"fc1.bias", "f32"},
      {"logits.weight", "bf16"}, {"logits.bias", "f16"}};
  EXPECT_EQ(codecs, expected);

  // Two ranks: the buckets travel in these codecs, in backward's order.
  std::string log;
  Train(config, 2, 8, "two", "--set solver.max_iter=1", &log);
  EXPECT_NE(log.find("codecs bf16, f16, epgc8, f32 (nearest)"), std::string::npos) << log;

  std::string err;
  auto fails = [&](const std::string& overrides, const std::string& want_error) {
    const std::string bad =
        Config(kLeNet, "distributed: {codec: epgc8, codec_overrides: " + overrides + "}\n");
    EXPECT_NE(RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 2 -- " +
                           CortadoBinary() + " train --no-progress --threads 1 --config " + bad +
                           " --set checkpoint.dir=" + (dir_ / "bad").string(),
                       nullptr, &err),
              0);
    EXPECT_NE(err.find(want_error), std::string::npos) << overrides << "\n" << err;
  };
  fails("{[logits.weight]: f16}", "distributed.codec_overrides: a key is not a name pattern");
  fails("{\"fc2.*\": f16}", "codec override 'fc2.*' matches no parameter");
  fails("{\"fc1.*\": f12}", "distributed.codec_overrides: 'fc1.*'");
}

// Starts `cortado launch` in the background with stderr to a file; returns its pid.
pid_t StartLauncher(const std::string& args, const fs::path& err_file, const std::string& token) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CORTADO_JOB_TOKEN", token.c_str(), 1);
    freopen(err_file.c_str(), "w", stderr);
    freopen("/dev/null", "w", stdout);
    execl("/bin/sh", "sh", "-c", ("exec " + CortadoBinary() + " launch " + args).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The pid of the rank of the job with this token, or -1.
pid_t FindRank(int rank, const std::string& token) {
  const std::string want_rank = "CORTADO_RANK=" + std::to_string(rank);
  const std::string want_token = "CORTADO_JOB_TOKEN=" + token;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string env = ReadFileBytes(entry.path() / "environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (("\n" + env).find("\n" + want_rank + "\n") != std::string::npos &&
        env.find(want_token + "\n") != std::string::npos) {
      std::string cmd = ReadFileBytes(entry.path() / "cmdline");
      if (cmd.find("train") != std::string::npos) return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

TEST_F(DataParallelTest, AKilledRankStopsTheOthersNamingItAndTheCheckpointResumes) {
  const std::string config = Config(kLeNet);
  const std::string ckpt_dir = (dir_ / "run").string();
  const std::string token = "dp-kill-" + std::to_string(getpid());
  const std::string train = CortadoBinary() + " train --no-progress --threads 1 --config " +
                            config + " --set checkpoint.dir=" + ckpt_dir +
                            " --set data.batch_size=8 --set solver.max_iter=100000"
                            " --set checkpoint.every=3 --set checkpoint.keep=2";
  const fs::path err_file = dir_ / "err.txt";
  pid_t launcher = StartLauncher("--nproc 3 -- " + train, err_file, token);
  ASSERT_TRUE(WaitFor([&] { return ListCheckpoints(ckpt_dir).size() >= 2; }, 120))
      << ReadFileBytes(err_file);
  pid_t victim = FindRank(1, token);
  ASSERT_GT(victim, 0);
  kill(victim, SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  const int code = WaitExit(launcher, 30);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  const std::string err = ReadFileBytes(err_file);
  EXPECT_NE(code, 0) << err;
  EXPECT_NE(code, -1) << "the launcher did not exit within 30 s\n" << err;
  EXPECT_LT(took, 10.0) << err;
  EXPECT_NE(err.find("cortado launch: rank 1 was killed by signal"), std::string::npos) << err;
  // The surviving ranks' errors name rank 1 as the cause.
  std::regex blames_rank1(R"(\[(0|2)\] cortado train: error: .*rank 1)");
  EXPECT_TRUE(std::regex_search(err, blames_rank1)) << err;
  // The newest checkpoint is whole and the job resumes from it on every rank.
  std::vector<std::string> all = ListCheckpoints(ckpt_dir);
  ASSERT_FALSE(all.empty());
  const int64_t at = LoadCheckpoint(all[0]).MetaInt("iteration");
  std::string resume_err;
  const int resumed = RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 3 -- " + train +
                                   " --resume auto --stop-at-iter " + std::to_string(at + 2),
                               nullptr, &resume_err);
  EXPECT_EQ(resumed, 130) << resume_err;
  EXPECT_NE(resume_err.find("resumed from '" + all[0] + "' at iteration " + std::to_string(at)),
            std::string::npos)
      << resume_err;
  EXPECT_EQ(LoadCheckpoint(ListCheckpoints(ckpt_dir)[0]).MetaInt("iteration"), at + 2);
}

TEST_F(DataParallelTest, SigintToTheLauncherCheckpointsOnceAndEveryRankExits130) {
  const std::string config = Config(kLeNet);
  const std::string ckpt_dir = (dir_ / "run").string();
  const std::string token = "dp-int-" + std::to_string(getpid());
  // Each rank reports its own exit code through a shell that ignores the signal itself (the
  // trainer installs its own handler, so it still sees it).
  const std::string train = CortadoBinary() + " train --no-progress --threads 1 --config " +
                            config + " --set checkpoint.dir=" + ckpt_dir +
                            " --set data.batch_size=8 --set solver.max_iter=100000";
  const std::string rank = "sh -c 'trap \"\" INT TERM; " + train +
                           "; code=$?; echo \"rank $CORTADO_RANK exit $code\" >&2; exit $code'";
  const fs::path err_file = dir_ / "err.txt";
  pid_t launcher = StartLauncher("--nproc 2 -- " + rank, err_file, token);
  ASSERT_TRUE(
      WaitFor([&] { return ReadFileBytes(err_file).find("train iter") != std::string::npos; }, 120))
      << ReadFileBytes(err_file);
  kill(launcher, SIGINT);
  const int code = WaitExit(launcher, 60);
  const std::string err = ReadFileBytes(err_file);
  EXPECT_EQ(code, 130) << err;
  EXPECT_NE(err.find("[0] rank 0 exit 130"), std::string::npos) << err;
  EXPECT_NE(err.find("[1] rank 1 exit 130"), std::string::npos) << err;
  EXPECT_EQ(err.find("error:"), std::string::npos) << err;
  // One checkpoint, written by rank 0 at the iteration where every rank stopped.
  std::vector<std::string> all = ListCheckpoints(ckpt_dir);
  ASSERT_EQ(all.size(), 1u) << err;
  const int64_t at = LoadCheckpoint(all[0]).MetaInt("iteration");
  EXPECT_NE(err.find("interrupted at iteration " + std::to_string(at)), std::string::npos) << err;
  EXPECT_EQ(testing::CountOf(err, "checkpoint saved"), 1u) << err;
}

TEST_F(DataParallelTest, SigintDuringTheFinalEvaluationStopsEveryRankWithTheTrainingSaved) {
  const std::string ckpt_dir = (dir_ / "run").string();
  const fs::path config = dir_ / "long_eval.yaml";
  std::ofstream(config) << "model: {builder: lenet}\n"
                        << "data:\n  type: synthetic\n  batch_size: 2\n  val_batch_size: 16\n"
                        << "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 8, "
                           "val_samples: 2000000}\n"
                        << "solver: {max_iter: 2}\n"
                        << "checkpoint: {dir: " << ckpt_dir << "}\n";
  const std::string token = "dp-eval-int-" + std::to_string(getpid());
  const std::string train =
      CortadoBinary() + " train --no-progress --threads 1 --config " + config.string();
  const std::string rank = "sh -c 'trap \"\" INT TERM; " + train +
                           "; code=$?; echo \"rank $CORTADO_RANK exit $code\" >&2; exit $code'";
  const fs::path err_file = dir_ / "err.txt";
  pid_t launcher = StartLauncher("--nproc 2 -- " + rank, err_file, token);
  const bool evaluating = WaitFor(
      [&] { return ReadFileBytes(err_file).find("eval  batch") != std::string::npos; }, 120);
  kill(launcher, SIGINT);
  const int code = WaitExit(launcher, 60);
  // Ranks that outlive a launcher killed on timeout would evaluate for minutes: end them.
  for (int r = 0; r < 2; ++r) {
    for (pid_t left = FindRank(r, token); left > 0; left = FindRank(r, token)) {
      kill(left, SIGKILL);
      usleep(100000);
    }
  }
  const std::string err = ReadFileBytes(err_file);
  ASSERT_TRUE(evaluating) << err;
  EXPECT_EQ(code, 130) << err;
  EXPECT_NE(err.find("[0] rank 0 exit 130"), std::string::npos) << err;
  EXPECT_NE(err.find("[1] rank 1 exit 130"), std::string::npos) << err;
  EXPECT_EQ(err.find("error:"), std::string::npos) << err;
  EXPECT_NE(err.find("interrupted during the final evaluation at iteration 2"), std::string::npos)
      << err;
  EXPECT_NE(err.find("the evaluation is abandoned, not the training"), std::string::npos) << err;
  EXPECT_EQ(LoadCheckpoint(ckpt_dir + "/ckpt-00000002.cortado").MetaInt("iteration"), 2);
  // Sample counts say whose they are.
  EXPECT_NE(err.find("4 training samples per rank (8 in all), 2 batches of 2 per rank per epoch"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("global batch 4 (2 x 2), learning rate"), std::string::npos) << err;
}

}  // namespace
}  // namespace cortado
