// Tensor: a shape, an element type, a device and a shared, reference-counted storage.
//
// Copies of a Tensor share storage (like torch.Tensor); Clone() makes a deep copy. Nothing
// copies between host and device behind the caller's back: CopyFrom requires equal devices, and
// To(device) is the explicit transfer. Zero, Fill, CopyFrom, ConvertFrom and Clone work on every
// device (on a GPU through its DeviceRuntime, queued on its compute stream). data<T>() is host
// access and refuses a tensor on another device with one line naming the tensor and its device
// (a device pointer dereferenced on the host is a segfault, not a message); device kernels take
// device_data<T>(), and raw_data() is the address for runtimes that copy. Storage comes from a
// pluggable Allocator, held by shared ownership (each Storage keeps its allocator alive, so memory
// can be freed after the code that allocated it is gone): the data-parallel glue allocates its
// gradient block from the communicator (engine/tensor/registered_allocator.h), registered with the
// transport once.
//
// Layout is dense. The shape is logical: an image tensor is (N, C, H, W) whatever its memory
// format, so dim(1) is channels in every layer and tool. The memory format says how those
// elements lie in memory: kNCHW (the default, row-major in the shape's order) or kNHWC
// (channels-last: row-major in (N, H, W, C), the layout of oneDNN's and cuDNN's fast
// convolutions; docs/ARCHITECTURE.md, "Activation layout"). Only 4-D tensors are ever kNHWC;
// every other rank is plain row-major. A 4-D tensor whose H * W or C is 1 lies the same in both
// (IsLayoutTrivial), so layers that take NCHW only accept it either way. ReorderFrom moves data
// between the formats (on any device); CopyFrom and ConvertFrom refuse to mix them. Resize keeps
// the storage when it is big enough, so per-batch reshapes do not reallocate, and keeps the
// format while the shape stays 4-D.
//
// Views: View(shape, offset) is a tensor over elements [offset, offset + numel) of the same
// storage. The data-parallel glue seats every parameter gradient as such a view into one flat
// block, so a gradient bucket is a contiguous range (no packing copy, one registration).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "engine/tensor/dtype.h"

namespace cortado {

using Shape = std::vector<int64_t>;
std::string ShapeString(const Shape& shape);
int64_t ShapeNumel(const Shape& shape);

// kTest: host memory behind a device runtime of its own, guarded so that only device kernels
// touch it (engine/tensor/test_device.h): the device code paths, run and checked without a GPU.
enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1, kTest = 2 };

// How the elements of a 4-D (N, C, H, W) tensor lie in memory (see the header paragraph).
enum class MemoryFormat : uint8_t { kNCHW = 0, kNHWC = 1 };
// "nchw" or "nhwc".
const char* MemoryFormatName(MemoryFormat format);

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device CPU() { return Device{}; }
  bool operator==(const Device& o) const = default;
  std::string ToString() const;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

// 64-byte aligned host memory (cache lines, AVX-512 loads).
const std::shared_ptr<Allocator>& CpuAllocator();

// A block of memory owned by one allocator; freed when the last Tensor drops it.
class Storage {
 public:
  Storage(size_t bytes, std::shared_ptr<Allocator> allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  Device device_;  // the allocator's, kept here so host access checks it without a call
  size_t bytes_ = 0;
  std::shared_ptr<Allocator> allocator_;
};

class Tensor {
 public:
  Tensor() = default;
  // Storage from `allocator` (null: CpuAllocator()); so are reallocations by Resize and Clone.
  explicit Tensor(Shape shape, DType dtype = DType::kF32,
                  std::shared_ptr<Allocator> allocator = nullptr);

  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU(); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }
  bool defined() const { return allocator_ != nullptr; }
  bool empty() const { return numel_ == 0; }
  MemoryFormat format() const { return format_; }
  bool channels_last() const { return format_ == MemoryFormat::kNHWC; }
  // Labels the memory as `format`; moves no data (ReorderFrom does). kNHWC needs a 4-D shape.
  void set_format(MemoryFormat format);
  // Whether both formats put this tensor's elements at the same places: not 4-D, or a 4-D
  // tensor whose H * W or C is 1 (a pooled (N, C, 1, 1) feature vector, a 1-channel image).
  bool IsLayoutTrivial() const;

