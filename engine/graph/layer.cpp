#include "engine/graph/layer.h"

#include <map>
#include <mutex>
#include <tuple>

#include "engine/base/random.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"

namespace cortado {

Layer::Layer(const LayerSpec& spec) : spec_(spec) {
  spec_.settings.set_owner(Describe() + (spec_.where.empty() ? "" : " at " + spec_.where));
}

std::string Layer::Describe() const {
  return StrCat("layer '", spec_.name, "' (", spec_.type, ")");
}

const LayerContext& Layer::context() const {
  static const LayerContext kDefault;
  return context_ != nullptr ? *context_ : kDefault;
}

void Layer::SetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const int n_in = static_cast<int>(bottom.size());
  const int n_out = static_cast<int>(top.size());
  if (MinInputs() >= 0 && n_in < MinInputs()) {
    Fail(Describe(), ": needs at least ", MinInputs(), " input(s), got ", n_in);
  }
  if (MaxInputs() >= 0 && n_in > MaxInputs()) {
    Fail(Describe(), ": takes at most ", MaxInputs(), " input(s), got ", n_in);
  }
  if (NumOutputs() >= 0 && n_out != NumOutputs()) {
    Fail(Describe(), ": has ", NumOutputs(), " output(s), got ", n_out);
  }
  if (IsLoss()) loss_weight_ = static_cast<float>(settings().GetFloat("loss_weight", 1.0));
  LayerSetUp(bottom, top);
  Reshape(bottom, top);
}

namespace {

// Staging tensor `index` of `pool` as f32 of `shape` in `format` (reused across calls; grows as
// needed).
Tensor& Staged(std::vector<Tensor>& pool, size_t index, const Shape& shape,
               MemoryFormat format = MemoryFormat::kNCHW) {
  if (pool.size() <= index) pool.resize(index + 1);
  pool[index].Resize(shape, DType::kF32);
  pool[index].set_format(shape.size() == 4 ? format : MemoryFormat::kNCHW);
  return pool[index];
}

}  // namespace

void Layer::Forward(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  CORTADO_CHECK(!bottom.empty(), Describe(), ": Forward without inputs");
  const Tensor& x = bottom[0]->data;
  CheckDevices(bottom, x.device(), false, "input");
  if (absorbed_) {
    // The layer before computes this one's output in its own; the output shares the input.
    top[0]->data = bottom[0]->data;
    return;
  }
  CheckFormats(bottom, false);
  if (x.device().type != DeviceType::kCPU) return ForwardOnDevice(bottom, top);
  ForwardOnCpu(bottom, top);
}

void Layer::ForwardOnCpu(const Blobs& bottom, const Blobs& top) {
  switch (bottom[0]->data.dtype()) {
    case DType::kF32:
      return ForwardF32(bottom, top);
    case DType::kF64:
      return ForwardF64(bottom, top);
    case DType::kBF16:
      return ForwardBF16(bottom, top);
    case DType::kF16:
      return ForwardF16(bottom, top);
    default:
      return ForwardOtherDType(bottom, top);
  }
}

void Layer::Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                     const std::vector<Blob*>& bottom) {
  CORTADO_CHECK(!bottom.empty(), Describe(), ": Backward without inputs");
  CORTADO_CHECK(!absorbed_, Describe(),
                ": Backward of a layer absorbed by the one before it "
                "(absorption is for inference nets only)");
  const Device device = bottom[0]->data.device();
  CheckDevices(bottom, device, false, "input");
  CheckDevices(top, device, true, "gradient of");
  CheckFormats(top, true);
  if (device.type != DeviceType::kCPU) return BackwardOnDevice(top, propagate_down, bottom);
  BackwardOnCpu(top, propagate_down, bottom);
}

void Layer::BackwardOnCpu(const Blobs& top, const std::vector<bool>& propagate_down,
                          const Blobs& bottom) {
  switch (bottom[0]->data.dtype()) {
    case DType::kF32:
      return BackwardF32(top, propagate_down, bottom);
    case DType::kF64:
      return BackwardF64(top, propagate_down, bottom);
    case DType::kBF16:
      return BackwardBF16(top, propagate_down, bottom);
    case DType::kF16:
      return BackwardF16(top, propagate_down, bottom);
    default:
      return BackwardOtherDType(top, propagate_down, bottom);
  }
}

