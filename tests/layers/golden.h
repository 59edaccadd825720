// Reader for tests/testdata/layers_golden.bin, written by tests/make_golden.py (the format is
// documented there). Each case names a layer type, its settings and phase, and carries named
// tensors: inputs, parameter and buffer values, PyTorch's outputs and gradients.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/graph/layer.h"
#include "engine/tensor/tensor.h"

namespace cortado::testing {

struct GoldenCase {
  std::string name;
  std::string type;
  Phase phase = Phase::kTrain;
  Settings settings;
  std::map<std::string, Tensor> tensors;  // "bottom.0", "top.0", "param_grad.weight", ...
  bool Has(const std::string& key) const { return tensors.count(key) != 0; }
  const Tensor& Get(const std::string& key) const;
};

struct GoldenFile {
  uint32_t version = 0;
  std::string torch_version;
  std::string note;
  std::vector<GoldenCase> cases;
};

// Throws cortado::Error naming the file and the offset of a malformed or truncated record.
GoldenFile ReadGoldenFile(const std::string& path);

}  // namespace cortado::testing
