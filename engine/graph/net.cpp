#include "engine/graph/net.h"

#include <chrono>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

#include "engine/base/log.h"
#include "engine/tensor/device_runtime.h"

namespace cortado {
namespace {
double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

Net::Net(const NetSpec& original_spec, uint64_t seed, DType dtype, NetOptions options)
    : options_(options), name_(original_spec.name) {
  const NetSpec spec = options_.fuse ? FuseSpec(original_spec) : original_spec;
  if (inference()) {
    options_.plan_memory = true;
    context_.phase = Phase::kTest;
    context_.inference = true;  // layers make no parameter gradients
  }
  CORTADO_CHECK(dtype == DType::kF32 || dtype == DType::kF64 || IsLowPrecision(dtype), "net '",
                spec.name, "': compute dtype must be f32, f64, bf16 or f16, got ",
                DTypeName(dtype));
  context_.seed = seed;
  context_.scratch = &scratch_;
  CORTADO_CHECK(!spec.layers.empty(), "net '", spec.name, "' has no layers");

  for (const NetInput& in : spec.inputs) {
    CORTADO_CHECK(!blob_index_.count(in.name), "net '", spec.name, "': input '", in.name,
                  "' is declared twice");
    auto blob = std::make_unique<Blob>();
    blob->name = in.name;
    const bool floating = in.dtype == DType::kF32 || in.dtype == DType::kF64;
    const DType t = floating && !in.keep_dtype ? dtype : in.dtype;
    blob->data = Tensor(in.shape, t);
    if (in.shape.size() == 4) blob->data.set_format(options_.layout);
    blob->data.Zero();
    blob_index_[in.name] = blobs_.size();
    blobs_.push_back(std::move(blob));
    blob_needs_grad_.push_back(false);
    grad_pooled_.push_back(false);
    external_.push_back(true);
    input_names_.push_back(in.name);
  }

  // Count consumers first: a blob read by several layers that carries a gradient gets a Split.
  std::map<std::string, int> consumers;
  for (const LayerSpec& layer : spec.layers) {
    for (const std::string& name : layer.inputs) consumers[name]++;
  }
  std::map<std::string, std::vector<std::string>> split_names;  // blob -> unused split outputs
  std::set<std::string> layer_names;

  for (const LayerSpec& original : spec.layers) {
    LayerSpec layer = original;
    std::string at = layer.where.empty() ? "" : " at " + layer.where;
    CORTADO_CHECK(!layer.name.empty(), "net '", spec.name, "': a layer", at, " has no name");
    CORTADO_CHECK(layer_names.insert(layer.name).second, "net '", spec.name,
                  "': two layers are named '", layer.name, "'", at);
    for (std::string& input : layer.inputs) {
      auto it = split_names.find(input);
      if (it != split_names.end()) {
        CORTADO_ASSERT(!it->second.empty());
        input = it->second.back();
        it->second.pop_back();
      }
    }
    AddLayer(layer);
    // Insert a Split after this layer for each output that fans out and carries a gradient.
    for (const std::string& output : original.outputs) {
      int k = consumers[output];
      if (k < 2 || !blob_needs_grad_[blob_index_.at(output)]) continue;
      LayerSpec split;
      split.name = output + "_split";
      split.type = "Split";
      split.inputs = {output};
      for (int i = k - 1; i >= 0; --i) split.outputs.push_back(StrCat(output, "_split_", i));
      split_names[output] = split.outputs;  // consumed from the back: _0 first
      AddLayer(split);
    }
  }
  if (inference() && options_.fuse) AbsorbLayers();
  PlanInPlaceLayers();
  layer_times_.resize(layers_.size());
  if (options_.device.type != DeviceType::kCPU) MoveToDevice();
}

void Net::MoveToDevice() {
  const Device device = options_.device;
  const std::shared_ptr<Allocator>& on = AllocatorFor(device);
  grad_pool_.set_allocator(on);
  activation_pool_.set_allocator(on);
  // Parameters and buffers keep their values (initialized on the host, copied once).
  for (auto& layer : layers_) {
    for (Param& p : layer->params()) {
      p.value = p.value.To(device);
      if (p.grad.defined()) p.grad = p.grad.To(device);
    }
    for (Buffer& b : layer->buffers()) b.value = b.value.To(device);
  }
  // Every blob gets device storage; the inputs keep their (zero) contents, and the layers size
  // their outputs again, which re-seats the views and shared storage they set up in Reshape.
  for (size_t i = 0; i < blobs_.size(); ++i) {
    Blob& b = *blobs_[i];
    Tensor fresh(external_[i] ? b.data.shape() : Shape{0}, b.data.dtype(), on);
    if (external_[i]) {
      fresh.set_format(b.data.format());
      fresh.Zero();
    }
    fresh.set_name(b.name);
    b.data = fresh;
    b.grad = Tensor();
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]->absorbed()) layers_[i]->Reshape(bottoms_[i], tops_[i]);
  }
}

