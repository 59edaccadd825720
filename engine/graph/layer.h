// Layer: one node of the net, with a hand-written forward and backward pass (Caffe's design).
//
// Ownership: a layer owns its parameters (Param: value + grad + metadata) and buffers (state
// that is saved but not learned, e.g. batch-norm running statistics). The net owns the blobs
// that flow between layers and passes them as `bottom` (inputs) and `top` (outputs).
//
// Contract, called by Net:
//   SetUp(bottom, top)     once: checks input/output counts, LayerSetUp (read settings, make
//                          params), Reshape.
//   Reshape(bottom, top)   before every Forward: size the tops from the bottoms' shapes.
//   Forward(bottom, top)   compute top data from bottom data.
//   Backward(top, propagate_down, bottom)
//                          from top grads, OVERWRITE param grads and, for each i with
//                          propagate_down[i], bottom[i]->grad (already sized like the data).
// A blob consumed by several layers gets a Split layer inserted by the net, so layers never
// need to accumulate into a bottom grad.
//
// Element type: layers compute in the dtype of bottom[0]: f32 for training, f64 for gradient
// checks, bf16 or f16 for mixed precision; labels are i32. Forward and Backward are not virtual:
// they check the device and call the implementation for that dtype (ForwardF32, ForwardF64,
// ForwardBF16, ForwardF16 and the Backward ones), so a new type or device slots in per layer
// and an unsupported combination fails naming the layer. The f32 and f64 kernels are the
// reference (usually one template, instantiated by both; engine/graph/typed_layer.h writes these
// overrides from a layer's ForwardT/BackwardT templates). A layer without its own
// bf16 or f16 kernel computes those in f32: its low-precision inputs are widened into f32
// staging buffers, the f32 kernel runs, and its outputs are rounded back (to nearest even), so
// stored activations are half the size and the arithmetic is the reference's.
// Params take bottom[0]'s dtype at SetUp, except that low-precision nets keep their params
// (the master weights) and buffers in f32; loss and accuracy outputs are f32 there too.
// Memory format: a layer whose kernels take channels-last (NHWC) 4-d tensors says so
// (TakesChannelsLast) and gives its 4-d outputs its input's format in Reshape; one that does not
// gets NCHW inputs (or inputs whose layout is the same in both, Tensor::IsLayoutTrivial), which
// the net ensures by inserting a Reorder layer before it, and Forward/Backward check it.
// Device: every input and output of a call is on bottom[0]'s device (checked by Forward and
// Backward); a non-CPU device goes to ForwardOnDevice/BackwardOnDevice, which fail unless the
// layer has kernels there, so a device tensor never reaches a CPU kernel.
// Threads: Forward/Backward are called from one thread and may use ParallelFor inside.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/settings.h"
#include "engine/tensor/tensor.h"

namespace cortado {

enum class Phase { kTrain, kTest };

// What a parameter is, for policies such as "no weight decay on batch-norm and bias".
enum class ParamKind { kWeight, kBias, kNorm };

struct Param {
  std::string name;  // "<layer>.weight", "<layer>.bias"
  Tensor value;
  Tensor grad;
  ParamKind kind = ParamKind::kWeight;
  float lr_mult = 1.0f;
  float decay_mult = 1.0f;
  std::string codec;  // gradient codec for data-parallel all-reduce; "" = the run's default
};

struct Buffer {
  std::string name;  // "<layer>.running_mean"
  Tensor value;
};

// Sums per-channel statistics in place across the ranks whose batch-norm statistics are
// shared (synchronized batch norm): every rank of the group passes the same count, in the same
// order of calls, and gets the same sums (bitwise). Implemented by the data-parallel glue over
// a communicator of its own, so these calls never wait behind queued gradient buckets.
// Called from Forward/Backward's thread, never from inside a pool task.
class BatchStatsReducer {
 public:
  virtual ~BatchStatsReducer() = default;
  virtual void AllReduceSum(double* values, int64_t count) = 0;
  // Ranks whose statistics are combined (1 means nothing is combined).
  virtual int group_size() const = 0;
};

// Run-time state shared by all layers of a net.
// Scratch memory that the layers of one net share: they run one at a time, so one set of
// per-thread buffers of each kind serves every layer (a convolution's column matrix, say)
// instead of a set per layer: for ResNet-50 at batch 16 that is 625 MB less.
class ScratchSpace {
 public:
  static constexpr int kKinds = 16;
  // The per-thread buffers of `kind` (a layer type's own small numbers, below kKinds).
  std::vector<Tensor>& Buffers(int kind) { return kinds_.at(static_cast<size_t>(kind)); }
  // The f32 staging buffers of layers that compute a low-precision dtype in f32.
  std::vector<Tensor>& Staging() { return staging_; }
  // The 16-bit copy of the weights of the layer now running (bf16/f16 kernels convert it from
  // the f32 master on every call, so one copy serves every layer).
  Tensor& LowPrecisionWeights() { return lowp_weights_; }
  // State that an inference net needs only while one layer's forward runs (max pooling's
  // argmax): one buffer, as large as the largest use, instead of one per layer.
  Tensor& ForwardOnly() { return forward_only_; }

