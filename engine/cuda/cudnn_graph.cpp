#include "engine/cuda/cudnn_graph.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "engine/base/error.h"
#include "engine/cuda/cuda_libraries.h"

namespace cortado::cuda {
namespace {

// cuDNN's status and, when it left one, its reason (thread-local to the failing call).
std::string Reason(cudnnStatus_t status) {
  const CudaLibraries& l = Libraries();
  std::string why = l.cudnnGetErrorString(status);
  char message[1024] = {0};
  l.cudnnGetLastErrorString(message, sizeof(message));
  if (message[0] != '\0') why += StrCat(" (", message, ")");
  return why;
}

std::string NotesText(const std::vector<cudnnBackendNumericalNote_t>& notes) {
  std::string text;
  for (cudnnBackendNumericalNote_t note : notes) {
    text += StrCat(text.empty() ? "" : ", ", NumericalNoteName(note));
  }
  return text;
}

// One heuristics mode's engine configurations for `graph`, in cuDNN's order of preference
// (only those it supports on the device; cuDNN's log says why it dropped the others).
std::vector<CudnnDescriptor> EngineConfigs(const CudnnDescriptor& graph,
                                           const CudnnDescriptor& device_properties,
                                           cudnnBackendHeurMode_t mode) {
  CudnnDescriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.SetDescriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heuristics.Set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  heuristics.SetDescriptor(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device_properties);
  heuristics.Finalize();
  const int64_t offered =
      heuristics.Get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, nullptr);
  return heuristics.GetDescriptors(CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, offered);
}

}  // namespace

std::string DescriptorTypeName(cudnnBackendDescriptorType_t type) {
  switch (type) {
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      return "CONVOLUTION";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return "ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return "EXECUTION_PLAN";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
      return "OPERATION_CONVOLUTION_FORWARD";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      return "OPERATION_CONVOLUTION_BACKWARD_FILTER";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
      return "OPERATION_CONVOLUTION_BACKWARD_DATA";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return "TENSOR";
    case CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR:
      return "DEVICEPROP";
    default:
      return StrCat("descriptor type ", static_cast<int>(type));
  }
}

const char* NumericalNoteName(cudnnBackendNumericalNote_t note) {
  switch (note) {
    case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
      return "tensor core";
    case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
      return "down-converts inputs";
    case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
      return "reduced-precision reduction";
    case CUDNN_NUMERICAL_NOTE_FFT:
      return "FFT";
    case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
      return "nondeterministic";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      return "Winograd";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      return "Winograd 4x4";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      return "Winograd 6x6";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
      return "Winograd 13x13";
    case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP:
      return "strict NaN propagation";
    default:
      return "unknown note";
  }
}

CudnnDescriptor::CudnnDescriptor(cudnnBackendDescriptorType_t type) : type_(type) {
  const cudnnStatus_t status = Libraries().cudnnBackendCreateDescriptor(type, &desc_);
  if (status != CUDNN_STATUS_SUCCESS) {
    Fail("cuDNN: creating a ", DescriptorTypeName(type), " descriptor failed: ", Reason(status));
  }
}

CudnnDescriptor::~CudnnDescriptor() {
  if (desc_ != nullptr) Libraries().cudnnBackendDestroyDescriptor(desc_);
}

CudnnDescriptor::CudnnDescriptor(CudnnDescriptor&& other) noexcept
    : desc_(std::exchange(other.desc_, nullptr)), type_(other.type_) {}

CudnnDescriptor& CudnnDescriptor::operator=(CudnnDescriptor&& other) noexcept {
  if (this != &other) {
    if (desc_ != nullptr) Libraries().cudnnBackendDestroyDescriptor(desc_);
    desc_ = std::exchange(other.desc_, nullptr);
    type_ = other.type_;
  }
  return *this;
}