void Net::AddLayer(LayerSpec spec) {
  std::string at = spec.where.empty() ? "" : " at " + spec.where;
  std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
  layer->set_context(&context_);
  // 4-d inputs in another format than the layer takes go through a Reorder first.
  if (spec.type != "Reorder") {
    for (std::string& name : spec.inputs) {
      if (blob_index_.count(name)) name = ReorderedInput(*layer, name);
    }
  }
  std::vector<Blob*> bottom, top;
  std::vector<bool> propagate;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const std::string& name = spec.inputs[i];
    auto it = blob_index_.find(name);
    if (it == blob_index_.end()) {
      Fail(layer->Describe(), at, ": input '", name,
           "' is not a net input nor an output of an earlier layer");
    }
    bottom.push_back(blobs_[it->second].get());
    propagate.push_back(blob_needs_grad_[it->second] && layer->CanBackpropTo(static_cast<int>(i)));
  }
  for (const std::string& name : spec.outputs) {
    CORTADO_CHECK(!blob_index_.count(name), layer->Describe(), at, ": output '", name,
                  "' already exists (in-place layers are not supported; give it a new name)");
    auto blob = std::make_unique<Blob>();
    blob->name = name;
    blob_index_[name] = blobs_.size();
    top.push_back(blob.get());
    blobs_.push_back(std::move(blob));
    blob_needs_grad_.push_back(false);
    grad_pooled_.push_back(false);
    external_.push_back(false);
  }
  layer->SetUp(bottom, top);
  layer->spec().settings.CheckAllUsed();
  bool any_propagate = false;
  for (bool p : propagate) any_propagate = any_propagate || p;
  const bool backward = !inference() && (any_propagate || !layer->params().empty());
  for (Blob* t : top) {
    blob_needs_grad_[blob_index_.at(t->name)] = backward;
  }
  bottoms_.push_back(bottom);
  tops_.push_back(top);
  propagate_down_.push_back(propagate);
  runs_backward_.push_back(backward);
  layers_.push_back(std::move(layer));
}

Blob* Net::blob(const std::string& name) {
  auto it = blob_index_.find(name);
  CORTADO_CHECK(it != blob_index_.end(), "net has no blob named '", name, "'");
  return blobs_[it->second].get();
}

Tensor& Net::input(const std::string& name) {
  for (const std::string& n : input_names_) {
    if (n == name) return blob(name)->data;
  }
  Fail("net has no input named '", name, "'");
}

void Net::SetBatchSize(int64_t batch) {
  CORTADO_CHECK(batch > 0, "batch size must be positive, got ", batch);
  for (const std::string& name : input_names_) {
    Tensor& t = blob(name)->data;
    Shape s = t.shape();
    if (!s.empty() && s[0] != batch) {
      s[0] = batch;
      t.Resize(s);
    }
  }
}

size_t Net::activation_bytes() const {
  std::set<const void*> seen;
  size_t bytes = 0;
  for (const auto& b : blobs_) {
    if (b->data.raw_data() != nullptr && seen.insert(b->data.raw_data()).second) {
      bytes += b->data.nbytes();
    }
  }
  return bytes;
}