void Layer::CheckDevices(const Blobs& blobs, Device device, bool grads, const char* what) const {
  for (const Blob* b : blobs) {
    const Tensor& t = grads ? b->grad : b->data;
    if (t.defined() && !t.empty() && t.device() != device) {
      Fail(Describe(), ": ", what, " '", b->name, "' is on ", t.device().ToString(), ", not on ",
           device.ToString(), " with its first input: a layer runs on one device");
    }
  }
}

void Layer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  if (bottom[0]->data.device().type == DeviceType::kTest && RunsCpuKernelOnTestDevice()) {
    return CpuKernelOnTestDevice(top, nullptr, bottom);
  }
  Fail(Describe(), ": input '", bottom[0]->name, "' is on ", bottom[0]->data.device().ToString(),
       ", and this layer has no kernels for that device (only the CPU's)");
}

void Layer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                             const Blobs& bottom) {
  if (bottom[0]->data.device().type == DeviceType::kTest && RunsCpuKernelOnTestDevice()) {
    return CpuKernelOnTestDevice(top, &propagate_down, bottom);
  }
  Fail(Describe(), ": backward of input '", bottom[0]->name, "' on ",
       bottom[0]->data.device().ToString(),
       ", and this layer has no kernels for that device (only the CPU's)");
}

void Layer::CpuKernelOnTestDevice(const Blobs& top, const std::vector<bool>* propagate_down,
                                  const Blobs& bottom) {
  const Device device = bottom[0]->data.device();
  // Everything the CPU kernel may touch of the device: the blobs, the params and the buffers
  // (scratch and staging are host memory of the layer's own).
  std::vector<Tensor> given;
  for (const Blobs* blobs : {&bottom, &top}) {
    for (const Blob* b : *blobs) {
      given.push_back(b->data);
      given.push_back(b->grad);
    }
  }
  for (const Param& p : params_) {
    given.push_back(p.value);
    given.push_back(p.grad);
  }
  for (const Buffer& b : buffers_) given.push_back(b.value);
  LaunchOnTestDevice(device, given, [&] {
    std::vector<Tensor> alias = TestDeviceHostAliases(given);
    size_t k = 0;
    std::vector<Blob> host_bottom(bottom.size()), host_top(top.size());
    Blobs hb, ht;
    for (auto [blobs, host, ptrs] :
         {std::tuple{&bottom, &host_bottom, &hb}, std::tuple{&top, &host_top, &ht}}) {
      for (size_t i = 0; i < blobs->size(); ++i) {
        (*host)[i].name = (*blobs)[i]->name;
        (*host)[i].data = alias[k++];
        (*host)[i].grad = alias[k++];
        ptrs->push_back(&(*host)[i]);
      }
    }
    // The layer's own tensors: the aliases while the kernel runs, the device's again after.
    for (Param& p : params_) {
      std::swap(p.value, alias[k++]);
      std::swap(p.grad, alias[k++]);
    }
    for (Buffer& b : buffers_) std::swap(b.value, alias[k++]);
    struct Restore {
      Layer* layer;
      std::vector<Tensor>* alias;
      size_t first;
      ~Restore() {
        size_t j = first;
        for (Param& p : layer->params_) {
          std::swap(p.value, (*alias)[j++]);
          std::swap(p.grad, (*alias)[j++]);
        }
        for (Buffer& b : layer->buffers_) std::swap(b.value, (*alias)[j++]);
      }
    } restore{this, &alias, 2 * (bottom.size() + top.size())};
    if (propagate_down == nullptr) {
      ForwardOnCpu(hb, ht);
    } else {
      BackwardOnCpu(ht, *propagate_down, hb);
    }
  });
  // The layer's state (the swapped tensors, caches its kernel keeps) is the host thread's again
  // only once the kernel has run; a kernel's error surfaces here.
  RuntimeFor(device).Synchronize(device.index);
}