  // Typed host access; throws when T does not match dtype() or the tensor is not on the CPU.
  template <typename T>
  T* data() {
    CheckHost(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  const T* data() const {
    CheckHost(DTypeOf<T>::value);
    return static_cast<const T*>(raw_data());
  }
  // Typed pointer on the tensor's own device, for device kernels (and the runtimes that launch
  // them); throws only when T does not match dtype().
  template <typename T>
  T* device_data() const {
    CheckType(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  // A name for messages ("conv1.weight", a blob's name); empty by default. Copies keep it.
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // Throws, naming the tensor, its device and `what`, unless it is on the CPU.
  void CheckOnHost(const char* what) const;
  void* raw_data() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ * DTypeSize(dtype_) : nullptr;
  }
  // Element offset of this tensor's first element in its storage (non-zero only for views).
  int64_t storage_offset() const { return offset_; }
  // True when both tensors use the same storage block.
  bool SharesStorageWith(const Tensor& other) const {
    return storage_ != nullptr && storage_ == other.storage_;
  }

  // Changes the shape (and dtype, if given); reallocates only when the storage (from this
  // tensor's offset) is too small, which detaches a view from its block. The format stays
  // while the new shape is 4-D and becomes kNCHW otherwise.
  void Resize(const Shape& shape);
  void Resize(const Shape& shape, DType dtype);
  // Same storage, new shape with the same element count. A channels-last tensor keeps its
  // format under its own shape; another shape is a row-major view, which it can only be when
  // its layout is trivial (else this throws: reorder it to NCHW first).
  Tensor View(const Shape& shape) const;
  // Same storage, elements [offset, offset + numel(shape)) of this tensor, as `shape` (row-major;
  // the same rule for a channels-last tensor).
  Tensor View(const Shape& shape, int64_t offset) const;
  void Zero();
  void Fill(double value);
  Tensor Clone() const;
  // Copies elements from src: same element count and dtype, same device, and the same memory
  // format unless the layout is trivial (mixing formats throws: use ReorderFrom).
  void CopyFrom(const Tensor& src);
  // Copies src (same shape, dtype and device; 4-D) into this tensor's memory format, moving
  // each element to its place there (a plain copy when the formats agree). On a GPU through
  // its DeviceRuntime.
  void ReorderFrom(const Tensor& src);
  // This tensor in `format`: itself when already there, else a reordered copy (same device).
  Tensor Reordered(MemoryFormat format) const;
  // This tensor on `device` (itself when already there): a copy in the device's memory (a GPU's
  // caching allocator, the host's CpuAllocator), synchronous when the target is the host.
  Tensor To(Device device) const;
  // Converts elements from src (any float dtype) into this tensor's dtype; same element count.
  void ConvertFrom(const Tensor& src);
  bool SameShape(const Tensor& other) const { return shape_ == other.shape_; }
  std::string ToString() const;  // "f32[128, 1, 28, 28]", "f32[16, 64, 56, 56] nhwc"

 private:
  void CheckType(DType want) const;
  void CheckHost(DType want) const {
    if (want != dtype_ || (storage_ && storage_->device().type != DeviceType::kCPU)) {
      FailHostAccess(want);
    }
  }
  [[noreturn]] void FailHostAccess(DType want) const;
  void CheckSameFormat(const Tensor& src, const char* what) const;

  Shape shape_;
  int64_t numel_ = 0;
  int64_t offset_ = 0;  // in elements, from the start of storage_
  DType dtype_ = DType::kF32;
  MemoryFormat format_ = MemoryFormat::kNCHW;
  std::shared_ptr<Allocator> allocator_;
  std::shared_ptr<Storage> storage_;
  std::string name_;
};

// A named value with its gradient, as data flows through the net (Caffe's Blob).
struct Blob {
  std::string name;
  Tensor data;
  Tensor grad;
};

// Reads element i of a float tensor of any floating dtype as double (for tests and tools); i
// is the index in memory (for a channels-last tensor, in (N, H, W, C) order).
double ElementAsDouble(const Tensor& t, int64_t i);

// Moves a dense (N, C, H, W) array between the formats on the host: `elem` bytes per element,
// src in `from`, dst in `to` (the buffers must not overlap). Threads: ParallelFor over images.
void ReorderHost(const void* src, MemoryFormat from, void* dst, MemoryFormat to, const Shape& shape,
                 size_t elem);

}  // namespace cortado
