#include "engine/tensor/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "cortado/dist/codec.h"
#include "engine/base/thread_pool.h"
#include "engine/tensor/device_runtime.h"

namespace cortado {

std::string ShapeString(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t ShapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    CORTADO_CHECK(d >= 0, "negative dimension in shape ", ShapeString(shape));
    n *= d;
  }
  return n;
}

const char* MemoryFormatName(MemoryFormat format) {
  return format == MemoryFormat::kNHWC ? "nhwc" : "nchw";
}

std::string Device::ToString() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return StrCat("cuda:", index);
    case DeviceType::kTest:
      return StrCat("test:", index);
  }
  return "unknown device";
}

namespace {
class AlignedCpuAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    CORTADO_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void Free(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::CPU(); }
};
}  // namespace

const std::shared_ptr<Allocator>& CpuAllocator() {
  static const std::shared_ptr<Allocator> allocator = std::make_shared<AlignedCpuAllocator>();
  return allocator;
}

Storage::Storage(size_t bytes, std::shared_ptr<Allocator> allocator)
    : device_(allocator->device()), bytes_(bytes), allocator_(std::move(allocator)) {
  data_ = allocator_->Allocate(bytes);
}
Storage::~Storage() {
  if (data_ != nullptr) allocator_->Free(data_, bytes_);
}

Tensor::Tensor(Shape shape, DType dtype, std::shared_ptr<Allocator> allocator)
    : dtype_(dtype), allocator_(allocator ? std::move(allocator) : CpuAllocator()) {
  Resize(shape);
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  CORTADO_CHECK(j >= 0 && j < n, "dimension ", i, " out of range for tensor ", ToString());
  return shape_[j];
}

void Tensor::set_format(MemoryFormat format) {
  CORTADO_CHECK(format == MemoryFormat::kNCHW || ndim() == 4, "tensor ", ToString(), " cannot be ",
                MemoryFormatName(format), ": only 4-d (N, C, H, W) tensors can");
  format_ = format;
}

bool Tensor::IsLayoutTrivial() const {
  return ndim() != 4 || shape_[1] == 1 || shape_[2] * shape_[3] == 1;
}

void Tensor::Resize(const Shape& shape) { Resize(shape, dtype_); }

void Tensor::Resize(const Shape& shape, DType dtype) {
  if (allocator_ == nullptr) allocator_ = CpuAllocator();
  int64_t n = ShapeNumel(shape);
  size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
  // A view keeps its place in the block unless it outgrows it (or is re-typed off alignment).
  const size_t offset_bytes = static_cast<size_t>(offset_) * DTypeSize(dtype_);
  if (!storage_ || offset_bytes % DTypeSize(dtype) != 0 ||
      storage_->bytes() < offset_bytes + bytes) {
    storage_ = std::make_shared<Storage>(std::max<size_t>(bytes, 1), allocator_);
    offset_ = 0;
  } else {
    offset_ = static_cast<int64_t>(offset_bytes / DTypeSize(dtype));
  }
  shape_ = shape;
  numel_ = n;
  dtype_ = dtype;
  if (shape_.size() != 4) format_ = MemoryFormat::kNCHW;
}

Tensor Tensor::View(const Shape& shape) const {
  CORTADO_CHECK(ShapeNumel(shape) == numel_, "cannot view ", ToString(), " as ",
                ShapeString(shape));
  Tensor t = *this;
  if (shape == shape_) return t;
  CORTADO_CHECK(!channels_last() || IsLayoutTrivial(), "cannot view ", ToString(), " as ",
                ShapeString(shape), ": its elements are in NHWC order; reorder it to NCHW first");
  t.shape_ = shape;
  t.format_ = MemoryFormat::kNCHW;
  return t;
}

Tensor Tensor::View(const Shape& shape, int64_t offset) const {
  const int64_t n = ShapeNumel(shape);
  CORTADO_CHECK(offset >= 0 && offset + n <= numel_, "cannot view elements [", offset, ", ",
                offset + n, ") of ", ToString());
  CORTADO_CHECK(!channels_last() || IsLayoutTrivial(), "cannot view elements of ", ToString(),
                ": its elements are in NHWC order; reorder it to NCHW first");
  Tensor t = *this;
  t.shape_ = shape;
  t.numel_ = n;
  t.offset_ = offset_ + offset;
  t.format_ = MemoryFormat::kNCHW;
  return t;
}

void Tensor::Zero() {
  if (numel_ == 0) return;
  if (device().type != DeviceType::kCPU) return RuntimeFor(device()).Fill(*this, 0.0);
  std::memset(raw_data(), 0, nbytes());
}

void Tensor::Fill(double value) {
  if (device().type != DeviceType::kCPU) return RuntimeFor(device()).Fill(*this, value);
  switch (dtype_) {
    case DType::kF32:
      std::fill_n(data<float>(), numel_, static_cast<float>(value));
      break;
    case DType::kF64:
      std::fill_n(data<double>(), numel_, value);
      break;
    case DType::kI32:
      std::fill_n(data<int32_t>(), numel_, static_cast<int32_t>(value));
      break;
    case DType::kU8:
      std::fill_n(data<uint8_t>(), numel_, static_cast<uint8_t>(value));
      break;
    case DType::kF16:
      std::fill_n(data<Half>(), numel_, FloatToHalf(static_cast<float>(value)));
      break;
    case DType::kBF16:
      std::fill_n(data<BFloat16>(), numel_, FloatToBFloat16(static_cast<float>(value)));
      break;
  }
}

