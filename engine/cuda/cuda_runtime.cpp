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

// CUDA events, from a pool per GPU: an event is created once (a driver call) and used again once
// its holder is done with it. Timing is off: only completion is asked. Recording an event after a
// stream has been made to wait on it is safe: the wait is for the record before it.
class CudaEvents final : public EventSource {
 public:
  class Event final : public StreamEvent {
   public:
    Event(CudaEvents* pool, int device, cudaEvent_t event)
        : pool_(pool), device_(device), event_(event) {}
    ~Event() override { pool_->Give(device_, event_); }
    bool Reached() override {
      const cudaError_t status = cudaEventQuery(event_);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not an error: clear it so the next call is not blamed
        return false;
      }
      CORTADO_CUDA_CHECK(status);
      return true;
    }
    void Wait() override { CORTADO_CUDA_CHECK(cudaEventSynchronize(event_)); }
    cudaEvent_t get() const { return event_; }

   private:
    CudaEvents* pool_;
    int device_;
    cudaEvent_t event_;
  };

  std::unique_ptr<StreamEvent> Record(StreamRef stream) override { return RecordOn(stream); }
  // An event at the end of the work queued on `stream` so far.
  std::unique_ptr<Event> RecordOn(StreamRef stream) {
    auto event = std::make_unique<Event>(this, stream.device, Take(stream.device));
    CORTADO_CUDA_CHECK(cudaEventRecord(event->get(), static_cast<cudaStream_t>(stream.handle)));
    return event;
  }

 private:
  cudaEvent_t Take(int device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<size_t>(device) < free_.size() && !free_[device].empty()) {
        const cudaEvent_t event = free_[device].back();
        free_[device].pop_back();
        return event;
      }
    }
    // An event belongs to the GPU that is current when it is created, and records only there;
    // the caller's current GPU is put back (a cache may be freeing from any thread).
    int current = 0;
    CORTADO_CUDA_CHECK(cudaGetDevice(&current));
    cuda::CudaContext::Get(device).MakeCurrent();
    cudaEvent_t event = nullptr;
    const cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    CORTADO_CUDA_CHECK(cudaSetDevice(current));
    CORTADO_CUDA_CHECK(status);
    return event;
  }
  void Give(int device, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<size_t>(device) >= free_.size()) free_.resize(device + 1);
    free_[device].push_back(event);
  }

  std::mutex mu_;
  std::vector<std::vector<cudaEvent_t>> free_;  // per GPU
};

StreamRef ComputeStream(const cuda::CudaContext& ctx) {
  return StreamRef{ctx.index(), ctx.compute_stream()};
}

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
      // With events: the host writes a freed block at once, while a copy from it may be queued.
      pinned_cache_ =
          std::make_shared<CachingAllocator>(std::make_unique<PinnedHostMemory>(), events_);
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
    const bool dst_on_gpu = dst.device().type == DeviceType::kCUDA;
    const bool src_on_gpu = src.device().type == DeviceType::kCUDA;
    const Device on = dst_on_gpu ? dst.device() : src.device();
    // Between two GPUs the copy is queued on the destination's stream, and both streams keep
    // their order around it: the copy waits for the work queued on the source's stream (which
    // may be writing src), and the source's stream waits for the copy (its later work may
    // overwrite src, or reuse src's block once it is freed, in its own stream order). The
    // source's context first: creating it makes its GPU current.
    cuda::CudaContext* src_ctx = dst_on_gpu && src_on_gpu && src.device().index != on.index
                                     ? &cuda::CudaContext::Get(src.device().index)
                                     : nullptr;
    cuda::CudaContext& ctx = cuda::CudaContext::Get(on.index);
    ctx.MakeCurrent();
    if (src_ctx != nullptr) OrderAfter(ctx, *src_ctx);
    CORTADO_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                       cudaMemcpyDefault, ctx.compute_stream()));
    if (src_ctx != nullptr) OrderAfter(*src_ctx, ctx);
    if (!dst_on_gpu) {
      // Host memory the caller reads next must hold the result.
      CORTADO_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
    } else if (!src_on_gpu) {
      // From pinned host memory the copy runs after this returns: its block must not be handed
      // out again (and written by the host) before the stream has passed it.
      RecordPinnedUse(src.raw_data(), ComputeStream(ctx));
    }
  }

  std::unique_ptr<StreamEvent> CopyToHostAsync(Tensor& dst, const Tensor& src) override {
    CORTADO_CHECK(
        dst.numel() == src.numel() && dst.dtype() == src.dtype() && dst.device() == Device::CPU(),
        "asynchronous copy of ", src.ToString(), " on ", src.device().ToString(), " into ",
        dst.ToString(), " on ", dst.device().ToString(),
        ": it copies a GPU tensor into host memory of its size and type");
    cuda::CudaContext& ctx = ContextOf(src);
    if (dst.numel() > 0) {
      // Into pinned memory the copy runs asynchronously; the block is held from reuse until the
      // stream has passed it.
      CORTADO_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                         cudaMemcpyDeviceToHost, ctx.compute_stream()));
      RecordPinnedUse(dst.raw_data(), ComputeStream(ctx));
    }
    return events_->RecordOn(ComputeStream(ctx));
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
  // Work queued on waiter's compute stream from now on runs after what is queued on first's.
  void OrderAfter(const cuda::CudaContext& waiter, const cuda::CudaContext& first) {
    const auto event = events_->RecordOn(ComputeStream(first));
    CORTADO_CUDA_CHECK(cudaStreamWaitEvent(waiter.compute_stream(), event->get(), 0));
  }

  // Memory from another allocator (pageable: its copy is staged before cudaMemcpyAsync returns)
  // is not the pinned cache's, and RecordUse passes over it.
  void RecordPinnedUse(const void* ptr, StreamRef stream) {
    std::shared_ptr<Allocator> pinned;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pinned = pinned_cache_;
    }
    if (pinned) static_cast<CachingAllocator&>(*pinned).RecordUse(ptr, stream);
  }

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
  std::shared_ptr<CudaEvents> events_ = std::make_shared<CudaEvents>();
  std::shared_ptr<Allocator> pinned_cache_;
};

}  // namespace

DeviceRuntime& CudaRuntime() {
  // Never destroyed: its caches hold device memory the driver frees at exit (see CudaContext).
  static auto* runtime = new CudaRuntimeImpl;
  return *runtime;
}

}  // namespace cortado