void Layer::CheckFormats(const Blobs& blobs, bool grads) const {
  if (TakesChannelsLast()) return;
  for (const Blob* b : blobs) {
    const Tensor& t = grads ? b->grad : b->data;
    if (t.channels_last() && !t.IsLayoutTrivial()) {
      Fail(Describe(), ": ", grads ? "gradient of '" : "input '", b->name, "' is ", t.ToString(),
           ", channels-last, but this layer takes NCHW only (a net inserts a Reorder before it)");
    }
  }
}

void Layer::ForwardOtherDType(const Blobs& bottom, const Blobs&) {
  Fail(Describe(), ": input '", bottom[0]->name, "' is ", bottom[0]->data.ToString(),
       "; layers compute in f32, f64, bf16 or f16");
}

void Layer::BackwardOtherDType(const Blobs&, const std::vector<bool>&, const Blobs& bottom) {
  Fail(Describe(), ": input '", bottom[0]->name, "' is ", bottom[0]->data.ToString(),
       "; layers compute in f32, f64, bf16 or f16");
}

void Layer::ForwardF32(const Blobs&, const Blobs&) { Fail(Describe(), ": has no f32 kernel"); }
void Layer::ForwardF64(const Blobs&, const Blobs&) { Fail(Describe(), ": has no f64 kernel"); }
void Layer::ForwardBF16(const Blobs& bottom, const Blobs& top) { ForwardInF32(bottom, top); }
void Layer::ForwardF16(const Blobs& bottom, const Blobs& top) { ForwardInF32(bottom, top); }
void Layer::BackwardF32(const Blobs&, const std::vector<bool>&, const Blobs&) {
  Fail(Describe(), ": has no f32 backward kernel");
}
void Layer::BackwardF64(const Blobs&, const std::vector<bool>&, const Blobs&) {
  Fail(Describe(), ": has no f64 backward kernel");
}
void Layer::BackwardBF16(const Blobs& top, const std::vector<bool>& propagate_down,
                         const Blobs& bottom) {
  BackwardInF32(top, propagate_down, bottom);
}
void Layer::BackwardF16(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) {
  BackwardInF32(top, propagate_down, bottom);
}

void Layer::ForwardInF32(const Blobs& bottom, const Blobs& top) {
  std::vector<Tensor>& pool = context().scratch ? context().scratch->Staging() : own_staging_;
  size_t next = 0;
  std::vector<Blob> wide(bottom.size() + top.size());
  Blobs wide_bottom, wide_top;
  for (size_t i = 0; i < bottom.size(); ++i) {
    Blob& w = wide[i];
    w.name = bottom[i]->name;
    if (IsLowPrecision(bottom[i]->data.dtype())) {
      w.data = Staged(pool, next++, bottom[i]->data.shape(), bottom[i]->data.format());
      w.data.ConvertFrom(bottom[i]->data);
    } else {
      w.data = bottom[i]->data;
    }
    wide_bottom.push_back(&w);
  }
  for (size_t j = 0; j < top.size(); ++j) {
    Blob& w = wide[bottom.size() + j];
    w.name = top[j]->name;
    w.data = IsLowPrecision(top[j]->data.dtype())
                 ? Staged(pool, next++, top[j]->data.shape(), top[j]->data.format())
                 : top[j]->data;
    wide_top.push_back(&w);
  }
  ForwardF32(wide_bottom, wide_top);
  for (size_t j = 0; j < top.size(); ++j) {
    if (IsLowPrecision(top[j]->data.dtype())) top[j]->data.ConvertFrom(wide_top[j]->data);
  }
}

