// Two data-parallel ranks as threads of one process, training a small net with batch norm: with
// overlap on, each training thread writes gradient views of its block during backward while its
// communicator's worker thread all-reduces the buckets finished before; synchronized batch norm
// reduces its statistics in forward and backward over a second communicator (Split) with a
// worker thread of its own; both ranks share the engine's thread pool. The ranks end bitwise
// alike, and what they changed equals what one process changes with the combined batch.
// Built into test_concurrency too, for the TSan stage of scripts/test.sh: the point is the
// threads, which the process tests of tests/tools hide from TSan.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>

#include "cortado/dist/store.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/solver.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/data_parallel.h"
#include "engine/parallel/sync_batch_norm.h"
#include "models/builders.h"

namespace cortado {
namespace {

constexpr int kRanks = 2, kBatch = 3, kSteps = 3;
constexpr double kLr = 0.05;

// ResNet-20 (CIFAR-style) on 2 x 8 x 8 images, 5 classes: 19 batch norms (reductions in forward
// and in backward) and gradients in many buckets.
NetSpec Spec(int64_t batch) {
  ModelOptions o;
  o.num_classes = 5;
  o.in_channels = 2;
  o.height = o.width = 8;
  o.batch_size = batch;
  return BuildModel("resnet20", o);
}

// Sample g of the global batch of a step; rank r's local sample j is global sample r + j * W,
// as the samplers lay out a global batch.
void FillSample(Net& net, int64_t local, int step, int64_t global) {
  Tensor& x = net.input("data");
  const int64_t plane = x.numel() / x.dim(0);
  Rng rng(static_cast<uint64_t>(1000 * step + global));
  for (int64_t i = 0; i < plane; ++i) x.data<double>()[local * plane + i] = rng.Normal(0, 1);
  net.input("label").data<int32_t>()[local] = static_cast<int32_t>((global * 3 + step) % 5);
}

// A copy of the net's and solver's state (checkpoint tensors share the live storage).
Checkpoint StateOf(Net& net, SgdSolver& solver) {
  Checkpoint c;
  net.SaveState(c);
  solver.SaveState(c);
  for (auto& [name, t] : c.tensors) t = t.Clone();
  return c;
}

TEST(DataParallelThreads, TwoRanksWithOverlapAndSyncBatchNormTrainAsOneProcess) {
  SetNumThreads(2);
  SgdOptions sgd;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-4;

  // One process with the combined batch.
  Net one(Spec(kRanks * kBatch), 11, DType::kF64);
  SgdSolver one_solver(one.params(), sgd);
  const Checkpoint start = StateOf(one, one_solver);
  for (int step = 0; step < kSteps; ++step) {
    for (int64_t g = 0; g < kRanks * kBatch; ++g) FillSample(one, g, step, g);
    one.Forward();
    one.Backward();
    one_solver.Step(kLr);
  }
  const Checkpoint want = StateOf(one, one_solver);

  dist::InMemoryStore store;
  std::vector<Checkpoint> got(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<size_t> buckets(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      try {
        dist::CommConfig config;
        config.rank = r;
        config.world_size = kRanks;
        config.store = &store;
        std::unique_ptr<dist::Communicator> comm = dist::CreateCommunicator(config);
        SyncBatchNormReducer bn(comm->Split(0, r));
        Net net(Spec(kBatch), 11, DType::kF64);
        net.context().batch_stats = &bn;
        net.context().sync_batch_norm = true;
        net.context().sample_base = r;
        net.context().sample_stride = kRanks;
        DataParallelOptions options;
        options.overlap = true;
        options.bucket_mb = options.first_bucket_mb = options.last_bucket_mb = 0.05;
        DataParallel dp(net, *comm, options);
        buckets[static_cast<size_t>(r)] = dp.buckets().size();
        SgdSolver solver(net.params(), sgd);
        for (int step = 0; step < kSteps; ++step) {
          for (int64_t j = 0; j < kBatch; ++j) FillSample(net, j, step, r + j * kRanks);
          dp.BeginStep(step);
          dp.SetControl(net.Forward(), false);
          net.Backward();
          dp.FinishStep();
          solver.Step(kLr);
        }
        got[static_cast<size_t>(r)] = StateOf(net, solver);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_GE(buckets[0], 4u) << "too few buckets to overlap anything";

  // Every rank holds the same parameters, statistics and momentum, bit for bit.
  ASSERT_EQ(got[0].tensors.size(), got[1].tensors.size());
  for (size_t i = 0; i < got[0].tensors.size(); ++i) {
    const Tensor& a = got[0].tensors[i].second;
    const Tensor& b = got[1].tensors[i].second;
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << got[0].tensors[i].first;
  }
  // What training changed equals one process's change, to f64 rounding: the largest difference
  // of any element against the largest change of any element.
  double diff = 0, moved = 0;
  for (const auto& [name, w] : want.tensors) {
    const Tensor* g = got[0].Find(name);
    const Tensor* s = start.Find(name);
    ASSERT_NE(g, nullptr) << name;
    ASSERT_NE(s, nullptr) << name;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double x = ElementAsDouble(w, i);
      diff = std::max(diff, std::fabs(ElementAsDouble(*g, i) - x));
      moved = std::max(moved, std::fabs(x - ElementAsDouble(*s, i)));
    }
  }
  EXPECT_GT(moved, 1e-3);
  EXPECT_LE(diff, 1e-11 * moved) << "largest difference " << diff << ", largest change " << moved;
}

// Rank 0's starting state fails with an exception that is not an Error (std::stoll's
// std::invalid_argument on a crafted entry, say): every rank stops with its message, rather than
// rank 0 dying alone and the others reporting a lost connection (issue 40).
TEST(DataParallelThreads, AnyErrorInRankZerosStartingStateReachesEveryRank) {
  dist::InMemoryStore store;
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      try {
        dist::CommConfig config;
        config.rank = r;
        config.world_size = kRanks;
        config.store = &store;
        config.options.timeout = std::chrono::seconds(5);
        std::unique_ptr<dist::Communicator> comm = dist::CreateCommunicator(config);
        BroadcastState(*comm, []() -> Checkpoint { throw std::invalid_argument("stoll"); });
        errors[static_cast<size_t>(r)] = "no error";
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("not an Error: ") + e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "stoll") << r;
}

// distributed.codec: auto over ranks as threads, f32 gradients, the link fixed by the
// options (CORTADO_AUTO_LINK's): every rank's codec plan after each step, and its final state.
struct AutoRun {
  std::vector<std::vector<std::string>> plans;  // [rank][step]: codec_plan() after the step
  std::vector<Checkpoint> state;                // [rank]
  std::vector<size_t> runs;                     // [step]: rank 0's all-reduces per step
  size_t buckets = 0;                           // rank 0's
  std::vector<Checkpoint> saved;                // [step]: rank 0's SaveState after the step
};

// `codec`: the policy's (a fixed codec runs with auto_codec.enabled false).
// `resume`: every rank's DataParallel loads it first.
// `per_rank`: changes a rank's options (what one node's environment would change).
using PerRank = std::function<void(int rank, AutoCodecOptions& options)>;
AutoRun TrainAuto(int world, int steps, const AutoCodecOptions& auto_codec,
                  const std::string& codec = "auto", const Checkpoint* resume = nullptr,
                  const PerRank& per_rank = {}) {
  SgdOptions sgd;
  sgd.momentum = 0.9;
  dist::InMemoryStore store;
  AutoRun run;
  run.plans.resize(static_cast<size_t>(world));
  run.state.resize(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        dist::CommConfig config;
        config.rank = r;
        config.world_size = world;
        config.store = &store;
        // Ranks that call different collectives fail in seconds rather than at the default 300.
        config.options.timeout = std::chrono::seconds(20);
        std::unique_ptr<dist::Communicator> comm = dist::CreateCommunicator(config);
        Net net(Spec(kBatch), 11, DType::kF32);
        CodecPolicy policy;
        policy.codec = codec;
        ApplyCodecPolicy(net, policy);
        DataParallelOptions options;
        options.bucket_mb = 0.05;
        options.first_bucket_mb = options.last_bucket_mb = 0.01;
        options.auto_codec = auto_codec;
        if (per_rank) per_rank(r, options.auto_codec);
        DataParallel dp(net, *comm, options);
        if (resume != nullptr) dp.LoadState(*resume, "resume");
        SgdSolver solver(net.params(), sgd);
        for (int step = 0; step < steps; ++step) {
          for (int64_t j = 0; j < kBatch; ++j) {
            // FillSample writes f64; this net is f32.
            Tensor& x = net.input("data");
            const int64_t plane = x.numel() / x.dim(0);
            Rng rng(static_cast<uint64_t>(1000 * step + r + j * world));
            for (int64_t i = 0; i < plane; ++i) {
              x.data<float>()[j * plane + i] = static_cast<float>(rng.Normal(0, 1));
            }
            net.input("label").data<int32_t>()[j] = static_cast<int32_t>((j * 3 + step) % 5);
          }
          dp.BeginStep(step);
          dp.SetControl(net.Forward(), false);
          net.Backward();
          dp.FinishStep();
          solver.Step(kLr);
          run.plans[static_cast<size_t>(r)].push_back(dp.codec_plan());
          if (r == 0) run.runs.push_back(dp.runs().size());
          if (r == 0) run.buckets = dp.buckets().size();
          if (r == 0) dp.SaveState(run.saved.emplace_back());
        }
        run.state[static_cast<size_t>(r)] = StateOf(net, solver);
        Checkpoint own;
        dp.SaveState(own);
        for (auto& [name, t] : own.tensors) t = t.Clone();
        for (auto& t : own.tensors) run.state[static_cast<size_t>(r)].tensors.push_back(t);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return run;
}

// Every tensor of `want` is bitwise the same in `got` (at the same place), batch-norm
// statistics aside: they are each rank's own here (no synchronized batch norm). `got` may hold
// more after them.
void ExpectSameState(const Checkpoint& want, const Checkpoint& got, const std::string& what) {
  ASSERT_GE(got.tensors.size(), want.tensors.size()) << what;
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const auto& [name, a] = want.tensors[i];
    if (name.rfind("buffer/", 0) == 0) continue;
    ASSERT_EQ(got.tensors[i].first, name) << what;
    const Tensor& b = got.tensors[i].second;
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name << ", " << what;
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0)
        << name << " differs, " << what;
  }
}

void ExpectRanksAlike(const AutoRun& run) {
  for (size_t r = 1; r < run.state.size(); ++r) {
    SCOPED_TRACE(r);
    EXPECT_EQ(run.plans[r], run.plans[0]) << "rank " << r << " planned otherwise than rank 0";
    ASSERT_EQ(run.state[r].tensors.size(), run.state[0].tensors.size());
    ExpectSameState(run.state[0], run.state[r], "rank 0 against rank " + std::to_string(r));
  }
}

// Auto codecs on, planned after 2 warmup steps, checked every `interval` iterations.
AutoCodecOptions AutoOn(int64_t interval) {
  AutoCodecOptions a;
  a.enabled = true;
  a.warmup_steps = 2;
  a.interval = interval;
  return a;
}

// The first field of a plan (bucket 0, the last layer's weights: an auto bucket).
std::string First(const std::string& plan) { return plan.substr(0, plan.find(',')); }

// 2 and 3 ranks: 10 KB/s until iteration 3 (after the 2 warmup steps in f32, every auto bucket
// in epgc8: nothing hides), then 1 TB/s (the check after iteration 3, agreed by every rank,
// re-plans: bucket 0, ready first, back to f32). Every rank has the same plan after every step,
// and the ranks end with bitwise the same parameters, momentum and agreed measurements (batch
// norm's running statistics are each rank's own).
TEST(DataParallelThreads, AutoCodecsAgreeOnEveryRankAndReplanAtTheSameStep) {
  SetNumThreads(2);
  AutoCodecOptions a = AutoOn(2);
  a.max_residual_ratio = 1e9;
  a.link_override = {{0, 1e4}, {3, 1e12}};
  for (int world : {2, 3}) {
    SCOPED_TRACE(world);
    const AutoRun run = TrainAuto(world, 6, a);
    ASSERT_EQ(run.plans[0].size(), 6u);
    ExpectRanksAlike(run);
    const std::vector<std::string>& p = run.plans[0];
    EXPECT_EQ(First(p[0]), "f32");  // warmup
    EXPECT_EQ(First(p[1]), "epgc8");
    EXPECT_EQ(p[2], p[1]);
    EXPECT_EQ(First(p[3]), "f32");  // re-planned after iteration 3
    EXPECT_NE(p[3], p[2]);
    EXPECT_EQ(p[4], p[3]);
    EXPECT_EQ(p[5], p[4]);
  }
}

// The guard, on 2 ranks: with a limit below any residual, every check moves each lossy bucket
// one candidate wider: epgc8 -> epgc11 -> bf16, which runs without error feedback (no residual)
// and stays; the ranks agree throughout.
TEST(DataParallelThreads, AutoCodecsGuardMovesLossyBucketsOneStepWider) {
  SetNumThreads(2);
  AutoCodecOptions a = AutoOn(2);
  a.max_residual_ratio = 1e-30;
  a.link_override = {{0, 1e4}};
  const AutoRun run = TrainAuto(2, 8, a);
  ASSERT_EQ(run.plans[0].size(), 8u);
  ExpectRanksAlike(run);
  const std::vector<std::string>& p = run.plans[0];
  EXPECT_EQ(First(p[1]), "epgc8");
  EXPECT_EQ(First(p[3]), "epgc11");
  EXPECT_EQ(First(p[5]), "bf16");
  EXPECT_EQ(First(p[7]), "bf16");
  EXPECT_EQ(p[3].find("epgc8"), std::string::npos) << p[3];
  EXPECT_EQ(p[5].find("epgc"), std::string::npos) << p[5];
  // A limit no residual reaches leaves the plan as it is.
  a.max_residual_ratio = 1e9;
  const AutoRun kept = TrainAuto(2, 8, a);
  EXPECT_EQ(kept.plans[0][7], kept.plans[0][1]);
}

// The trial, on 2 and 3 ranks: after the warmup the plan and every auto bucket in epgc8 take
// turns, a step each, 2 steps each, and then one of the two stays, the same on every rank, which
// end bitwise alike. A checkpoint taken during the trial holds the plan on
// trial and a mark; a run resumed from it starts the trial over from that plan.
TEST(DataParallelThreads, AutoCodecsTryThePlanAgainstTheNarrowestAndKeepTheFaster) {
  SetNumThreads(2);
  AutoCodecOptions a = AutoOn(0);
  a.max_residual_ratio = 1e9;
  a.trial_steps = 2;
  a.candidates = {dist::CodecKind::kF32, dist::CodecKind::kEpgc8};
  // A fast fixed link makes the plan (f32 but the last-ready buckets) independent of the
  // machine's load; the trial's verdict is still timed, so either side may stay.
  a.link_override = {{0, 1e12}};
  a.trial_under_link_override = true;
  for (int world : {2, 3}) {
    SCOPED_TRACE(world);
    const AutoRun run = TrainAuto(world, 7, a);
    ExpectRanksAlike(run);
    const std::vector<std::string>& p = run.plans[0];
    ASSERT_EQ(p.size(), 7u);
    // On the fast link the first-ready bucket travels in f32.
    EXPECT_EQ(First(p[1]), "f32") << p[1];
    EXPECT_EQ(First(p[2]), "epgc8");  // the other side's turn: no auto bucket in f32
    EXPECT_EQ(p[3], p[1]);            // turns, a step each
    EXPECT_EQ(p[4], p[2]);
    EXPECT_TRUE(p[5] == p[1] || p[5] == p[2]) << p[5];
    EXPECT_EQ(p[6], p[5]);                                     // decided
    EXPECT_EQ(run.saved[2].meta.at("codec_auto_plan"), p[1]);  // taken in the narrow side's turn
    EXPECT_EQ(run.saved[2].meta.count("codec_auto_trial"), 1u);
    EXPECT_EQ(run.saved[5].meta.at("codec_auto_plan"), p[5]);
    EXPECT_EQ(run.saved[5].meta.count("codec_auto_trial"), 0u);
    if (world == 2) {
      // Rank 1 alone would not restart it (no trial under its link override): rank 0 decides.
      const AutoRun resumed =
          TrainAuto(world, 3, a, "auto", &run.saved[2], [](int r, AutoCodecOptions& o) {
            if (r == 1) o.trial_under_link_override = false;
          });
      ExpectRanksAlike(resumed);
      const std::vector<std::string>& q = resumed.plans[0];
      ASSERT_EQ(q.size(), 3u);
      // The trial over: the plan's turn first (the step before q[0]), then the other side's.
      EXPECT_EQ(q[0], p[2]);
      EXPECT_EQ(q[1], p[1]);
      EXPECT_EQ(q[2], p[2]);
    }
  }
  // Without a trial the plan stays.
  a.trial_steps = 0;
  const AutoRun plain = TrainAuto(2, 5, a);
  EXPECT_EQ(plain.plans[0][4], plain.plans[0][1]);
}

// Rank 0 decides for every rank: the plan, whether a trial runs and its verdict (issue 40). What
// a rank sees alone (CORTADO_AUTO_LINK set on one node only; measurements that round otherwise on
// another CPU) must not make it plan otherwise: the ranks would call different collectives (a
// trial's all-reduce that the other never calls) and fail, or hang until the deadline. Here one
// rank has a fixed slow link and the other measures the real one: with rank 0's fixed link every
// rank plans epgc8 and none runs a trial; with rank 0 measuring, every rank follows its plan and
// its trial. Either way the ranks end with the same plans at every step and bitwise the same
// state.
TEST(DataParallelThreads, AutoCodecsFollowRankZeroWhereRanksSeeDifferentLinks) {
  SetNumThreads(2);
  AutoCodecOptions a = AutoOn(2);
  a.max_residual_ratio = 1e9;
  a.trial_steps = 2;
  a.link_override = {{0, 1e4}};
  const AutoRun fixed = TrainAuto(2, 6, a, "auto", nullptr, [](int r, AutoCodecOptions& o) {
    if (r != 0) o.link_override.clear();
  });
  ASSERT_EQ(fixed.plans[0].size(), 6u);
  ExpectRanksAlike(fixed);
  EXPECT_EQ(First(fixed.plans[0][1]), "epgc8");
  EXPECT_EQ(fixed.plans[0][5], fixed.plans[0][1]) << "no trial, no re-plan under the fixed link";
  for (int world : {2, 3}) {
    SCOPED_TRACE(world);
    const AutoRun measured =
        TrainAuto(world, 8, a, "auto", nullptr, [](int r, AutoCodecOptions& o) {
          if (r == 0) o.link_override.clear();
        });
    ASSERT_EQ(measured.plans[0].size(), 8u);
    ExpectRanksAlike(measured);
    EXPECT_EQ(First(measured.plans[0][0]), "f32");  // the warmup
  }
}

// A plan that keeps neighbouring buckets in f32 issues them as one all-reduce, as plain f32
// cuts its buckets. On a fast link every auto bucket but the last (ready when backward ends)
// keeps f32, in about as many all-reduces per step as distributed.codec: f32 makes, where one
// per bucket (weights, batch norms and biases apart) would be about twice as many. The warmup
// (f32 throughout, joined) trains bitwise as f32 on 2 ranks: an element's average does not
// depend on how the block is cut.
TEST(DataParallelThreads, AutoCodecsJoinF32BucketsIntoOneAllReduce) {
  SetNumThreads(2);
  AutoCodecOptions a = AutoOn(2);
  a.candidates = {dist::CodecKind::kF32, dist::CodecKind::kEpgc8};
  a.link_override = {{0, 1e12}};
  const AutoRun plan = TrainAuto(2, 4, a);
  ExpectRanksAlike(plan);
  const AutoCodecOptions off;
  const AutoRun f32 = TrainAuto(2, 4, off, "f32");
  ASSERT_EQ(plan.runs.size(), 4u);
  for (size_t step = 0; step < 4; ++step) {
    EXPECT_LE(plan.runs[step], f32.runs[step] + 2) << step;
    EXPECT_GT(2 * plan.buckets, 3 * plan.runs[step]) << step;
  }
  EXPECT_EQ(First(plan.plans[0][3]), "f32");
  const AutoRun warmup = TrainAuto(2, 2, a);
  const AutoRun f32_warmup = TrainAuto(2, 2, off, "f32");
  ExpectSameState(f32_warmup.state[0], warmup.state[0], "auto's warmup against f32");
}

}  // namespace
}  // namespace cortado