 private:
  std::array<std::vector<Tensor>, kKinds> kinds_;
  std::vector<Tensor> staging_;
  Tensor lowp_weights_;
  Tensor forward_only_;
};

struct LayerContext {
  Phase phase = Phase::kTrain;
  uint64_t seed = 0;      // the run's seed; layers derive per-layer streams from it
  int64_t iteration = 0;  // current iteration, for counter-based randomness (dropout)
  // Data parallelism: this rank's local sample j is sample sample_base + j * sample_stride of
  // the global batch (rank r of W: r and W), so per-sample randomness matches one process.
  int64_t sample_base = 0;
  int64_t sample_stride = 1;
  // Synchronized batch norm: the group's reducer (null in a single process or with groups of
  // one), and whether BatchNorm layers use it when their own `sync` setting is absent.
  BatchStatsReducer* batch_stats = nullptr;
  bool sync_batch_norm = false;
  // The net's shared scratch (null outside a net: a layer then keeps its own).
  ScratchSpace* scratch = nullptr;
  // An inference net: AddParam makes no gradient tensor (nothing will run backward).
  bool inference = false;
  // Incremented whenever parameters or buffers are written from outside the solver's step
  // (Net::LoadState, Net::ParamsChanged): an inference net's layers that keep derived copies
  // of their weights (a convolution's reordered, folded weights) refresh them then.
  uint64_t params_version = 1;
};

struct LayerSpec {
  std::string name;
  std::string type;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  Settings settings;
  std::string where;  // "file.yaml:line:col" of the layer's entry, or "" when built in code
};

class Layer {
 public:
  explicit Layer(const LayerSpec& spec);
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  void SetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top);
  virtual void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) = 0;
  // Dispatch on bottom[0]'s device and dtype to the typed implementations below.
  void Forward(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top);
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                const std::vector<Blob*>& bottom);

  // Input/output counts; -1 means unconstrained. Checked by SetUp.
  virtual int MinInputs() const { return 1; }
  virtual int MaxInputs() const { return 1; }
  virtual int NumOutputs() const { return 1; }
  // Whether a gradient can flow to input i (false for labels).
  virtual bool CanBackpropTo(int input_index) const { return true; }
  // Whether the kernels take 4-d inputs in channels-last memory (MemoryFormat::kNHWC), giving
  // 4-d outputs the input's format. False: NCHW only (the net reorders before such a layer).
  virtual bool TakesChannelsLast() const { return false; }
  // Inference fusion (Net, NetOptions::fuse): offered the layer that alone reads this layer's
  // only output, a layer may take over its computation (a convolution folds the batch norm after
  // it into its weights) and return true; `next` is then told set_absorbed(true) and passes its
  // input through (its output shares its input's storage, its forward does nothing). Called
  // after SetUp of both, before the first Forward.
  virtual bool AbsorbNext(Layer& next) { return false; }
  void set_absorbed(bool on) { absorbed_ = on; }
  bool absorbed() const { return absorbed_; }
  // What the layer computes besides its type, as a suffix for tables ("+ReLU": a fused ReLU;
  // "+bn1+ReLU": folded in; " (absorbed)"); "" when nothing.
  virtual std::string Note() const { return absorbed_ ? " (absorbed)" : ""; }
  // Which kernels run the layer, where it has a choice ("oneDNN brgconv:avx512_core / ...",
  // "im2col: <why>"); "" for layers with one implementation.
  virtual std::string KernelInfo() const { return ""; }
  // Loss layers output a scalar that the net adds, times loss_weight, to the total loss.
  virtual bool IsLoss() const { return false; }
  // Floating-point operations of one forward pass at the current shapes (a multiply-add is 2),
  // for profiles; 0 for layers whose cost is memory traffic rather than arithmetic. Backward
  // takes about twice as many where it computes both the input and the weight gradient.
  virtual double ForwardFlops() const { return 0; }
  // Whether Backward reads this layer's own outputs' data. One that does not lets the single
  // consumer of an output overwrite it (an in-place ReLU after BatchNorm or a convolution).
  virtual bool BackwardReadsOutputs() const { return true; }
  // Whether Backward reads its floating inputs' data (the f32 fallback of bf16/f16 widens only
  // what the kernel reads; labels are never widened).
  virtual bool BackwardReadsInputs() const { return true; }
  // Whether the layer can write its output into its input's storage and compute its backward
  // from the output alone; the net turns that on (set_in_place) where the input has no other
  // reader and its producer's backward does not need it, saving the output's memory.
  virtual bool CanRunInPlace() const { return false; }
  // Which input's storage output `output` shares after Reshape (a view, a split, or an in-place
  // layer's input 0), or -1 when it has storage of its own; the memory plan keeps the shared
  // buffer alive for every blob on it.
  virtual int SharesInputStorage(int output) const {
    return (in_place_ || absorbed_) && output == 0 ? 0 : -1;
  }
  void set_in_place(bool on) { in_place_ = on; }
  bool in_place() const { return in_place_; }

  const std::string& name() const { return spec_.name; }
  const std::string& type() const { return spec_.type; }
  const LayerSpec& spec() const { return spec_; }
  // "layer 'conv1' (Convolution)", for messages.
  std::string Describe() const;
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  std::vector<Buffer>& buffers() { return buffers_; }
  const std::vector<Buffer>& buffers() const { return buffers_; }
  float loss_weight() const { return loss_weight_; }

  void set_context(const LayerContext* context) { context_ = context; }
  const LayerContext& context() const;
  Phase phase() const { return context().phase; }

 protected:
  using Blobs = std::vector<Blob*>;
  // Typed implementations on the CPU. The f32 and f64 defaults fail naming the layer and the
  // dtype; the bf16 and f16 defaults compute in f32 (ForwardInF32, BackwardInF32).
  virtual void ForwardF32(const Blobs& bottom, const Blobs& top);
  virtual void ForwardF64(const Blobs& bottom, const Blobs& top);
  virtual void ForwardBF16(const Blobs& bottom, const Blobs& top);
  virtual void ForwardF16(const Blobs& bottom, const Blobs& top);
  virtual void BackwardF32(const Blobs& top, const std::vector<bool>& propagate_down,
                           const Blobs& bottom);
  virtual void BackwardF64(const Blobs& top, const std::vector<bool>& propagate_down,
                           const Blobs& bottom);
  virtual void BackwardBF16(const Blobs& top, const std::vector<bool>& propagate_down,
                            const Blobs& bottom);
  virtual void BackwardF16(const Blobs& top, const std::vector<bool>& propagate_down,
                           const Blobs& bottom);
  // The kernels on a device (bottom[0]'s, which every input and output shares: Forward and
  // Backward check it). A layer with a device path runs its shared kernel bodies there
  // (engine/tensor/device_kernels.h). The defaults: on the test device, the layer's CPU kernel
  // inside one test-device kernel (CpuKernelOnTestDevice) where RunsCpuKernelOnTestDevice();
  // elsewhere they fail naming the layer and the device.
  virtual void ForwardOnDevice(const Blobs& bottom, const Blobs& top);
  virtual void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                const Blobs& bottom);
  // Whether the test device may run this layer's CPU kernel on host views of its device memory
  // (a layer without shared bodies yet: the net's device plumbing is then checked around it, the
  // layer's own device kernels are not). True by default.
  virtual bool RunsCpuKernelOnTestDevice() const { return true; }
  // Runs the CPU kernel (forward when propagate_down is null) as one kernel on the test device:
  // the blobs', params' and buffers' blocks open, host views of them in their place; waits.
  void CpuKernelOnTestDevice(const Blobs& top, const std::vector<bool>* propagate_down,
                             const Blobs& bottom);
  // The CPU's dispatch on the dtype (what Forward and Backward run for CPU tensors).
  void ForwardOnCpu(const Blobs& bottom, const Blobs& top);
  void BackwardOnCpu(const Blobs& top, const std::vector<bool>& propagate_down,
                     const Blobs& bottom);
  // Any other dtype (i32, u8): only layers that move bytes without arithmetic (views, copies)
  // take them; the defaults fail naming the layer and the input.
  virtual void ForwardOtherDType(const Blobs& bottom, const Blobs& top);
  virtual void BackwardOtherDType(const Blobs& top, const std::vector<bool>& propagate_down,
                                  const Blobs& bottom);
  // The f32 fallback for a low-precision dtype: widen the bf16/f16 blobs into f32 staging
  // buffers (other dtypes, such as i32 labels and f32 loss outputs, are used as they are), run
  // the f32 kernel, and round the outputs (forward) or input gradients (backward) back.
  void ForwardInF32(const Blobs& bottom, const Blobs& top);
  void BackwardInF32(const Blobs& top, const std::vector<bool>& propagate_down,
                     const Blobs& bottom);

  // Reads settings and creates params; called once by SetUp before Reshape.
  virtual void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {}
  // Creates a parameter "<name>.<suffix>" of the given shape in bottom[0]'s dtype, zeroed
  // (f32 when that dtype is bf16 or f16: the master weights; AddBuffer alike). In an inference
  // net its grad stays undefined.
  Param& AddParam(const std::string& suffix, const Shape& shape, DType dtype, ParamKind kind);
  Buffer& AddBuffer(const std::string& suffix, const Shape& shape, DType dtype);
  // Seed for this layer's initialization: depends on the run's seed and the layer's name.
  uint64_t InitSeed() const;
  // Throws naming the layer and the blob when a 4-d tensor this layer reads is channels-last
  // while the layer takes NCHW only.
  void CheckFormats(const Blobs& blobs, bool grads) const;
  // Throws naming the layer and the blob when a defined, non-empty data (or grad) tensor of
  // `blobs` is not on `device`.
  void CheckDevices(const Blobs& blobs, Device device, bool grads, const char* what) const;
  bool in_place_ = false;
  bool absorbed_ = false;

  LayerSpec spec_;
  std::vector<Tensor> own_staging_;  // ForwardInF32's buffers outside a net
  const Settings& settings() const { return spec_.settings; }
  std::vector<Param> params_;
  std::vector<Buffer> buffers_;
  float loss_weight_ = 0.0f;

 private:
  const LayerContext* context_ = nullptr;
};