Tensor Tensor::Clone() const {
  Tensor t(shape_, dtype_, allocator_);
  t.format_ = format_;
  t.name_ = name_;
  t.CopyFrom(*this);
  return t;
}

void Tensor::CheckSameFormat(const Tensor& src, const char* what) const {
  CORTADO_CHECK(src.format_ == format_ || (IsLayoutTrivial() && src.IsLayoutTrivial()), what, ": ",
                src.ToString(), " into ", ToString(),
                " mixes memory formats; use ReorderFrom to move elements between them");
}

void Tensor::CopyFrom(const Tensor& src) {
  CORTADO_CHECK(src.numel_ == numel_ && src.dtype_ == dtype_, "CopyFrom: ", src.ToString(),
                " into ", ToString());
  CheckSameFormat(src, "CopyFrom");
  CORTADO_CHECK(src.device() == device(), "CopyFrom across devices (", src.device().ToString(),
                " to ", device().ToString(), ") must be explicit: use To(device)");
  if (numel_ == 0 || raw_data() == src.raw_data()) return;
  if (device().type != DeviceType::kCPU) return RuntimeFor(device()).Copy(*this, src);
  std::memcpy(raw_data(), src.raw_data(), nbytes());
}

Tensor Tensor::To(Device target) const {
  if (target == device()) return *this;
  const Device gpu = target.type != DeviceType::kCPU ? target : device();
  DeviceRuntime& runtime = RuntimeFor(gpu);
  Tensor t(
      shape_, dtype_,
      target.type == DeviceType::kCPU ? CpuAllocator() : runtime.DeviceAllocator(target.index));
  t.format_ = format_;
  t.name_ = name_;
  if (numel_ > 0) runtime.Copy(t, *this);
  return t;
}

namespace {

// Transposes one image's (rows, cols) matrix into (cols, rows) in tiles that stay in cache:
// NCHW -> NHWC is (C, HW) -> (HW, C), and back. U is an unsigned type of the element's size.
template <typename U>
void TransposeTiles(const U* __restrict src, U* __restrict dst, int64_t rows, int64_t cols,
                    int64_t col_begin, int64_t col_end) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(r0 + kTile, rows);
    for (int64_t c0 = col_begin; c0 < col_end; c0 += kTile) {
      const int64_t c1 = std::min(c0 + kTile, col_end);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

template <typename U>
void ReorderTyped(const void* src, MemoryFormat from, void* dst, const Shape& shape) {
  const int64_t n = shape[0], c = shape[1], hw = shape[2] * shape[3];
  const int64_t image = c * hw;
  // (C, HW) -> (HW, C) from NCHW, (HW, C) -> (C, HW) from NHWC.
  const int64_t rows = from == MemoryFormat::kNCHW ? c : hw;
  const int64_t cols = from == MemoryFormat::kNCHW ? hw : c;
  // Work items: column ranges of every image, so one large image uses every thread too.
  const int64_t col_chunk = std::max<int64_t>(32, (cols + 7) / 8);
  const int64_t chunks = (cols + col_chunk - 1) / col_chunk;
  ParallelFor(n * chunks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t img = i / chunks, k = i % chunks;
      TransposeTiles(static_cast<const U*>(src) + img * image, static_cast<U*>(dst) + img * image,
                     rows, cols, k * col_chunk, std::min(cols, (k + 1) * col_chunk));
    }
  });
}

}  // namespace

void ReorderHost(const void* src, MemoryFormat from, void* dst, MemoryFormat to, const Shape& shape,
                 size_t elem) {
  CORTADO_CHECK(shape.size() == 4, "reorder of a ", shape.size(), "-d shape ", ShapeString(shape),
                " (only 4-d tensors have a memory format)");
  CORTADO_CHECK(src != dst || from == to, "reorder in place is not supported");
  const int64_t n = ShapeNumel(shape);
  if (from == to || shape[1] == 1 || shape[2] * shape[3] == 1) {
    if (n > 0 && src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * elem);
    return;
  }
  switch (elem) {
    case 1:
      return ReorderTyped<uint8_t>(src, from, dst, shape);
    case 2:
      return ReorderTyped<uint16_t>(src, from, dst, shape);
    case 4:
      return ReorderTyped<uint32_t>(src, from, dst, shape);
    case 8:
      return ReorderTyped<uint64_t>(src, from, dst, shape);
    default:
      Fail("reorder: elements of ", elem, " bytes are not supported");
  }
}

