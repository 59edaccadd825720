// Net: a graph of layers built from a NetSpec (a YAML graph or a C++ builder in models/).
//
// Blobs are named; each layer reads named inputs and writes named outputs, in the order the
// spec lists the layers (which must be topological). The net's inputs (`data`, `label`) are
// blobs that nothing produces; the trainer fills them. When a blob feeds several layers the
// net inserts a Split layer so that gradients from all consumers are summed.
//
// Backward runs the layers in reverse. When a layer's parameter gradients are final the net
// calls the gradient-ready hook with that layer's params: data-parallel training starts
// all-reducing them while backward continues on earlier layers.
//
// The loss is the sum of the loss layers' outputs times their loss_weight. Backward(scale)
// seeds each loss output's gradient with loss_weight * scale (scale is the loss scale of mixed
// precision, 1 otherwise).
//
// Memory (NetOptions): with plan_memory the activations come from a pool following a memory
// plan (engine/tensor/memory_plan.h), computed from the graph once per set of shapes: each buffer
// is taken just before the forward of the layer that writes it and given back after the last
// forward or backward that reads it, and each activation gradient lives from the backward that
// writes it to the backward of the layer that made the activation, all in one arena at planned
// offsets, so a pass holds the largest live set of activations and gradients, not the sum. A blob
// whose buffer was given back keeps its shape, but its data is another blob's: read only the
// net inputs and the results (blobs nothing consumes, kept until the next Forward) after a
// pass. An inference net (NetMode::kInference) runs in test phase only, plans its memory for
// forward alone (a buffer goes back once its last reader has run) and has no parameter
// gradients, no activation gradients and no Split layers; Backward throws.
//
// Layout (NetOptions::layout, model.layout): a net runs its 4-d activations in one memory format.
// In kNHWC the image inputs are channels-last, every layer that takes it (Layer::
// TakesChannelsLast) passes it on, and before a layer that takes NCHW only (InnerProduct on a 4-d
// input, say) the net inserts a Reorder layer, listed like any other (`cortado inspect`); a blob
// whose layout is the same in both formats (a pooled (N, C, 1, 1)) needs none. Gradients take
// their activation's format.
//
// Fusion (NetOptions::fuse): before building, a BatchNorm or an Eltwise sum whose output only a
// ReLU (slope 0) reads becomes one layer with `relu: true` (one pass over memory instead of two,
// forward and backward); in an inference net a layer may then absorb the one after it
// (Layer::AbsorbNext: a channels-last convolution folds its batch norm, and a ReLU, into its
// weights and its oneDNN primitive). Parameters keep their names and canonical shapes either way,
// so checkpoints move between fused and unfused nets, and between layouts.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph/layer.h"
#include "engine/io/checkpoint.h"
#include "engine/tensor/buffer_pool.h"
#include "engine/tensor/memory_plan.h"