// Registry of layer types by name ("Convolution" -> ConvolutionLayer).
class LayerRegistry {
 public:
  using Creator = std::function<std::unique_ptr<Layer>(const LayerSpec&)>;
  static void Register(const std::string& type, Creator creator);
  // Throws naming the unknown type and listing the known ones.
  static std::unique_ptr<Layer> Create(const LayerSpec& spec);
  static std::vector<std::string> Types();
  static bool Has(const std::string& type);
};

struct LayerRegistrar {
  LayerRegistrar(const std::string& type, LayerRegistry::Creator creator) {
    LayerRegistry::Register(type, std::move(creator));
  }
};

// Registers class `cls` under the type name `type`, e.g. CORTADO_REGISTER_LAYER(ReLU, ReluLayer).
#define CORTADO_REGISTER_LAYER(type, cls)                                                \
  static ::cortado::LayerRegistrar g_cortado_layer_registrar_##type(                     \
      #type, [](const ::cortado::LayerSpec& spec) -> std::unique_ptr<::cortado::Layer> { \
        return std::make_unique<cls>(spec);                                              \
      })

// Whether dtype is one of the low-precision storage types (bf16, f16).
inline bool IsLowPrecision(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF16; }
// The dtype in which a layer keeps params, statistics and loss values when it computes in
// `compute`: f32 for bf16 and f16, else compute itself.
inline DType MasterDType(DType compute) { return IsLowPrecision(compute) ? DType::kF32 : compute; }

// Calls fn(T{}) with T = float or double according to dtype; other dtypes throw naming `what`.
template <typename Fn>
decltype(auto) DispatchFloat(DType dtype, const std::string& what, Fn&& fn) {
  if (dtype == DType::kF32) return fn(float{});
  if (dtype == DType::kF64) return fn(double{});
  Fail(what, ": dtype ", DTypeName(dtype), " is not supported on CPU (use f32 or f64)");
}

}  // namespace cortado
