#include "engine/tensor/test_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "engine/base/error.h"

namespace cortado {
namespace {

// Every test-device block, by address: its mapped size and how many running kernels hold it
// open. One table for all test devices (the protection is the process's).
class Guard {
 public:
  static Guard& Get() {
    static Guard* guard = new Guard();  // never destroyed: blocks may be freed at exit
    return *guard;
  }

  static size_t PageSize() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
  }

  void* Map(size_t bytes) {
    const size_t size = (bytes + PageSize() - 1) / PageSize() * PageSize();
    void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[static_cast<char*>(p)] = Block{size, 0};
    return p;
  }

  void Unmap(void* p) {
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(static_cast<char*>(p));
      CORTADO_CHECK(it != blocks_.end(), "test device: free of an unknown block");
      CORTADO_CHECK(it->second.opens == 0, "test device: block freed while a kernel holds it");
      size = it->second.size;
      blocks_.erase(it);
    }
    munmap(p, size);
  }

  // Opens (or closes) the block around `ptr` for host code; nested opens are counted.
  void Open(const void* ptr) { Change(ptr, +1); }
  void Close(const void* ptr) { Change(ptr, -1); }

  // The block around ptr: its start and size (throws when ptr is in none).
  std::pair<char*, size_t> BlockOf(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = Find(ptr);
    CORTADO_CHECK(it != blocks_.end(), "test device: no block holds this address");
    return {it->first, it->second.size};
  }

  bool Guarded(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = Find(ptr);
    return it != blocks_.end() && it->second.opens == 0;
  }

 private:
  struct Block {
    size_t size = 0;
    int opens = 0;
  };

  std::map<char*, Block>::iterator Find(const void* ptr) {
    const char* p = static_cast<const char*>(ptr);
    auto it = blocks_.upper_bound(const_cast<char*>(p));
    if (it == blocks_.begin()) return blocks_.end();
    --it;
    return p < it->first + it->second.size ? it : blocks_.end();
  }

  void Change(const void* ptr, int delta) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = Find(ptr);
    CORTADO_CHECK(it != blocks_.end(),
                  "test device: a kernel was given memory that is not a "
                  "test-device block");
    Block& b = it->second;
    const int before = b.opens;
    b.opens += delta;
    CORTADO_CHECK(b.opens >= 0, "test device: block closed more often than opened");
    if ((before == 0) != (b.opens == 0)) {
      const int prot = b.opens > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
      CORTADO_CHECK(mprotect(it->first, b.size, prot) == 0, "test device: mprotect failed");
    }
  }

  std::mutex mu_;
  std::map<char*, Block> blocks_;
};

class GuardedMemory final : public RawMemory {
 public:
  explicit GuardedMemory(int index) : index_(index) {}
  void* Allocate(size_t bytes) override { return Guard::Get().Map(bytes); }
  void Free(void* ptr, size_t) override { Guard::Get().Unmap(ptr); }
  Device device() const override { return Device{DeviceType::kTest, index_}; }

 private:
  int index_;
};

// The pinned host allocator's source: plain host memory (it is never guarded: the loader writes
// it), tracked so that a copy can tell it from pageable memory.
class PinnedMemory final : public RawMemory {
 public:
  void* Allocate(size_t bytes) override { return CpuAllocator()->Allocate(bytes); }
  void Free(void* ptr, size_t bytes) override { CpuAllocator()->Free(ptr, bytes); }
  Device device() const override { return Device::CPU(); }
};

// One device's stream: work items run in order on a thread of its own.
class Stream {
 public:
  Stream() : worker_([this] { Run(); }) {}

  // Returns the ticket of the item: the stream has passed it once done() >= ticket.
  uint64_t Enqueue(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
    ++enqueued_;
    wake_.notify_all();
    return enqueued_;
  }

