// Data-parallel training on a device (engine/parallel/data_parallel.h, "Devices"): two ranks as
// threads of one process, rank r's net on the guarded test device test:r, against the same two
// ranks on the CPU. Rank 0's starting state reaches rank 1 through host copies (BroadcastState);
// each bucket is copied out of the device block into pinned host staging while backward runs
// (overlap on), all-reduced there (codecs and error feedback included), and copied back before
// the solver's step; any host access of device memory on the way would fault. The layers run the
// same arithmetic in the same order on both (net_on_test_device_test.cpp), so losses, weights,
// momentum and residuals must agree bit for bit; a checkpoint written from the device run resumes
// on the CPU as the CPU run goes on.
// Built into test_concurrency too, for the TSan stage: the test device's stream threads copy
// buckets while the communicator's worker thread reduces earlier ones.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cortado/dist/store.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/solver.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/data_parallel.h"
#include "engine/parallel/sync_batch_norm.h"
#include "engine/tensor/test_device.h"
#include "models/builders.h"

namespace cortado {
namespace {

constexpr int kRanks = 2, kBatch = 3;
constexpr double kLr = 0.05;

NetSpec Spec(const std::string& model) {
  ModelOptions o;
  o.num_classes = 10;
  o.in_channels = model == "lenet" ? 1 : 2;
  o.height = o.width = model == "lenet" ? 28 : 8;
  o.batch_size = kBatch;
  return BuildModel(model, o);
}

// Rank r's batch of a step: its local sample j is global sample r + j * W. Built on the host and
// copied onto the net's device explicitly.
void Feed(Net& net, int rank, int step) {
  Tensor& data = net.input("data");
  Tensor images(data.shape(), DType::kF32);
  Tensor labels(net.input("label").shape(), DType::kI32);
  const int64_t plane = images.numel() / kBatch;
  for (int64_t j = 0; j < kBatch; ++j) {
    const int64_t global = rank + j * kRanks;
    Rng rng(static_cast<uint64_t>(1000 * step + global));
    for (int64_t i = 0; i < plane; ++i) {
      images.data<float>()[j * plane + i] = static_cast<float>(rng.Uniform(-1, 1));
    }
    labels.data<int32_t>()[j] = static_cast<int32_t>((global * 3 + step) % 10);
  }
  data.CopyFrom(images.To(data.device()));
  net.input("label").CopyFrom(labels.To(data.device()));
}

struct Job {
  std::string model = "lenet";
  bool on_device = false;  // rank r on test:r, else the CPU
  std::string codec = "f32";
  bool overlap = true;
  bool sync_bn = false;
  int first_step = 0, steps = 3;
  const Checkpoint* resume = nullptr;  // rank 0 starts from it
};

struct Outcome {
  std::vector<double> losses;  // per step: the mean over the ranks (FinishStep's)
  Checkpoint state;            // rank 0's net, solver and data-parallel state at the end
  Checkpoint rank1;            // rank 1's net and solver state
  size_t buckets = 0;
};

Checkpoint Cloned(Checkpoint c) {
  for (auto& [name, t] : c.tensors) t = t.Clone();  // on the CPU they share the live storage
  return c;
}

Outcome Train(const Job& s) {
  SetNumThreads(2);
  dist::InMemoryStore store;
  Outcome run;
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      try {
        dist::CommConfig config;
        config.rank = r;
        config.world_size = kRanks;
        config.store = &store;
        config.options.timeout = std::chrono::seconds(60);
        std::unique_ptr<dist::Communicator> comm = dist::CreateCommunicator(config);
        std::unique_ptr<SyncBatchNormReducer> bn;
        if (s.sync_bn) bn = std::make_unique<SyncBatchNormReducer>(comm->Split(0, r));
        NetOptions options;
        options.device = s.on_device ? Device{DeviceType::kTest, r} : Device::CPU();
        // Each rank initializes its own way: only rank 0's weights may survive the start.
        Net net(Spec(s.model), 1 + static_cast<uint64_t>(r), DType::kF32, options);
        if (bn) {
          net.context().batch_stats = bn.get();
          net.context().sync_batch_norm = true;
        }
        net.context().sample_base = r;
        net.context().sample_stride = kRanks;
        CodecPolicy policy;
        policy.codec = s.codec;
        ApplyCodecPolicy(net, policy);
        DataParallelOptions dpo;
        dpo.overlap = s.overlap;
        dpo.error_feedback = s.codec != "f32";
        dpo.bucket_mb = 0.05;
        dpo.first_bucket_mb = dpo.last_bucket_mb = 0.01;
        DataParallel dp(net, *comm, dpo);
        SgdOptions sgd;
        sgd.momentum = 0.9;
        sgd.weight_decay = 1e-4;
        SgdSolver solver(net.params(), sgd);
        // Rank 0's state to every rank, as the trainer starts (host copies of device tensors).
        const Checkpoint start = BroadcastState(*comm, [&] {
          if (s.resume != nullptr) {
            net.LoadState(*s.resume, "resume");
            solver.LoadState(*s.resume, "resume");
            dp.LoadState(*s.resume, "resume");
          }
          Checkpoint c;
          net.SaveState(c);
          solver.SaveState(c);
          dp.SaveState(c);
          return c;
        });
        if (r != 0) {
          net.LoadState(start, "rank 0's state");
          solver.LoadState(start, "rank 0's state");
          dp.LoadState(start, "rank 0's state");
        }
        for (Param* p : net.params()) {
          if (p->value.device() != options.device || p->grad.device() != options.device) {
            throw std::runtime_error(p->name + " is not on " + options.device.ToString());
          }
        }
        for (int step = s.first_step; step < s.first_step + s.steps; ++step) {
          Feed(net, r, step);
          dp.BeginStep(step);
          dp.SetControl(net.Forward(), false);
          net.Backward();
          const DataParallel::StepResult result = dp.FinishStep();
          solver.Step(kLr);
          if (r == 0) run.losses.push_back(result.loss);
        }
        dp.GatherForCheckpoint();
        Checkpoint c;
        net.SaveState(c);
        solver.SaveState(c);
        if (r == 0) {
          dp.SaveState(c);
          run.state = Cloned(std::move(c));
          run.buckets = dp.buckets().size();
        } else {
          run.rank1 = Cloned(std::move(c));
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return run;
}

// Every tensor of `want` is bitwise the same in `got` (by name; `got` may hold more).
void ExpectSameState(const Checkpoint& want, const Checkpoint& got, const std::string& what) {
  ASSERT_FALSE(want.tensors.empty()) << what;
  for (const auto& [name, a] : want.tensors) {
    const Tensor* b = got.Find(name);
    ASSERT_NE(b, nullptr) << name << ", " << what;
    EXPECT_EQ(b->device(), Device::CPU()) << name;  // checkpoints hold host copies
    ASSERT_EQ(a.nbytes(), b->nbytes()) << name << ", " << what;
    EXPECT_EQ(std::memcmp(a.raw_data(), b->raw_data(), a.nbytes()), 0)
        << name << " differs, " << what;
  }
}

void ExpectSameRun(const Outcome& cpu, const Outcome& dev) {
  ASSERT_EQ(cpu.losses.size(), dev.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_EQ(cpu.losses[i], dev.losses[i]) << "step " << i;  // bitwise
  }
  EXPECT_EQ(cpu.state.tensors.size(), dev.state.tensors.size());
  ExpectSameState(cpu.state, dev.state, "CPU against the test device");
  ExpectSameState(dev.rank1, dev.state, "rank 1 against rank 0 on the test device");
}

// f32 gradients with overlap on: several buckets go out during backward, each after its copy
// reached the host. The same with overlap off (every copy queued after backward) trains bitwise
// alike.
TEST(DataParallelOnDevice, TwoRanksOnTheTestDeviceTrainAsOnTheCpuBitwise) {
  Job s;
  const Outcome cpu = Train(s);
  s.on_device = true;
  const Outcome dev = Train(s);
  EXPECT_GE(dev.buckets, 3u) << "too few buckets to overlap anything";
  ExpectSameRun(cpu, dev);
  EXPECT_NE(cpu.losses.front(), cpu.losses.back()) << "it did not train";
  s.overlap = false;
  const Outcome after = Train(s);
  ExpectSameRun(cpu, after);
}

// epgc8 with error feedback: the codec and the residuals run on the host staging, so the
// compressed all-reduce sees the same bytes as on the CPU. The device run's checkpoint after 2
// steps (weights, momentum, both ranks' residuals) resumes on the CPU, and its third step ends
// bitwise where the CPU run's third step does: the device's first two steps were the CPU's.
TEST(DataParallelOnDevice, CompressedGradientsAndACheckpointMoveBetweenDeviceAndCpu) {
  Job s;
  s.codec = "epgc8";
  const Outcome cpu = Train(s);
  s.on_device = true;
  s.steps = 2;
  const Outcome dev = Train(s);
  ASSERT_EQ(dev.losses.size(), 2u);
  EXPECT_EQ(dev.losses[0], cpu.losses[0]);
  EXPECT_EQ(dev.losses[1], cpu.losses[1]);
  ASSERT_NE(dev.state.Find("error_feedback/rank1"), nullptr);
  ExpectSameState(dev.rank1, dev.state, "rank 1 against rank 0 on the test device");

  Job resumed;
  resumed.codec = "epgc8";
  resumed.first_step = 2;
  resumed.steps = 1;
  resumed.resume = &dev.state;
  const Outcome rest = Train(resumed);
  ASSERT_EQ(rest.losses.size(), 1u);
  EXPECT_EQ(rest.losses[0], cpu.losses[2]);
  EXPECT_EQ(cpu.state.tensors.size(), rest.state.tensors.size());
  ExpectSameState(cpu.state, rest.state, "resumed on the CPU from the device's checkpoint");
}

// Synchronized batch norm through the path batch norm has on the test device (its CPU kernel
// inside a device kernel: the statistics are reduced on the group's communicator from the
// device's stream): ResNet-20 on two ranks matches the CPU bitwise.
TEST(DataParallelOnDevice, SyncBatchNormOnTheTestDeviceMatchesTheCpu) {
  Job s;
  s.model = "resnet20";
  s.sync_bn = true;
  s.steps = 2;
  const Outcome cpu = Train(s);
  s.on_device = true;
  const Outcome dev = Train(s);
  ExpectSameRun(cpu, dev);
}

}  // namespace
}  // namespace cortado