CudnnDescriptor& CudnnDescriptor::Set(cudnnBackendAttributeName_t name,
                                      cudnnBackendAttributeType_t value_type, int64_t count,
                                      const void* values) {
  const cudnnStatus_t status =
      Libraries().cudnnBackendSetAttribute(desc_, name, value_type, count, values);
  if (status != CUDNN_STATUS_SUCCESS) {
    Fail("cuDNN: setting attribute ", static_cast<int>(name), " of a ", DescriptorTypeName(type_),
         " descriptor failed: ", Reason(status));
  }
  return *this;
}

CudnnDescriptor& CudnnDescriptor::SetInt64(cudnnBackendAttributeName_t name, int64_t value) {
  return Set(name, CUDNN_TYPE_INT64, 1, &value);
}

CudnnDescriptor& CudnnDescriptor::SetInt64s(cudnnBackendAttributeName_t name,
                                            std::span<const int64_t> values) {
  return Set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()), values.data());
}

CudnnDescriptor& CudnnDescriptor::SetDescriptor(cudnnBackendAttributeName_t name,
                                                const CudnnDescriptor& value) {
  cudnnBackendDescriptor_t raw = value.get();
  return Set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

void CudnnDescriptor::Finalize() {
  std::string why;
  if (!TryFinalize(&why)) Fail("cuDNN: finalizing a ", DescriptorTypeName(type_), ": ", why);
}

bool CudnnDescriptor::TryFinalize(std::string* why) {
  const cudnnStatus_t status = Libraries().cudnnBackendFinalize(desc_);
  if (status == CUDNN_STATUS_SUCCESS) return true;
  if (why != nullptr) *why = Reason(status);
  return false;
}

int64_t CudnnDescriptor::Get(cudnnBackendAttributeName_t name,
                             cudnnBackendAttributeType_t value_type, int64_t capacity,
                             void* values) const {
  int64_t count = 0;
  const cudnnStatus_t status =
      Libraries().cudnnBackendGetAttribute(desc_, name, value_type, capacity, &count, values);
  if (status != CUDNN_STATUS_SUCCESS) {
    Fail("cuDNN: reading attribute ", static_cast<int>(name), " of a ", DescriptorTypeName(type_),
         " descriptor failed: ", Reason(status));
  }
  return count;
}

int64_t CudnnDescriptor::GetInt64(cudnnBackendAttributeName_t name) const {
  int64_t value = 0;
  Get(name, CUDNN_TYPE_INT64, 1, &value);
  return value;
}

std::vector<int64_t> CudnnDescriptor::GetInt64s(cudnnBackendAttributeName_t name,
                                                int64_t capacity) const {
  std::vector<int64_t> values(static_cast<size_t>(capacity));
  values.resize(static_cast<size_t>(Get(name, CUDNN_TYPE_INT64, capacity, values.data())));
  return values;
}

std::string CudnnDescriptor::GetString(cudnnBackendAttributeName_t name) const {
  const int64_t size = Get(name, CUDNN_TYPE_CHAR, 0, nullptr);
  std::string text(static_cast<size_t>(size), '\0');
  Get(name, CUDNN_TYPE_CHAR, size, text.data());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  return text;
}

std::vector<CudnnDescriptor> CudnnDescriptor::GetDescriptors(
    cudnnBackendAttributeName_t name, cudnnBackendDescriptorType_t element_type,
    int64_t capacity) const {
  std::vector<CudnnDescriptor> out;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < capacity; ++i) {
    out.emplace_back(element_type);
    raw.push_back(out.back().get());
  }
  const int64_t count = Get(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, capacity, raw.data());
  out.erase(out.begin() + std::min(count, capacity), out.end());
  return out;
}