  // Waits until every item queued so far has run; throws the first error since the last wait.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = enqueued_;
    done_cv_.wait(lock, [&] { return done_ >= target; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

  bool Passed(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ >= ticket;
  }
  void WaitFor(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_ >= ticket; });
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr failed;
      bool skip = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        skip = error_ != nullptr;  // after an error, later work is skipped until it is seen
      }
      if (!skip) {
        try {
          work();
        } catch (...) {
          failed = std::current_exception();
        }
      }
      work = nullptr;  // drops the tensors it held before the item counts as done
      std::lock_guard<std::mutex> lock(mu_);
      if (failed && !error_) error_ = failed;
      ++done_;
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  std::exception_ptr error_;
  std::thread worker_;  // last: starts after the members it uses
};

// Events for the pinned cache: a ticket on a stream.
class StreamTickets final : public EventSource {
 public:
  class Ticket final : public StreamEvent {
   public:
    Ticket(Stream* stream, uint64_t ticket) : stream_(stream), ticket_(ticket) {}
    bool Reached() override { return stream_->Passed(ticket_); }
    void Wait() override { stream_->WaitFor(ticket_); }

   private:
    Stream* stream_;
    uint64_t ticket_;
  };
  explicit StreamTickets(Stream* streams) : streams_(streams) {}
  std::unique_ptr<StreamEvent> Record(StreamRef stream) override {
    Stream* s = &streams_[stream.device];
    return std::make_unique<Ticket>(s, s->Enqueue([] {}));
  }

 private:
  Stream* streams_;
};

template <typename T>
void FillAs(void* data, int64_t n, T value) {
  T* p = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

double LoadElement(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF64:
      return static_cast<const double*>(data)[i];
    case DType::kF16:
      return HalfToFloat(static_cast<const Half*>(data)[i]);
    case DType::kBF16:
      return BFloat16ToFloat(static_cast<const BFloat16*>(data)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(data)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(data)[i];
  }
  return 0;
}

// Rounded as Tensor::Fill and Tensor::ConvertFrom round (16-bit types through f32).
void StoreElement(void* data, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      static_cast<double*>(data)[i] = v;
      break;
    case DType::kF16:
      static_cast<Half*>(data)[i] = FloatToHalf(static_cast<float>(v));
      break;
    case DType::kBF16:
      static_cast<BFloat16*>(data)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    case DType::kI32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      break;
    case DType::kU8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      break;
  }
}

class TestRuntime final : public DeviceRuntime {
 public:
  TestRuntime() : tickets_(std::make_shared<StreamTickets>(streams_)) {}

  DeviceType type() const override { return DeviceType::kTest; }
  int DeviceCount(std::string*) const override { return kTestDeviceCount; }
  std::string Describe(int index) const override {
    return StrCat("test:", index, " (host memory behind guarded pages; no GPU)");
  }

  const std::shared_ptr<Allocator>& DeviceAllocator(int index) override {
    CheckIndex(index);
    std::lock_guard<std::mutex> lock(mu_);
    if (!caches_[index]) {
      caches_[index] = std::make_shared<CachingAllocator>(std::make_unique<GuardedMemory>(index));
    }
    return caches_[index];
  }

