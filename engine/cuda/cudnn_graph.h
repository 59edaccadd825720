// cuDNN's graph (backend) API as Cortado uses it: owned descriptors whose attribute calls are
// checked, the device-properties descriptor that heuristics and plans are made for, and the
// step from a finalized operation graph to an execution plan (cuDNN's heuristics, the caller's
// filter on numerical notes, the first engine configuration that finalizes), and its execution.
// The legacy cudnnConvolution* calls are deprecated in cuDNN 9; this API is not.
//
// Every call goes through the CudaLibraries table (cuda_libraries.h). What needs a GPU: only
// DevicePropertiesOf (it asks the driver) and ExecutePlan. Tensor, convolution and operation
// descriptors, operation graphs, heuristics and execution plans finalize without one when the
// device properties come from JSON (DevicePropertiesFromJson: cuDNN's deviceless mode, 9.8 and
// later), so host tests build every plan the engine would build on that GPU.
//
// Threads: one descriptor is used by one thread at a time; distinct descriptors may be used
// concurrently (cuDNN's calls are thread-safe across descriptors). Error reasons come from
// cuDNN's per-thread last error.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace cortado::cuda {

// "OPERATION_CONVOLUTION_FORWARD" for CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
// (the types this file's users create), "descriptor type N" for the others.
std::string DescriptorTypeName(cudnnBackendDescriptorType_t type);
// "tensor core", "down-converts inputs", ... for a numerical note.
const char* NumericalNoteName(cudnnBackendNumericalNote_t note);

// One backend descriptor, destroyed with the object (movable, not copyable). Every failing call
// throws cortado::Error naming the descriptor's type, the attribute and cuDNN's status and reason.
class CudnnDescriptor {
 public:
  explicit CudnnDescriptor(cudnnBackendDescriptorType_t type);
  ~CudnnDescriptor();
  CudnnDescriptor(CudnnDescriptor&& other) noexcept;
  CudnnDescriptor& operator=(CudnnDescriptor&& other) noexcept;
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }
  cudnnBackendDescriptorType_t type() const { return type_; }

  // `count` values of `value_type` at `values`.
  CudnnDescriptor& Set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t value_type,
                       int64_t count, const void* values);
  CudnnDescriptor& SetInt64(cudnnBackendAttributeName_t name, int64_t value);
  CudnnDescriptor& SetInt64s(cudnnBackendAttributeName_t name, std::span<const int64_t> values);
  CudnnDescriptor& SetDescriptor(cudnnBackendAttributeName_t name, const CudnnDescriptor& value);

  void Finalize();
  // For descriptors cuDNN may decline (an engine configuration it does not support here): false
  // with `why` set to its status and reason.
  bool TryFinalize(std::string* why);

  // Up to `capacity` values into `values`; returns how many cuDNN has (capacity 0 and null
  // values: just the count).
  int64_t Get(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t value_type,
              int64_t capacity, void* values) const;
  int64_t GetInt64(cudnnBackendAttributeName_t name) const;
  std::vector<int64_t> GetInt64s(cudnnBackendAttributeName_t name, int64_t capacity) const;
  // A CUDNN_TYPE_CHAR attribute (the JSON representations).
  std::string GetString(cudnnBackendAttributeName_t name) const;
  // A descriptor-valued attribute whose values are descriptors of `element_type` (the
  // heuristics' engine configurations, an engine configuration's engine).
  std::vector<CudnnDescriptor> GetDescriptors(cudnnBackendAttributeName_t name,
                                              cudnnBackendDescriptorType_t element_type,
                                              int64_t capacity) const;

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
  cudnnBackendDescriptorType_t type_;
};

// The GPU that cuDNN's heuristics and plans are made for.
// Of the GPU that `handle` is bound to (asks its driver: needs that GPU).
CudnnDescriptor DevicePropertiesOf(cudnnHandle_t handle);
// From the JSON that DevicePropertiesJson wrote for a GPU (no GPU needed); throws with cuDNN's
// reason when it does not parse.
CudnnDescriptor DevicePropertiesFromJson(const std::string& json);
std::string DevicePropertiesJson(const CudnnDescriptor& device_properties);

// A finalized tensor descriptor: `dims` and `strides` in elements, in cuDNN's order (for images
// (N, C, H, W) whatever the memory format: the strides say the format); `alignment`: the bytes to
// which every pointer later given for it is aligned.
CudnnDescriptor MakeTensor(int64_t uid, std::span<const int64_t> dims,
                           std::span<const int64_t> strides, cudnnDataType_t dtype,
                           int64_t alignment);

// An execution plan and what was chosen for it.
struct CudnnPlan {
  CudnnDescriptor plan{CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR};  // finalized
  int64_t engine = -1;                                            // cuDNN's global engine index
  int64_t workspace_bytes = 0;
  std::vector<cudnnBackendNumericalNote_t> notes;
  // The engine's kernels are compiled when the plan is finalized (NVRTC: seconds on a GPU, once
  // per case; precompiled engines take milliseconds).
  bool runtime_compiled = false;
  // "engine 67 (tensor core), workspace 131 B" (", compiled at run time" when it is)
  std::string Describe() const;
};

// Decides from an engine configuration's numerical notes whether the caller takes it: "" to
// take it, otherwise why not (e.g. "tensor cores (TF32) where TF32 is not allowed").
using NoteFilter = std::function<std::string(const std::vector<cudnnBackendNumericalNote_t>&)>;

// The plan for `graph` (a finalized OPERATIONGRAPH) on `device_properties`: cuDNN's heuristics
// (mode A, then its fallback list), in their order the first engine configuration that `filter`
// takes, that needs at most `workspace_limit` bytes and whose plan finalizes. Throws when there
// is none, listing each configuration offered and why it was passed over.
CudnnPlan BuildPlan(const CudnnDescriptor& graph, const CudnnDescriptor& device_properties,
                    const NoteFilter& filter, int64_t workspace_limit);

// Runs `plan` on the stream of `handle`, with the tensor of uids[i] at pointers[i] and
// `workspace` (at least plan.workspace_bytes; null when 0). Returns when queued.
void ExecutePlan(cudnnHandle_t handle, const CudnnPlan& plan, std::span<const int64_t> uids,
                 std::span<void* const> pointers, void* workspace);

}  // namespace cortado::cuda
