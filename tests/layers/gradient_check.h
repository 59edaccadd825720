// Numerical gradient check for one layer (Caffe's GradientChecker, llm.c's style of report).
//
// The objective is L = sum_j <r_j, top_j> with fixed random weights r_j, so one Backward with
// top grads r_j gives the analytic dL/d(input) and dL/d(param) for every element at once.
// Each element is then perturbed by +-step and L re-evaluated (central differences). All in
// f64: the layer must have been set up with f64 blobs.
//
// An element fails when |analytic - numeric| > abs_tol + rel_tol * max(|analytic|, |numeric|).
// The report names the blob or parameter, the flat and multi-dimensional index, both values
// and the largest difference seen anywhere, so a failure says where to look.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/graph/layer.h"

namespace cortado::testing {

struct GradientCheckOptions {
  double step = 1e-5;
  double rel_tol = 1e-6;
  double abs_tol = 1e-8;
  uint64_t seed = 12345;  // for the objective's random weights
  bool check_params = true;
  // Inputs to check; empty means every f64 input the layer can backpropagate to.
  std::vector<int> inputs;
};

struct GradientCheckReport {
  bool ok = true;
  int64_t checked = 0;        // elements compared
  double worst_ratio = 0;     // largest |a - n| / (abs_tol + rel_tol * max(|a|, |n|))
  double max_abs_diff = 0;    // largest |a - n|
  std::string worst;          // where worst_ratio was reached
  std::string first_failure;  // empty when ok
  std::string Summary() const;
};

// `layer` must be set up on `bottom`/`top` (f64). Bottom data and params are restored.
GradientCheckReport CheckLayerGradients(Layer& layer, const std::vector<Blob*>& bottom,
                                        const std::vector<Blob*>& top,
                                        const GradientCheckOptions& options = {});

}  // namespace cortado::testing