  const std::shared_ptr<Allocator>& PinnedHostAllocator() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pinned_) {
      pinned_ = std::make_shared<CachingAllocator>(std::make_unique<PinnedMemory>(), tickets_);
    }
    return pinned_;
  }

  MemoryStats Memory(int index) const override {
    CheckIndex(index);
    std::lock_guard<std::mutex> lock(mu_);
    return caches_[index] ? static_cast<CachingAllocator&>(*caches_[index]).stats() : MemoryStats{};
  }
  void ResetPeakMemory(int index) override {
    CheckIndex(index);
    std::lock_guard<std::mutex> lock(mu_);
    if (caches_[index]) static_cast<CachingAllocator&>(*caches_[index]).ResetPeak();
  }

  void Copy(Tensor& dst, const Tensor& src) override {
    CORTADO_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(), "copy of ",
                  src.ToString(), " on ", src.device().ToString(), " into ", dst.ToString(), " on ",
                  dst.device().ToString(), ": element counts and types differ");
    if (dst.numel() == 0) return;
    const bool dst_on = dst.device().type == DeviceType::kTest;
    const bool src_on = src.device().type == DeviceType::kTest;
    const Device on = dst_on ? dst.device() : src.device();
    // Between two test devices: after the source's queued work, and before its later work.
    if (dst_on && src_on && src.device().index != on.index) Synchronize(src.device().index);
    const size_t bytes = dst.nbytes();
    Launch(on, {dst, src},
           [d = dst.raw_data(), s = src.raw_data(), bytes] { std::memcpy(d, s, bytes); });
    if (!dst_on) {
      Synchronize(on.index);  // the caller reads the host copy next
    } else if (!src_on) {
      // From pinned memory the copy runs later (the block is held from reuse until it has);
      // from pageable memory, which the caller may write at once, the call waits.
      auto* pinned = static_cast<CachingAllocator*>(PinnedHostAllocator().get());
      if (!pinned->RecordUse(src.raw_data(), StreamRef{on.index, nullptr})) Synchronize(on.index);
    } else if (src.device().index != on.index) {
      Synchronize(on.index);
    }
  }

  std::unique_ptr<StreamEvent> CopyToHostAsync(Tensor& dst, const Tensor& src) override {
    CORTADO_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype() &&
                      src.device().type == DeviceType::kTest && dst.device() == Device::CPU(),
                  "asynchronous copy of ", src.ToString(), " on ", src.device().ToString(),
                  " into ", dst.ToString(), " on ", dst.device().ToString(),
                  ": it copies a test-device tensor into host memory of its size and type");
    const int index = src.device().index;
    if (dst.numel() > 0) {
      Launch(src.device(), {dst, src},
             [d = dst.raw_data(), s = src.raw_data(), bytes = dst.nbytes()] {
               std::memcpy(d, s, bytes);
             });
      // Pinned memory is held from reuse until the stream has passed the copy (the tensors the
      // launch holds keep any other host memory alive).
      auto* pinned = static_cast<CachingAllocator*>(PinnedHostAllocator().get());
      pinned->RecordUse(dst.raw_data(), StreamRef{index, nullptr});
    }
    return tickets_->Record(StreamRef{index, nullptr});
  }

  void Fill(Tensor& t, double value) override {
    const DType dtype = t.dtype();
    const int64_t n = t.numel();
    Launch(t.device(), {t}, [p = t.raw_data(), dtype, n, value] {
      switch (dtype) {
        case DType::kF16:
          return FillAs(p, n, FloatToHalf(static_cast<float>(value)));
        case DType::kBF16:
          return FillAs(p, n, FloatToBFloat16(static_cast<float>(value)));
        default:
          for (int64_t i = 0; i < n; ++i) StoreElement(p, dtype, i, value);
      }
    });
  }

  void Convert(Tensor& dst, const Tensor& src) override {
    CORTADO_CHECK(dst.numel() == src.numel() && dst.device() == src.device(), "convert of ",
                  src.ToString(), " on ", src.device().ToString(), " into ", dst.ToString(), " on ",
                  dst.device().ToString(), ": counts or devices differ");
    Launch(dst.device(), {dst, src},
           [d = dst.raw_data(), dd = dst.dtype(), s = src.raw_data(), sd = src.dtype(),
            n = dst.numel()] {
             for (int64_t i = 0; i < n; ++i) StoreElement(d, dd, i, LoadElement(s, sd, i));
           });
  }

  void Reorder(Tensor& dst, const Tensor& src) override {
    Launch(dst.device(), {dst, src},
           [d = dst.raw_data(), to = dst.format(), s = src.raw_data(), from = src.format(),
            shape = src.shape(),
            elem = DTypeSize(src.dtype())] { ReorderHost(s, from, d, to, shape, elem); });
  }

  void Synchronize(int index) override {
    CheckIndex(index);
    streams_[index].Wait();
  }

  void Launch(Device device, std::vector<Tensor> tensors, std::function<void()> body) {
    CORTADO_CHECK(device.type == DeviceType::kTest, "test device launch on ", device.ToString());
    CheckIndex(device.index);
    streams_[device.index].Enqueue([tensors = std::move(tensors), body = std::move(body)] {
      std::vector<const void*> opened;
      for (const Tensor& t : tensors) {
        if (t.device().type != DeviceType::kTest || t.raw_data() == nullptr) continue;
        Guard::Get().Open(t.raw_data());
        opened.push_back(t.raw_data());
      }
      struct Closer {
        std::vector<const void*>& blocks;
        ~Closer() {
          for (const void* p : blocks) Guard::Get().Close(p);
        }
      } closer{opened};
      body();
    });
  }

 private:
  static void CheckIndex(int index) {
    CORTADO_CHECK(index >= 0 && index < kTestDeviceCount, "test:", index,
                  " does not exist: the test devices are test:0 to test:", kTestDeviceCount - 1);
  }

  mutable std::mutex mu_;
  Stream streams_[kTestDeviceCount];
  std::shared_ptr<StreamTickets> tickets_;
  std::shared_ptr<Allocator> caches_[kTestDeviceCount];
  std::shared_ptr<Allocator> pinned_;
};

