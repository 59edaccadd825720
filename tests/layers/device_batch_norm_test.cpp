// BatchNorm's own device path (layers/batch_norm_kernels.h) on the guarded test device against
// its CPU kernels: training and inference, forward and backward, NCHW and NHWC, with and without
// the fused ReLU, f32, f64, bf16 and f16, bit for bit (the device's sums run in the CPU's order;
// 16-bit values widened, the statistics in f64 and the rest in f32, stored rounded once), with no
// CPU kernel run on the device meanwhile; and synchronized batch norm over two ranks on test:0
// and test:1 equal to the CPU's two ranks.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cortado/dist/store.h"
#include "engine/graph/layer.h"
#include "engine/parallel/sync_batch_norm.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"
#include "layers/batch_norm_kernels.h"

namespace cortado {
namespace {

const Device kTest0{DeviceType::kTest, 0};
const Device kTest1{DeviceType::kTest, 1};

// Deterministic values in [-0.5, 0.5) * scale + offset, as `dtype` in `format`.
Tensor Values(const Shape& shape, DType dtype, MemoryFormat format, uint32_t seed,
              double offset = 0, double scale = 1) {
  Tensor t(shape, DType::kF64);
  uint32_t s = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.data<double>()[i] = (static_cast<double>(s >> 8) / (1 << 24) - 0.5) * scale + offset;
  }
  Tensor typed(shape, dtype);
  typed.ConvertFrom(t);
  if (shape.size() != 4) return typed;
  Tensor out(shape, dtype);
  out.set_format(format);
  out.ReorderFrom(typed);
  return out;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Case {
  Shape shape;
  DType dtype = DType::kF32;
  MemoryFormat format = MemoryFormat::kNCHW;
  bool relu = false;
  bool global_stats = false;  // inference: the running statistics
  bool affine = true;
  bool propagate = true;
};

std::string Name(const Case& c) {
  std::ostringstream s;
  s << DTypeName(c.dtype);
  for (int64_t d : c.shape) s << ' ' << d;
  s << (c.format == MemoryFormat::kNHWC ? " nhwc" : " nchw") << (c.relu ? " relu" : "")
    << (c.global_stats ? " inference" : " training") << (c.affine ? "" : " no-affine")
    << (c.propagate ? "" : " no-dx");
  return s.str();
}

struct BnRun {
  std::vector<Tensor> outputs;  // y, dx, the params' gradients, the buffers (host copies)
  int64_t fallbacks = 0;        // CPU kernels run on the test device meanwhile
};

// Two training steps' forward and backward (the second with the first's running statistics) of
// a BatchNorm layer on `device`; `reducer` synchronizes it (rank `rank`'s inputs).
BnRun RunBn(const Case& c, Device device, BatchStatsReducer* reducer = nullptr, int rank = 0) {
  Settings settings;
  settings.Set("relu", c.relu);
  settings.Set("affine", c.affine);
  settings.Set("momentum", 0.25);
  if (c.global_stats) settings.Set("use_global_stats", true);
  LayerSpec spec{"bn", "BatchNorm", {"x"}, {"y"}, settings, ""};
  std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
  LayerContext context;
  context.batch_stats = reducer;
  context.sync_batch_norm = reducer != nullptr;
  layer->set_context(&context);
  const uint32_t seed = 10 + 7 * static_cast<uint32_t>(rank);
  // An offset mean, so that the centring matters (|mean| >> std would lose bits otherwise).
  Blob bottom{"x", Values(c.shape, c.dtype, c.format, seed, 3.0, 2.0).To(device),
              Tensor(c.shape, c.dtype, AllocatorFor(device))};
  bottom.grad.set_format(c.format);
  Blob top{"y", Tensor({1}, c.dtype, AllocatorFor(device)), Tensor()};
  const int64_t before = TestDeviceHostAliasCalls();
  layer->SetUp({&bottom}, {&top});
  // Non-trivial parameters and running statistics, then everything onto the device.
  const int64_t channels = c.shape[1];
  for (size_t i = 0; i < layer->params().size(); ++i) {
    Param& p = layer->params()[i];
    p.value = Values({channels}, p.value.dtype(), MemoryFormat::kNCHW,
                     50 + static_cast<uint32_t>(i), 1.0 - static_cast<double>(i))
                  .To(device);
    p.grad = p.grad.To(device);
  }
  for (size_t i = 0; i < layer->buffers().size(); ++i) {
    Buffer& b = layer->buffers()[i];
    b.value = Values({channels}, b.value.dtype(), MemoryFormat::kNCHW,
                     60 + static_cast<uint32_t>(i), 0.5 + static_cast<double>(i))
                  .To(device);
  }
  BnRun r;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {
      bottom.data = Values(c.shape, c.dtype, c.format, seed + 1, -1.0, 3.0).To(device);
    }
    layer->Forward({&bottom}, {&top});
    top.grad = Values(top.data.shape(), c.dtype, c.format, static_cast<uint32_t>(99 + step + rank))
                   .To(device);
    layer->Backward({&top}, {c.propagate}, {&bottom});
  }
  r.outputs.push_back(top.data.To(Device::CPU()));
  if (c.propagate) r.outputs.push_back(bottom.grad.To(Device::CPU()));
  for (const Param& p : layer->params()) r.outputs.push_back(p.grad.To(Device::CPU()));
  for (const Buffer& b : layer->buffers()) r.outputs.push_back(b.value.To(Device::CPU()));
  r.fallbacks = TestDeviceHostAliasCalls() - before;
  return r;
}

void ExpectSame(const BnRun& cpu, const BnRun& dev, const std::string& what) {
  ASSERT_EQ(cpu.outputs.size(), dev.outputs.size()) << what;
  for (size_t i = 0; i < cpu.outputs.size(); ++i) {
    EXPECT_TRUE(SameBytes(cpu.outputs[i], dev.outputs[i])) << what << ": output " << i;
  }
}

TEST(DeviceBatchNorm, TrainingAndInferenceRunTheSharedBodiesBitwise) {
  std::vector<Case> cases;
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      for (bool relu : {false, true}) {
        for (bool global : {false, true}) {
          // Odd sizes: planes of 12 (one lane block and a remainder), 5 channels.
          cases.push_back({{3, 5, 4, 3}, dtype, format, relu, global});
        }
      }
    }
  }
  // Channels-last with more than one block of rows (and a short last block); long NCHW planes.
  cases.push_back({{2, 3, 17, 9}, DType::kF32, MemoryFormat::kNHWC, true});
  cases.push_back({{2, 3, 17, 9}, DType::kF64, MemoryFormat::kNCHW, false});
  // (N, C): one value per plane; no affine parameters; no input gradient.
  cases.push_back({{7, 6}, DType::kF32, MemoryFormat::kNCHW, false});
  cases.push_back({{3, 5, 4, 3}, DType::kF32, MemoryFormat::kNCHW, true, false, false});
  cases.push_back({{3, 5, 4, 3}, DType::kF64, MemoryFormat::kNHWC, false, false, true, false});
  for (const Case& c : cases) {
    const BnRun cpu = RunBn(c, Device::CPU());
    const BnRun dev = RunBn(c, kTest0);
    ExpectSame(cpu, dev, Name(c));
    EXPECT_EQ(dev.fallbacks, 0) << Name(c) << ": ran its CPU kernel on the test device";
  }
}