void Net::set_phase(Phase phase) {
  CORTADO_CHECK(
      !inference() || phase == Phase::kTest,
      "an inference net runs in test phase only (build it with NetMode::kTrain to train)");
  context_.phase = phase;
}

PlanGraph Net::MakePlanGraph() const {
  PlanGraph graph;
  for (const auto& b : blobs_) graph.blob_bytes.push_back(b->data.nbytes());
  graph.external = external_;
  graph.gradients = !inference();
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    PlanLayer l;
    for (const Blob* b : bottoms_[i]) l.inputs.push_back(static_cast<int>(blob_index_.at(b->name)));
    for (size_t j = 0; j < tops_[i].size(); ++j) {
      l.outputs.push_back(static_cast<int>(blob_index_.at(tops_[i][j]->name)));
      l.shares_input.push_back(layer.SharesInputStorage(static_cast<int>(j)));
    }
    l.propagate = propagate_down_[i];
    l.runs_backward = runs_backward_[i];
    l.backward_reads_inputs = layer.BackwardReadsInputs();
    l.backward_reads_outputs = layer.BackwardReadsOutputs();
    graph.layers.push_back(std::move(l));
  }
  return graph;
}

const MemoryPlan& Net::memory_plan() {
  CORTADO_CHECK(options_.plan_memory, "net has no memory plan (NetOptions::plan_memory is off)");
  if (!planned_) {
    const PlanGraph graph = MakePlanGraph();
    plan_ = PlanMemory(graph, !inference());
    planned_bytes_ = graph.blob_bytes;
    planned_ = true;
  }
  return plan_;
}

void Net::BeginPlannedPass() {
  for (Tensor& t : held_) {
    if (activation_pool_.Holds(t)) {
      activation_pool_.Give(t);
    } else {
      t = Tensor();
    }
  }
  memory_plan();
  activation_pool_.Reserve(plan_.arena_bytes);
  held_.assign(plan_.group_bytes.size(), Tensor());
}

void Net::TakeBuffers(int step) {
  for (int g : plan_.take_before[static_cast<size_t>(step)]) {
    const size_t group = static_cast<size_t>(g);
    Blob& owner = *blobs_[static_cast<size_t>(plan_.group_blob[group])];
    Tensor& held = held_[group];
    const Shape& shape = owner.data.shape();
    const DType dtype = owner.data.dtype();
    if (static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype) <= plan_.group_bytes[group]) {
      held = activation_pool_.Take(shape, dtype, plan_.group_offset[group]);
    } else {
      // Larger than planned (shapes changed): storage of its own.
      held = Tensor(shape, dtype, AllocatorFor(options_.device));
    }
    held.set_format(owner.data.format());  // a gradient lies like its activation
    (plan_.group_is_grad[group] ? owner.grad : owner.data) = held;
  }
}

void Net::KeepWithinPlan(int step) {
  // A layer's Reshape keeps a planned buffer of the planned size; one that grew (another
  // batch or input size than the plan's) would run into its neighbours in the arena, so it
  // gets storage of its own for this pass (the next pass plans for the new sizes).
  for (int g : plan_.take_before[static_cast<size_t>(step)]) {
    const size_t group = static_cast<size_t>(g);
    if (plan_.group_is_grad[group]) continue;
    Tensor& data = blobs_[static_cast<size_t>(plan_.group_blob[group])]->data;
    if (data.nbytes() > held_[group].nbytes() && activation_pool_.Holds(data)) {
      const MemoryFormat format = data.format();
      data = Tensor(data.shape(), data.dtype(), AllocatorFor(options_.device));
      data.set_format(format);
    }
  }
}

void Net::GiveBackBuffers(int step) {
  for (int g : plan_.give_after[static_cast<size_t>(step)]) {
    Tensor& held = held_[static_cast<size_t>(g)];
    if (!held.defined()) continue;  // not taken in this pass
    if (options_.poison_released && (held.dtype() == DType::kF32 || held.dtype() == DType::kF64 ||
                                     IsLowPrecision(held.dtype()))) {
      held.Fill(std::nan(""));
    }
    if (activation_pool_.Holds(held)) {
      activation_pool_.Give(held);
    } else {
      held = Tensor();
    }
  }
}