// Hands out one fixed address, once: the storage of a host alias of a test-device block.
class AliasAllocator final : public Allocator {
 public:
  explicit AliasAllocator(void* ptr) : ptr_(ptr) {}
  void* Allocate(size_t) override {
    CORTADO_CHECK(ptr_ != nullptr, "test device: a host alias of device memory cannot grow");
    return std::exchange(ptr_, nullptr);
  }
  void Free(void*, size_t) override {}
  Device device() const override { return Device::CPU(); }

 private:
  void* ptr_;
};

TestRuntime& Runtime() {
  static TestRuntime* runtime = new TestRuntime();  // never destroyed: its threads never stop
  return *runtime;
}

}  // namespace

DeviceRuntime& TestDeviceRuntime() { return Runtime(); }

void LaunchOnTestDevice(Device device, std::vector<Tensor> tensors, std::function<void()> body) {
  Runtime().Launch(device, std::move(tensors), std::move(body));
}

namespace {
std::atomic<int64_t> g_alias_calls{0};
}  // namespace

int64_t TestDeviceHostAliasCalls() { return g_alias_calls.load(); }

std::vector<Tensor> TestDeviceHostAliases(const std::vector<Tensor>& tensors) {
  g_alias_calls.fetch_add(1);
  std::map<char*, Tensor> blocks;  // by block start: a u8 alias of the whole block
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    if (t.device().type != DeviceType::kTest || t.raw_data() == nullptr || t.empty()) {
      out.push_back(t.device().type == DeviceType::kTest ? Tensor(t.shape(), t.dtype()) : t);
      continue;
    }
    const auto [start, size] = Guard::Get().BlockOf(t.raw_data());
    Tensor& block = blocks[start];
    if (!block.defined()) {
      block =
          Tensor({static_cast<int64_t>(size)}, DType::kU8, std::make_shared<AliasAllocator>(start));
    }
    const int64_t at = static_cast<char*>(t.raw_data()) - start;
    Tensor alias = block.View({static_cast<int64_t>(t.nbytes())}, at);
    alias.Resize(t.shape(), t.dtype());  // the same place, retyped
    if (t.ndim() == 4) alias.set_format(t.format());
    alias.set_name(t.name());
    out.push_back(std::move(alias));
  }
  return out;
}

bool TestDeviceMemoryGuarded(const void* ptr) { return Guard::Get().Guarded(ptr); }

}  // namespace cortado