TEST(DeviceBatchNorm, SixteenBitRunsTheSharedBodiesBitwise) {
  std::vector<Case> cases;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      for (bool relu : {false, true}) {
        for (bool global : {false, true})
          cases.push_back({{3, 5, 4, 3}, dtype, format, relu, global});
      }
    }
  }
  // More than one block of channels-last rows; no affine parameters.
  cases.push_back({{2, 3, 17, 9}, DType::kBF16, MemoryFormat::kNHWC, true});
  cases.push_back({{3, 5, 4, 3}, DType::kF16, MemoryFormat::kNCHW, true, false, false});
  for (const Case& c : cases) {
    const BnRun cpu = RunBn(c, Device::CPU());
    const BnRun dev = RunBn(c, kTest0);
    ExpectSame(cpu, dev, Name(c));
    EXPECT_EQ(dev.fallbacks, 0) << Name(c) << ": ran its CPU kernel on the test device";
  }
}

// The fused ReLU's backward masks g where the 16-bit output was stored as 0 (the unfused ReLU's
// mask, the CPU's Positive<S>), also where the f32 value before the rounding is positive: z =
// 1e-8 rounds to 0 in f16 (whose smallest subnormal is 6e-8), so dx = A g is 0 there, and 1 in
// f32.
TEST(DeviceBatchNorm, SixteenBitFusedReluMasksWhereTheStoredOutputIsZero) {
  const float affine[3] = {1.0f, 1.0f, 1e-8f};  // a, m, b of one channel: z = a (x - m) + b
  const float coef[3] = {1.0f, 0.0f, 0.0f};     // dx = g
  const uint16_t one = dist::FloatToHalf(1.0f);
  uint16_t dx16 = 0x7c00;
  kernels::BnInputGrad<kernels::F16Codes>{&one, &one, affine, coef, &dx16, 1, 1, false, true}(0);
  EXPECT_EQ(dist::HalfToFloat(dx16), 0.0f);
  const float x32 = 1.0f;
  float dx32 = -1.0f;
  kernels::BnInputGrad<kernels::PlainCodes<float>>{&x32, &x32, affine, coef, &dx32,
                                                   1,    1,    false,  true}(0);
  EXPECT_EQ(dx32, 1.0f);
}