namespace cortado {

struct NetInput {
  std::string name;  // "data"
  Shape shape;       // with the batch dimension first, e.g. {64, 1, 28, 28}
  DType dtype = DType::kF32;
  // A floating input takes the net's compute dtype (f64 in a gradient check, bf16 or f16 with
  // mixed precision) unless this is set: detection's ground-truth boxes stay f32 whatever the
  // net computes in (bf16's 8 bits would move a box edge by up to 2 pixels in 300).
  bool keep_dtype = false;
};

struct NetSpec {
  std::string name;
  std::vector<NetInput> inputs;
  std::vector<LayerSpec> layers;
};

enum class NetMode { kTrain, kInference };

struct NetOptions {
  NetMode mode = NetMode::kTrain;
  // Activations from the plan's pool (always on in inference). Off, every blob keeps its own
  // storage for the net's lifetime and can be read after a pass (tests, tools that look inside).
  bool plan_memory = false;
  // Fills every buffer the plan gives back with NaN (float blobs): a test mode that makes a read
  // of a given-back activation show up in the results.
  bool poison_released = false;
  // Memory format of the 4-d activations (see the header paragraph).
  MemoryFormat layout = MemoryFormat::kNCHW;
  // Fusion rewrites (see the header paragraph).
  bool fuse = false;
  // Where the net runs: parameters, gradients, buffers, the activations and their gradient pool
  // and arena are allocated there (built on the host, then moved, once). The caller copies the
  // inputs in explicitly (input(name).CopyFrom(host.To(device))); Forward brings each loss back
  // through one copy of its scalar; SaveState writes host copies, LoadState copies onto it.
  Device device = Device::CPU();
};

// model.layout: auto's choice for a net on `device` computing in `compute`: channels-last where
// fast kernels take it (the CPU with oneDNN: its convolutions in f32, bf16 and f16), NCHW
// otherwise (f64, which they do not take; a build without oneDNN; devices whose backend has not
// said yet: a GPU backend answers for its own).
MemoryFormat AutoLayout(Device device, DType compute);

// The spec with the fusion rewrites of NetOptions::fuse applied: a BatchNorm, or an Eltwise sum,
// whose only output is read by nothing but one ReLU with slope 0 takes `relu: true` and that
// ReLU's outputs, and the ReLU is left out. A pure function of the spec (tests call it).
NetSpec FuseSpec(const NetSpec& spec);

class Net : public CheckpointState {
 public:
  // Builds and sets up every layer. dtype: the compute dtype for floating inputs (f32; f64
  // for gradient checks; bf16 or f16 for mixed precision, with f32 params). Throws naming the layer
  // and blob for a malformed graph.
  Net(const NetSpec& spec, uint64_t seed, DType dtype = DType::kF32, NetOptions options = {});

  // Runs every layer forward; returns the total loss (0 when the net has no loss layer).
  double Forward();
  // Runs every layer backward, seeding loss gradients with loss_weight * loss_scale. Each call
  // needs a Forward of its own before it (backward overwrites activations); a second Backward
  // after one Forward throws (an internal error: the caller's bug).
  // Activation gradients exist only while backward needs them (grad_bytes_peak() is their
  // footprint without a memory plan; with one they are planned buffers of activation_pool(),
  // and this is 0); afterwards only the net inputs' gradients can be read, until the next call.
  void Backward(double loss_scale = 1.0);
  size_t grad_bytes_peak() const { return grad_pool_.bytes_created(); }
  bool inference() const { return options_.mode == NetMode::kInference; }
  bool plans_memory() const { return options_.plan_memory; }
  // The memory plan for the current shapes (made on first use; plans_memory() nets only).
  const MemoryPlan& memory_plan();
  // The activation pool (activations and, in training, their gradients): peak_bytes_lent() is
  // the measured high-water mark that the plan's peak_bytes predicts, bytes_created() the
  // storage behind it (the plan's arena_bytes).
  const ArenaPool& activation_pool() const { return activation_pool_; }
  // Bytes of the forward activations (every blob's data; storage shared by in-place layers,
  // splits and flattens counted once), net inputs included.
  size_t activation_bytes() const;

  Blob* blob(const std::string& name);
  bool has_blob(const std::string& name) const { return blob_index_.count(name) != 0; }
  Tensor& input(const std::string& name);  // data of a net input
  const std::vector<std::string>& input_names() const { return input_names_; }
  // Resizes the batch dimension of every input (e.g. a short last evaluation batch).
  void SetBatchSize(int64_t batch);

  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  // All learnable parameters, in forward order of their layers.
  std::vector<Param*> params();
  std::vector<Buffer*> buffers();

  // Checkpoint state: "param/<name>" and "buffer/<name>" for every parameter and buffer.
  // LoadState converts dtypes (an f32 checkpoint loads into an f64 net) and throws naming the
  // first one that is missing or has another shape.
  void SaveState(Checkpoint& checkpoint) const override;
  void LoadState(const Checkpoint& checkpoint, const std::string& path) override;
  // Tells the layers that parameters or buffers were written from outside (a weights file
  // loaded into them): layers that keep derived copies refresh them (LayerContext::
  // params_version). LoadState calls it itself.
  void ParamsChanged() { ++context_.params_version; }
  // Whether a checkpoint entry is the net's own ("param/..." or "buffer/..."): the filter with
  // which an inference net's checkpoint loads without the solver state (momentum).
  static bool IsNetState(const std::string& name);

