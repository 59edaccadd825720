// RegisteredAllocator and the allocator ownership of tensors: storage keeps its allocator alive,
// reallocations and clones use it, blocks come from the communicator's registered memory and
// may be freed after the communicator and after Detach; the data-parallel gradient block is one.
#include "engine/tensor/registered_allocator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "cortado/dist/store.h"
#include "cortado/dist/ucx_transport.h"
#include "engine/parallel/data_parallel.h"
#include "models/builders.h"

namespace cortado {
namespace {

class CountingAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override {
    ++allocations;
    return CpuAllocator()->Allocate(bytes);
  }
  void Free(void* ptr, size_t bytes) override {
    ++frees;
    CpuAllocator()->Free(ptr, bytes);
  }
  Device device() const override { return Device::CPU(); }
  int allocations = 0;
  int frees = 0;
};

TEST(TensorAllocator, StorageKeepsItsAllocatorAliveAndReallocationsUseIt) {
  auto counting = std::make_shared<CountingAllocator>();
  std::weak_ptr<CountingAllocator> weak = counting;
  {
    Tensor t({4}, DType::kF32, counting);
    EXPECT_EQ(counting->allocations, 1);
    t.Resize({1000});  // outgrows its storage: reallocated from the same allocator
    EXPECT_EQ(counting->allocations, 2);
    Tensor c = t.Clone();
    EXPECT_EQ(counting->allocations, 3);
    Tensor view = t.View({10}, 5);
    counting.reset();  // only the tensors hold it now
    ASSERT_FALSE(weak.expired());
    t = Tensor();
    c = Tensor();
    EXPECT_FALSE(weak.expired());  // the view's storage still needs it
  }
  EXPECT_TRUE(weak.expired());  // freed with the last storage
}

TEST(RegisteredAllocator, BlocksAreTheCommunicatorsAndOutliveItAfterDetach) {
  auto comm = dist::CreateCommunicator(dist::CommConfig{});  // a world of one: plain memory
  auto allocator = std::make_shared<RegisteredAllocator>(*comm);
  Tensor a({1000}, DType::kF32, allocator);
  EXPECT_EQ(allocator->registered_blocks(), 1u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw_data()) % 4096, 0u);
  a.Fill(2);
  allocator->Detach();
  comm.reset();
  Tensor b({10}, DType::kF32, allocator);  // after Detach: plain host memory
  EXPECT_EQ(allocator->registered_blocks(), 1u);
  b.Fill(1);
  EXPECT_EQ(a.data<float>()[999], 2.0f);
  a = Tensor();  // a registered block freed after its communicator
  EXPECT_EQ(allocator->registered_blocks(), 0u);
}

// Two ranks as threads: the data-parallel gradient block is registered memory, and over UCX
// (ranks of one process share memory) a ring-sized bucket runs the direct all-reduce.
TEST(RegisteredAllocator, DataParallelGradientBlockIsRegisteredMemory) {
  for (const std::string transport : {"tcp", "ucx"}) {
    if (transport == "ucx" && !dist::HasUcxTransport()) continue;
    dist::InMemoryStore store;
    std::vector<std::string> algorithms(2), errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        try {
          dist::CommConfig config;
          config.rank = r;
          config.world_size = 2;
          config.store = &store;
          config.options.transport = dist::ParseTransportKind(transport);
          auto comm = dist::CreateCommunicator(config);
          ModelOptions o;
          o.num_classes = 10;
          o.in_channels = 1;
          o.height = o.width = 28;
          o.batch_size = 2;
          Net net(BuildModel("resnet20", o), 1);
          DataParallelOptions options;
          options.first_bucket_mb = 1;
          DataParallel dp(net, *comm, options);
          algorithms[static_cast<size_t>(r)] = dp.bucket_algorithms();
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors[0] + errors[1], "");
    const std::string first = transport == "ucx" ? "direct" : "ring";
    EXPECT_EQ(algorithms[0].rfind(first, 0), 0u) << transport << ": " << algorithms[0];
    EXPECT_EQ(algorithms[0], algorithms[1]);
  }
}

}  // namespace
}  // namespace cortado