double Net::Forward() {
  forwarded_ = false;  // until every layer has run
  double loss = 0;
  const bool plan = options_.plan_memory;
  if (plan) BeginPlannedPass();
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Layer& layer = *layers_[i];
    if (plan) TakeBuffers(static_cast<int>(i));
    if (!layer.absorbed()) layer.Reshape(bottoms_[i], tops_[i]);
    if (plan) KeepWithinPlan(static_cast<int>(i));
    layer.Forward(bottoms_[i], tops_[i]);
    if (plan) GiveBackBuffers(static_cast<int>(i));
    if (layer.IsLoss()) {
      // On a device, the loss comes back through one explicit copy of its scalar.
      const Tensor& out = tops_[i][0]->data;
      const Tensor host =
          out.device().type == DeviceType::kCPU ? out : out.View({1}).To(Device::CPU());
      loss += layer.loss_weight() * ElementAsDouble(host, 0);
    }
    if (profiling_) {
      layer_times_[i].name = layer.name();
      layer_times_[i].type = layer.type();
      layer_times_[i].forward_start = t0;
      layer_times_[i].forward_s = Seconds(t0, std::chrono::steady_clock::now());
      layer_times_[i].backward_s = 0;
    }
  }
  // Another batch or input size than the plan's: the next pass plans again for these shapes
  // (this one took buffers of the old sizes; a layer that outgrew one allocated its own).
  if (plan) {
    for (size_t b = 0; b < blobs_.size(); ++b) {
      if (blobs_[b]->data.nbytes() != planned_bytes_[b]) planned_ = false;
    }
  }
  forwarded_ = true;
  return loss;
}

void Net::Backward(double loss_scale) {
  CORTADO_CHECK(!inference(), "Backward on an inference net (it has no gradients)");
  const bool plan = options_.plan_memory;
  // Backward overwrites activations with gradients (in-place layers, planned buffers given back
  // and reused), so a second one would read gradients as activations and give wrong results
  // without a word: the caller's bug, stopped here.
  CORTADO_CHECK(forwarded_, "internal error: net '", name_,
                "': Backward without a Forward before it (each Backward must follow its own "
                "Forward: the last Backward has overwritten that Forward's activations)");
  forwarded_ = false;
  CORTADO_ASSERT(!plan || held_.size() == plan_.group_bytes.size());
  const int steps = 2 * static_cast<int>(layers_.size());
  const int first_step = static_cast<int>(layers_.size());
  // Activation gradients are taken when their consumer's backward is about to write them (or
  // at the start, for loss seeds and gradients nobody writes) and given back once their
  // producer's backward has read them, so only the gradients of the layers around the current
  // one hold memory: with a memory plan as its groups (in the arena, over activations already
  // given back), else from grad_pool_. Those of net inputs stay readable until the next call.
  if (plan) TakeBuffers(first_step);
  for (size_t b = 0; b < blobs_.size(); ++b) {
    if (grad_pooled_[b]) {
      grad_pool_.Release(blobs_[b]->grad);
      grad_pooled_[b] = false;
    }
  }
  auto acquire = [&](Blob* blob) {
    const size_t index = blob_index_.at(blob->name);
    if (plan || grad_pooled_[index]) return;  // planned: TakeBuffers did
    blob->grad = grad_pool_.Acquire(blob->data.shape(), blob->data.dtype());
    blob->grad.set_format(blob->data.format());
    grad_pooled_[index] = true;
  };
  // A gradient is written by a consumer that propagates to it; all others must read as zero.
  std::vector<bool> written(blobs_.size(), false);
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (size_t j = 0; j < bottoms_[i].size(); ++j) {
      if (propagate_down_[i][j]) written[blob_index_.at(bottoms_[i][j]->name)] = true;
    }
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!runs_backward_[i]) continue;
    for (Blob* t : tops_[i]) {
      if (layers_[i]->IsLoss()) {
        acquire(t);
        t->grad.Fill(layers_[i]->loss_weight() * loss_scale);
      } else if (!written[blob_index_.at(t->name)]) {
        acquire(t);
        t->grad.Zero();
      }
    }
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    const int step = steps - 1 - static_cast<int>(i);
    if (plan && step != first_step) TakeBuffers(step);
    if (!runs_backward_[i]) {
      if (plan) GiveBackBuffers(step);
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    Layer& layer = *layers_[i];
    for (size_t j = 0; j < bottoms_[i].size(); ++j) {
      if (propagate_down_[i][j]) acquire(bottoms_[i][j]);
    }
    layer.Backward(tops_[i], propagate_down_[i], bottoms_[i]);
    // The outputs' gradients have been read by the only layer that reads them.
    for (Blob* t : tops_[i]) {
      const size_t index = blob_index_.at(t->name);
      if (grad_pooled_[index]) {
        grad_pool_.Release(t->grad);
        grad_pooled_[index] = false;
      }
    }
    if (plan) GiveBackBuffers(step);
    if (profiling_) {
      layer_times_[i].backward_start = t0;
      layer_times_[i].backward_s = Seconds(t0, std::chrono::steady_clock::now());
    }
    if (grad_ready_hook_ && !layer.params().empty()) grad_ready_hook_(layer, layer.params());
  }
}