void Layer::BackwardInF32(const Blobs& top, const std::vector<bool>& propagate_down,
                          const Blobs& bottom) {
  std::vector<Tensor>& pool = context().scratch ? context().scratch->Staging() : own_staging_;
  size_t next = 0;
  // Widens a low-precision tensor into the next staging buffer (others are shared).
  auto widen = [&](const Tensor& t) {
    if (!IsLowPrecision(t.dtype()) || !t.defined()) return t;
    Tensor& w = Staged(pool, next++, t.shape(), t.format());
    w.ConvertFrom(t);
    return w;
  };
  std::vector<Blob> wide(bottom.size() + top.size());
  Blobs wide_bottom, wide_top;
  // What the kernel does not read keeps its 16-bit tensor (shape and size stay right; reading it
  // as f32 would throw), which saves a conversion of every activation the layer skips.
  const bool reads_outputs = BackwardReadsOutputs(), reads_inputs = BackwardReadsInputs();
  for (size_t j = 0; j < top.size(); ++j) {
    Blob& w = wide[bottom.size() + j];
    w.name = top[j]->name;
    w.data = reads_outputs ? widen(top[j]->data) : top[j]->data;
    w.grad = widen(top[j]->grad);
    wide_top.push_back(&w);
  }
  for (size_t i = 0; i < bottom.size(); ++i) {
    Blob& w = wide[i];
    w.name = bottom[i]->name;
    w.data = reads_inputs ? widen(bottom[i]->data) : bottom[i]->data;
    const bool wants = i < propagate_down.size() && propagate_down[i];
    if (wants && IsLowPrecision(bottom[i]->grad.dtype())) {
      w.grad = Staged(pool, next++, bottom[i]->grad.shape(), bottom[i]->grad.format());
    } else {
      w.grad = bottom[i]->grad;
    }
    wide_bottom.push_back(&w);
  }
  BackwardF32(wide_top, propagate_down, wide_bottom);
  for (size_t i = 0; i < bottom.size(); ++i) {
    const bool wants = i < propagate_down.size() && propagate_down[i];
    if (wants && IsLowPrecision(bottom[i]->grad.dtype())) {
      bottom[i]->grad.ConvertFrom(wide_bottom[i]->grad);
    }
  }
}

Param& Layer::AddParam(const std::string& suffix, const Shape& shape, DType dtype, ParamKind kind) {
  dtype = MasterDType(dtype);
  Param p;
  p.name = spec_.name + "." + suffix;
  p.value = Tensor(shape, dtype);
  p.value.set_name(p.name);
  p.value.Zero();
  if (!context().inference) {
    p.grad = Tensor(shape, dtype);
    p.grad.set_name(p.name + " (gradient)");
    p.grad.Zero();
  }
  p.kind = kind;
  params_.push_back(std::move(p));
  return params_.back();
}

Buffer& Layer::AddBuffer(const std::string& suffix, const Shape& shape, DType dtype) {
  dtype = MasterDType(dtype);
  Buffer b{spec_.name + "." + suffix, Tensor(shape, dtype)};
  b.value.set_name(b.name);
  b.value.Zero();
  buffers_.push_back(std::move(b));
  return buffers_.back();
}

uint64_t Layer::InitSeed() const { return HashCombine(context().seed, HashString(spec_.name)); }

namespace {
std::map<std::string, LayerRegistry::Creator>& Creators() {
  static std::map<std::string, LayerRegistry::Creator> creators;
  return creators;
}
std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
}  // namespace

void LayerRegistry::Register(const std::string& type, Creator creator) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  CORTADO_ASSERT(Creators().count(type) == 0);
  Creators()[type] = std::move(creator);
}

std::unique_ptr<Layer> LayerRegistry::Create(const LayerSpec& spec) {
  Creator creator;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Creators().find(spec.type);
    if (it == Creators().end()) {
      std::string known;
      for (const auto& [name, c] : Creators()) known += (known.empty() ? "" : ", ") + name;
      Fail("layer '", spec.name, "'", spec.where.empty() ? "" : " at " + spec.where,
           ": unknown type '", spec.type, "' (known: ", known, ")");
    }
    creator = it->second;
  }
  return creator(spec);
}

std::vector<std::string> LayerRegistry::Types() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<std::string> types;
  for (const auto& [name, c] : Creators()) types.push_back(name);
  return types;
}

bool LayerRegistry::Has(const std::string& type) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  return Creators().count(type) != 0;
}

}  // namespace cortado