// Two ranks as threads, each with its half of the batch and a SyncBatchNormReducer over a
// communicator of its own, on `devices` (one per rank).
std::vector<BnRun> RunSyncBn(const Case& c, const std::vector<Device>& devices) {
  dist::InMemoryStore store;
  std::vector<BnRun> runs(devices.size());
  std::vector<std::string> errors(devices.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < devices.size(); ++r) {
    ranks.emplace_back([&, r] {
      try {
        dist::CommConfig config;
        config.rank = static_cast<int>(r);
        config.world_size = static_cast<int>(devices.size());
        config.store = &store;
        std::unique_ptr<dist::Communicator> comm = dist::CreateCommunicator(config);
        SyncBatchNormReducer reducer(comm->Split(0, static_cast<int>(r)));
        runs[r] = RunBn(c, devices[r], &reducer, static_cast<int>(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (size_t r = 0; r < devices.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

TEST(DeviceBatchNorm, SynchronizedOverTwoRanksOnTestDevicesEqualsTheCpusRanks) {
  for (const Case& c : {Case{{3, 5, 4, 3}, DType::kF32, MemoryFormat::kNCHW, true},
                        Case{{2, 4, 3, 5}, DType::kF64, MemoryFormat::kNHWC, false}}) {
    const std::vector<BnRun> cpu = RunSyncBn(c, {Device::CPU(), Device::CPU()});
    const std::vector<BnRun> dev = RunSyncBn(c, {kTest0, kTest1});
    ASSERT_EQ(cpu.size(), 2u);
    ASSERT_EQ(dev.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      ExpectSame(cpu[r], dev[r], Name(c) + " rank " + std::to_string(r));
      EXPECT_EQ(dev[r].fallbacks, 0) << "rank " << r;
    }
    // The ranks share the statistics: their running averages agree (the last two outputs).
    const size_t k = dev[0].outputs.size();
    EXPECT_TRUE(SameBytes(dev[0].outputs[k - 1], dev[1].outputs[k - 1]));
    EXPECT_TRUE(SameBytes(dev[0].outputs[k - 2], dev[1].outputs[k - 2]));
  }
}

}  // namespace
}  // namespace cortado