std::vector<Param*> Net::params() {
  std::vector<Param*> out;
  for (auto& layer : layers_) {
    for (Param& p : layer->params()) out.push_back(&p);
  }
  return out;
}

std::vector<Buffer*> Net::buffers() {
  std::vector<Buffer*> out;
  for (auto& layer : layers_) {
    for (Buffer& b : layer->buffers()) out.push_back(&b);
  }
  return out;
}

void Net::SaveState(Checkpoint& checkpoint) const {
  for (const auto& layer : layers_) {
    for (const Param& p : layer->params()) checkpoint.Add("param/" + p.name, p.value);
  }
  for (const auto& layer : layers_) {
    for (const Buffer& b : layer->buffers()) checkpoint.Add("buffer/" + b.name, b.value);
  }
}

bool Net::IsNetState(const std::string& name) {
  return name.rfind("param/", 0) == 0 || name.rfind("buffer/", 0) == 0;
}

void Net::LoadState(const Checkpoint& checkpoint, const std::string& path) {
  auto load = [&](const std::string& key, Tensor& into, const std::string& what) {
    const Tensor* t = checkpoint.Find(key);
    CORTADO_CHECK(t != nullptr, "checkpoint '", path, "' has no ", what,
                  " (was it written for another model?)");
    CORTADO_CHECK(t->shape() == into.shape(), "checkpoint '", path, "': ", what, " has shape ",
                  ShapeString(t->shape()), ", the model wants ", ShapeString(into.shape()));
    AssignConverted(into, *t);  // from the host copy onto the net's device
  };
  for (Param* p : params()) load("param/" + p->name, p->value, "parameter '" + p->name + "'");
  for (Buffer* b : buffers()) load("buffer/" + b->name, b->value, "buffer '" + b->name + "'");
  ParamsChanged();
}

int64_t Net::num_parameters() {
  int64_t n = 0;
  for (Param* p : params()) n += p->value.numel();
  return n;
}

std::string Net::Summary() {
  std::ostringstream out;
  out << std::left << std::setw(22) << "layer" << std::setw(18) << "type" << std::setw(24)
      << "output"
      << "params\n";
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = *layers_[i];
    int64_t n = 0;
    for (const Param& p : layer.params()) n += p.value.numel();
    std::string shape = tops_[i].empty() ? "-" : ShapeString(tops_[i][0]->data.shape());
    out << std::setw(22) << layer.name() << std::setw(18) << layer.type() << std::setw(24) << shape
        << n << "\n";
  }
  out << "total parameters: " << num_parameters() << "\n";
  return out.str();
}

}  // namespace cortado