  // An inference net refuses Phase::kTrain.
  void set_phase(Phase phase);
  Phase phase() const { return context_.phase; }
  void set_iteration(int64_t iteration) { context_.iteration = iteration; }
  LayerContext& context() { return context_; }

  using GradReadyHook = std::function<void(Layer& layer, std::vector<Param>& params)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }

  // Per-layer time of the last Forward and Backward, in seconds, and when each began (for
  // profiles and traces). Layers that did not run backward keep backward_s = 0.
  void set_profiling(bool on) { profiling_ = on; }
  struct LayerTime {
    std::string name, type;
    double forward_s = 0, backward_s = 0;
    std::chrono::steady_clock::time_point forward_start, backward_start;
  };
  const std::vector<LayerTime>& layer_times() const { return layer_times_; }
  // Human-readable summary: layers, output shapes, parameter count.
  std::string Summary();
  MemoryFormat layout() const { return options_.layout; }
  Device device() const { return options_.device; }
  // The Reorder layers the net inserted, as "name (blob nhwc -> nchw, before layer)" lines.
  const std::vector<std::string>& reorders() const { return reorders_; }
  int64_t num_parameters();

 private:
  void AddLayer(LayerSpec spec);
  // Puts the net on options_.device (the constructor's last step).
  void MoveToDevice();
  // The format layer `layer` wants its 4-d input `blob` in: the net's layout where it takes
  // channels-last, else NCHW.
  MemoryFormat WantedFormat(const Layer& layer) const;
  // Input `name` as `layer` wants it: the blob itself, or the output of a Reorder inserted now.
  std::string ReorderedInput(const Layer& layer, const std::string& name);
  // Offers each layer the single reader of its single output (Layer::AbsorbNext).
  void AbsorbLayers();
  // Marks the layers that may overwrite their input (Layer::CanRunInPlace).
  void PlanInPlaceLayers();
  // The graph as the memory planner sees it, at the blobs' current shapes.
  PlanGraph MakePlanGraph() const;
  // Gives back every planned buffer still held, and replans when the shapes have changed.
  void BeginPlannedPass();
  void TakeBuffers(int step);
  void KeepWithinPlan(int step);
  void GiveBackBuffers(int step);

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<Blob*>> bottoms_, tops_;
  std::vector<std::vector<bool>> propagate_down_;
  std::vector<bool> runs_backward_;
  std::vector<std::unique_ptr<Blob>> blobs_;
  std::map<std::string, size_t> blob_index_;
  std::vector<bool> blob_needs_grad_;
  BufferPool grad_pool_;           // activation gradients (Backward)
  std::vector<bool> grad_pooled_;  // by blob: its grad is storage from grad_pool_
  std::vector<std::string> input_names_;
  ScratchSpace scratch_;  // shared by the layers (LayerContext::scratch)
  LayerContext context_;
  GradReadyHook grad_ready_hook_;
  NetOptions options_;
  MemoryPlan plan_;
  bool planned_ = false;  // plan_ is made (planned_bytes_: the sizes it was made for)
  std::vector<size_t> planned_bytes_;
  std::vector<Tensor> held_;    // by plan group: the buffer taken for it, empty when given back
  std::vector<bool> external_;  // by blob: a net input (the caller's storage)
  ArenaPool activation_pool_;   // activations and their gradients (plan_memory)
  bool profiling_ = false;
  std::vector<LayerTime> layer_times_;
  std::vector<std::string> reorders_;
  std::string name_;        // the spec's, for errors
  bool forwarded_ = false;  // a Forward has completed and no Backward has run since
};

}  // namespace cortado