CudnnDescriptor DevicePropertiesOf(cudnnHandle_t handle) {
  CudnnDescriptor properties(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  properties.Set(CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  properties.Finalize();
  return properties;
}

CudnnDescriptor DevicePropertiesFromJson(const std::string& json) {
  CudnnDescriptor properties(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  properties.Set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                 static_cast<int64_t>(json.size()), json.data());
  std::string why;
  if (!properties.TryFinalize(&why)) {
    Fail(
        "cuDNN: these device properties do not parse (the JSON that cuDNN 9.8 or later writes "
        "for a GPU is expected): ",
        why);
  }
  return properties;
}

std::string DevicePropertiesJson(const CudnnDescriptor& device_properties) {
  return device_properties.GetString(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION);
}

CudnnDescriptor MakeTensor(int64_t uid, std::span<const int64_t> dims,
                           std::span<const int64_t> strides, cudnnDataType_t dtype,
                           int64_t alignment) {
  CORTADO_ASSERT(dims.size() == strides.size());
  CudnnDescriptor tensor(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  tensor.Set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
  tensor.SetInt64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
  tensor.SetInt64s(CUDNN_ATTR_TENSOR_STRIDES, strides);
  tensor.SetInt64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  tensor.SetInt64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, alignment);
  tensor.Finalize();
  return tensor;
}

std::string CudnnPlan::Describe() const {
  const std::string notes_text = NotesText(notes);
  return StrCat("engine ", engine, notes_text.empty() ? "" : " (" + notes_text + ")",
                ", workspace ", workspace_bytes, " B",
                runtime_compiled ? ", compiled at run time" : "");
}

CudnnPlan BuildPlan(const CudnnDescriptor& graph, const CudnnDescriptor& device_properties,
                    const NoteFilter& filter, int64_t workspace_limit) {
  std::string passed_over;  // why each configuration offered was not taken
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback";
    std::vector<CudnnDescriptor> configs = EngineConfigs(graph, device_properties, mode);
    if (configs.empty()) passed_over += StrCat("; ", mode_name, ": none offered");
    for (CudnnDescriptor& config : configs) {
      std::vector<CudnnDescriptor> engine =
          config.GetDescriptors(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1);
      CORTADO_ASSERT(engine.size() == 1);
      CudnnPlan candidate;
      candidate.engine = engine[0].GetInt64(CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
      cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
      const int64_t count =
          engine[0].Get(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                        CUDNN_NUMERICAL_NOTE_TYPE_COUNT, notes);
      candidate.notes.assign(notes, notes + std::min<int64_t>(count, std::size(notes)));
      cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
      const int64_t behaviors =
          engine[0].Get(CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                        CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, behavior);
      for (int64_t i = 0; i < std::min<int64_t>(behaviors, std::size(behavior)); ++i) {
        candidate.runtime_compiled |= behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
      }
      const std::string refused = filter(candidate.notes);
      if (!refused.empty()) {
        passed_over += StrCat("; ", mode_name, " engine ", candidate.engine, ": ", refused);
        continue;
      }
      candidate.plan.SetDescriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      candidate.plan.SetDescriptor(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device_properties);
      std::string why;
      if (!candidate.plan.TryFinalize(&why)) {
        passed_over += StrCat("; ", mode_name, " engine ", candidate.engine, ": ", why);
        continue;
      }
      candidate.workspace_bytes = candidate.plan.GetInt64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
      if (candidate.workspace_bytes > workspace_limit) {
        passed_over += StrCat("; ", mode_name, " engine ", candidate.engine, ": needs ",
                              candidate.workspace_bytes, " B of workspace, over the limit of ",
                              workspace_limit);
        continue;
      }
      return candidate;
    }
  }
  Fail("no engine configuration fits", passed_over,
       " (CUDNN_LOGWARN_DBG=1 CUDNN_LOGDEST_DBG=stderr shows why cuDNN offered no others)");
}

void ExecutePlan(cudnnHandle_t handle, const CudnnPlan& plan, std::span<const int64_t> uids,
                 std::span<void* const> pointers, void* workspace) {
  CORTADO_ASSERT(uids.size() == pointers.size());
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.SetInt64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
  pack.Set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data());
  pack.Set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.Finalize();
  const cudnnStatus_t status = Libraries().cudnnBackendExecute(handle, plan.plan.get(), pack.get());
  if (status != CUDNN_STATUS_SUCCESS) {
    Fail("cuDNN: executing the plan of ", plan.Describe(), " failed: ", Reason(status));
  }
}

}  // namespace cortado::cuda
