#include "engine/layer.h"

#include <map>
#include <mutex>

#include "engine/random.h"

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

Param& Layer::AddParam(const std::string& suffix, const Shape& shape, DType dtype, ParamKind kind) {
  Param p;
  p.name = spec_.name + "." + suffix;
  p.value = Tensor(shape, dtype);
  p.value.Zero();
  p.grad = Tensor(shape, dtype);
  p.grad.Zero();
  p.kind = kind;
  params_.push_back(std::move(p));
  return params_.back();
}

Buffer& Layer::AddBuffer(const std::string& suffix, const Shape& shape, DType dtype) {
  Buffer b{spec_.name + "." + suffix, Tensor(shape, dtype)};
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
