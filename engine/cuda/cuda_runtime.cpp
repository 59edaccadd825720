// The CUDA implementation of DeviceRuntime (engine/tensor/device_runtime.h).
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

#include "engine/base/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/tensor_kernels.h"
#include "engine/tensor/caching_allocator.h"
#include "engine/tensor/device_runtime.h"

namespace cortado {
namespace {

// Device memory straight from the driver; null when the GPU is out of memory, so the cache can
// release what it holds and try again.
class CudaDeviceMemory final : public RawMemory {
 public:
  explicit CudaDeviceMemory(int index) : index_(index) {}
  void* Allocate(size_t bytes) override {
    cuda::CudaContext::Get(index_).MakeCurrent();
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so the next call is not blamed
      return nullptr;
    }
    CORTADO_CUDA_CHECK(status);
    return ptr;
  }
  void Free(void* ptr, size_t) override {
    cuda::CudaContext::Get(index_).MakeCurrent();
    CORTADO_CUDA_CHECK(cudaFree(ptr));
  }
  Device device() const override { return Device{DeviceType::kCUDA, index_}; }

 private:
  int index_;
};

// Page-locked host memory: the loader's batches, so their copies to the GPU run asynchronously
// on the copy stream.
class PinnedHostMemory final : public RawMemory {
 public:
  void* Allocate(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaMallocHost(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    CORTADO_CUDA_CHECK(status);
    return ptr;
  }
  void Free(void* ptr, size_t) override { CORTADO_CUDA_CHECK(cudaFreeHost(ptr)); }
  Device device() const override { return Device::CPU(); }
};

class CudaRuntimeImpl final : public DeviceRuntime {
 public:
  DeviceType type() const override { return DeviceType::kCUDA; }

  int DeviceCount(std::string* why) const override {
    std::call_once(count_once_, [this] {
      const cudaError_t status = cudaGetDeviceCount(&count_);
      if (status != cudaSuccess) {
        (void)cudaGetLastError();
        count_ = 0;
        no_device_ = StrCat("no CUDA device (", cudaGetErrorString(status), ")");
      } else if (count_ == 0) {
        no_device_ = "no CUDA device on this machine";
      }
    });
    if (count_ == 0 && why != nullptr) *why = no_device_;
    return count_;
  }

  std::string Describe(int index) const override {
    cudaDeviceProp prop{};
    CORTADO_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    return StrCat("cuda:", index, " ", prop.name, ", ",
                  static_cast<double>(prop.totalGlobalMem) / (1ull << 30),
                  " GiB, compute capability ", prop.major, ".", prop.minor);
  }

  const std::shared_ptr<Allocator>& DeviceAllocator(int index) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<size_t>(index) >= device_caches_.size()) device_caches_.resize(index + 1);
    if (!device_caches_[index]) {
      device_caches_[index] =
          std::make_shared<CachingAllocator>(std::make_unique<CudaDeviceMemory>(index));
    }
    return device_caches_[index];
  }

  const std::shared_ptr<Allocator>& PinnedHostAllocator() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pinned_cache_) {
      pinned_cache_ = std::make_shared<CachingAllocator>(std::make_unique<PinnedHostMemory>());
    }
    return pinned_cache_;
  }

  MemoryStats Memory(int index) const override { return Cache(index).stats(); }
  void ResetPeakMemory(int index) override { Cache(index).ResetPeak(); }

  void Copy(Tensor& dst, const Tensor& src) override {
    CORTADO_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(), "copy of ",
                  src.ToString(), " on ", src.device().ToString(), " into ", dst.ToString(), " on ",
                  dst.device().ToString(), ": element counts and types differ");
    if (dst.numel() == 0) return;
    const Device on = dst.device().type == DeviceType::kCUDA ? dst.device() : src.device();
    cuda::CudaContext& ctx = cuda::CudaContext::Get(on.index);
    ctx.MakeCurrent();
    CORTADO_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                       cudaMemcpyDefault, ctx.compute_stream()));
    // Host memory the caller reads next must hold the result.
    if (dst.device().type == DeviceType::kCPU) {
      CORTADO_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
    }
  }

  void Fill(Tensor& t, double value) override {
    cuda::CudaContext& ctx = ContextOf(t);
    cuda::LaunchFill(t.raw_data(), t.dtype(), t.numel(), value, ctx.compute_stream());
  }

  void Convert(Tensor& dst, const Tensor& src) override {
    CORTADO_CHECK(dst.numel() == src.numel() && dst.device() == src.device(), "convert of ",
                  src.ToString(), " on ", src.device().ToString(), " into ", dst.ToString(), " on ",
                  dst.device().ToString(), ": counts or devices differ");
    cuda::CudaContext& ctx = ContextOf(dst);
    cuda::LaunchConvert(dst.raw_data(), dst.dtype(), src.raw_data(), src.dtype(), dst.numel(),
                        ctx.compute_stream());
  }

  void Synchronize(int index) override {
    cuda::CudaContext& ctx = cuda::CudaContext::Get(index);
    ctx.MakeCurrent();
    CORTADO_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
  }

 private:
  static cuda::CudaContext& ContextOf(const Tensor& t) {
    CORTADO_CHECK(t.device().type == DeviceType::kCUDA, "tensor ", t.ToString(), " is on ",
                  t.device().ToString(), ", not on a GPU");
    cuda::CudaContext& ctx = cuda::CudaContext::Get(t.device().index);
    ctx.MakeCurrent();
    return ctx;
  }

  CachingAllocator& Cache(int index) const {
    std::lock_guard<std::mutex> lock(mu_);
    CORTADO_CHECK(static_cast<size_t>(index) < device_caches_.size() && device_caches_[index],
                  "cuda:", index, " has allocated nothing yet");
    return static_cast<CachingAllocator&>(*device_caches_[index]);
  }

  mutable std::once_flag count_once_;
  mutable int count_ = 0;
  mutable std::string no_device_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Allocator>> device_caches_;
  std::shared_ptr<Allocator> pinned_cache_;
};

}  // namespace

DeviceRuntime& CudaRuntime() {
  // Never destroyed: its caches hold device memory the driver frees at exit (see CudaContext).
  static auto* runtime = new CudaRuntimeImpl;
  return *runtime;
}

}  // namespace cortado