void Tensor::ReorderFrom(const Tensor& src) {
  CORTADO_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "ReorderFrom: ", src.ToString(),
                " into ", ToString(), " (same shape and dtype needed)");
  CORTADO_CHECK(src.device() == device(), "ReorderFrom across devices (", src.device().ToString(),
                " to ", device().ToString(), ") must be explicit: use To(device)");
  if (src.format_ == format_ || IsLayoutTrivial()) return CopyFrom(src.View(shape_));
  CORTADO_CHECK(raw_data() != src.raw_data(), "ReorderFrom: ", src.ToString(),
                " into itself (a reorder cannot run in place)");
  if (device().type != DeviceType::kCPU) return RuntimeFor(device()).Reorder(*this, src);
  ReorderHost(src.raw_data(), src.format_, raw_data(), format_, shape_, DTypeSize(dtype_));
}

Tensor Tensor::Reordered(MemoryFormat format) const {
  if (format == format_) return *this;
  Tensor t(shape_, dtype_, allocator_);
  t.set_format(format);
  t.ReorderFrom(*this);
  return t;
}

double ElementAsDouble(const Tensor& t, int64_t i) {
  CORTADO_CHECK(t.device().type == DeviceType::kCPU, "cannot read ", t.ToString(), " on ",
                t.device().ToString(), " element by element: copy it to the host with To(cpu)");
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kF64:
      return t.data<double>()[i];
    case DType::kF16:
      return HalfToFloat(t.data<Half>()[i]);
    case DType::kBF16:
      return BFloat16ToFloat(t.data<BFloat16>()[i]);
    case DType::kI32:
      return t.data<int32_t>()[i];
    case DType::kU8:
      return t.data<uint8_t>()[i];
  }
  return 0;
}

namespace {
// Elements per task of a vectorized conversion (a few hundred KB of traffic).
constexpr int64_t kConvertChunk = 65536;
}  // namespace

void Tensor::ConvertFrom(const Tensor& src) {
  CORTADO_CHECK(src.numel_ == numel_, "ConvertFrom: ", src.ToString(), " into ", ToString());
  CheckSameFormat(src, "ConvertFrom");
  if (src.dtype_ == dtype_) return CopyFrom(src);
  if (device().type != DeviceType::kCPU || src.device().type != DeviceType::kCPU) {
    CORTADO_CHECK(src.device() == device(), "ConvertFrom across devices (", src.device().ToString(),
                  " to ", device().ToString(), ") must be explicit");
    return RuntimeFor(device()).Convert(*this, src);
  }
  // Mixed precision's conversions (f32 to and from bf16 and f16, round to nearest even) go
  // through the gradient codecs' vector kernels; they equal FloatToHalf/FloatToBFloat16.
  const bool low_dst = dtype_ == DType::kBF16 || dtype_ == DType::kF16;
  const bool low_src = src.dtype_ == DType::kBF16 || src.dtype_ == DType::kF16;
  if ((src.dtype_ == DType::kF32 && low_dst) || (low_src && dtype_ == DType::kF32)) {
    const DType low = low_dst ? dtype_ : src.dtype_;
    const dist::CodecKind kind =
        low == DType::kBF16 ? dist::CodecKind::kBF16 : dist::CodecKind::kF16;
    const char* in = static_cast<const char*>(src.raw_data());
    char* out = static_cast<char*>(raw_data());
    ParallelFor(numel_, kConvertChunk, [&](int64_t begin, int64_t end) {
      const size_t n = static_cast<size_t>(end - begin);
      if (low_dst) {
        dist::Encode(kind, reinterpret_cast<const float*>(in) + begin, n, out + begin * 2);
      } else {
        dist::Decode(kind, in + begin * 2, n, reinterpret_cast<float*>(out) + begin);
      }
    });
    return;
  }
  for (int64_t i = 0; i < numel_; ++i) {
    double v = ElementAsDouble(src, i);
    switch (dtype_) {
      case DType::kF32:
        data<float>()[i] = static_cast<float>(v);
        break;
      case DType::kF64:
        data<double>()[i] = v;
        break;
      case DType::kF16:
        data<Half>()[i] = FloatToHalf(static_cast<float>(v));
        break;
      case DType::kBF16:
        data<BFloat16>()[i] = FloatToBFloat16(static_cast<float>(v));
        break;
      case DType::kI32:
        data<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      case DType::kU8:
        data<uint8_t>()[i] = static_cast<uint8_t>(v);
        break;
    }
  }
}

std::string Tensor::ToString() const {
  return StrCat(DTypeName(dtype_), ShapeString(shape_), channels_last() ? " nhwc" : "");
}

void Tensor::CheckType(DType want) const {
  CORTADO_CHECK(want == dtype_, "tensor ", name_.empty() ? "" : StrCat("'", name_, "' "),
                ToString(), " accessed as ", DTypeName(want));
}

void Tensor::FailHostAccess(DType want) const {
  CheckType(want);
  CheckOnHost("read or written by host code");
  Fail("internal: host access of ", ToString(), " refused for no reason");
}

void Tensor::CheckOnHost(const char* what) const {
  if (device().type == DeviceType::kCPU) return;
  Fail("tensor ", name_.empty() ? "" : StrCat("'", name_, "' "), ToString(), " is on ",
       device().ToString(), " and cannot be ", what, "; copy it with To(cpu) first");
}

}  // namespace cortado
