#include "tests/layers/gradient_check.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "engine/base/random.h"

namespace cortado::testing {
namespace {

std::string IndexString(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return ShapeString(idx);
}

}  // namespace

std::string GradientCheckReport::Summary() const {
  std::ostringstream out;
  out.precision(6);
  out << (ok ? "gradient check passed" : "gradient check FAILED") << ": " << checked
      << " elements, largest |analytic - numeric| = " << max_abs_diff << ", worst tolerance ratio "
      << worst_ratio << " at " << worst;
  if (!ok) out << "\n  first failure: " << first_failure;
  return out.str();
}

GradientCheckReport CheckLayerGradients(Layer& layer, const std::vector<Blob*>& bottom,
                                        const std::vector<Blob*>& top,
                                        const GradientCheckOptions& options) {
  GradientCheckReport report;
  for (Blob* b : bottom) {
    CORTADO_CHECK(b->data.dtype() == DType::kF64 || b->data.dtype() == DType::kI32,
                  "gradient check of ", layer.Describe(), " needs f64 inputs, got ",
                  b->data.ToString());
  }
  // Which inputs to check.
  std::vector<bool> check(bottom.size(), false);
  if (options.inputs.empty()) {
    for (size_t i = 0; i < bottom.size(); ++i) {
      check[i] = layer.CanBackpropTo(static_cast<int>(i)) && bottom[i]->data.dtype() == DType::kF64;
    }
  } else {
    for (int i : options.inputs) check.at(i) = true;
  }

  // The objective's weights, one per top element.
  layer.Reshape(bottom, top);
  layer.Forward(bottom, top);
  std::vector<std::vector<double>> weights(top.size());
  Rng rng(options.seed);
  for (size_t j = 0; j < top.size(); ++j) {
    CORTADO_CHECK(top[j]->data.dtype() == DType::kF64, "gradient check: top ", j, " of ",
                  layer.Describe(), " is ", top[j]->data.ToString());
    for (int64_t i = 0; i < top[j]->data.numel(); ++i) weights[j].push_back(rng.Uniform(-1, 1));
  }
  auto objective = [&]() {
    layer.Reshape(bottom, top);
    layer.Forward(bottom, top);
    double l = 0;
    for (size_t j = 0; j < top.size(); ++j) {
      const double* y = top[j]->data.data<double>();
      for (int64_t i = 0; i < top[j]->data.numel(); ++i) l += y[i] * weights[j][i];
    }
    return l;
  };

  // Analytic gradients. Bottom and param grads start as NaN: a layer must overwrite them.
  for (size_t j = 0; j < top.size(); ++j) {
    top[j]->grad.Resize(top[j]->data.shape(), DType::kF64);
    for (int64_t i = 0; i < top[j]->grad.numel(); ++i) {
      top[j]->grad.data<double>()[i] = weights[j][i];
    }
  }
  for (size_t i = 0; i < bottom.size(); ++i) {
    if (!check[i]) continue;
    bottom[i]->grad.Resize(bottom[i]->data.shape(), DType::kF64);
    bottom[i]->grad.Fill(std::nan(""));
  }
  for (Param& p : layer.params()) p.grad.Fill(std::nan(""));
  layer.Backward(top, check, bottom);

  struct Target {
    std::string label;
    Tensor* value;
    Tensor analytic;
  };
  std::vector<Target> targets;
  for (size_t i = 0; i < bottom.size(); ++i) {
    if (check[i]) {
      targets.push_back({StrCat("input ", i, " ('", bottom[i]->name, "')"), &bottom[i]->data,
                         bottom[i]->grad.Clone()});
    }
  }
  if (options.check_params) {
    for (Param& p : layer.params()) {
      targets.push_back({StrCat("param '", p.name, "'"), &p.value, p.grad.Clone()});
    }
  }

  for (Target& target : targets) {
    double* v = target.value->data<double>();
    const double* analytic = target.analytic.data<double>();
    for (int64_t i = 0; i < target.value->numel(); ++i) {
      const double saved = v[i];
      v[i] = saved + options.step;
      const double plus = objective();
      v[i] = saved - options.step;
      const double minus = objective();
      v[i] = saved;
      const double numeric = (plus - minus) / (2 * options.step);
      const double a = analytic[i];
      const double diff = std::fabs(a - numeric);
      const double allowed =
          options.abs_tol + options.rel_tol * std::max(std::fabs(a), std::fabs(numeric));
      const double ratio =
          std::isfinite(diff) ? diff / allowed : std::numeric_limits<double>::infinity();
      ++report.checked;
      std::ostringstream where;
      where.precision(10);
      where << target.label << " element " << i << " " << IndexString(target.value->shape(), i)
            << ": analytic " << a << ", numeric " << numeric;
      if (std::isfinite(diff)) report.max_abs_diff = std::max(report.max_abs_diff, diff);
      if (ratio > report.worst_ratio || report.worst.empty()) {
        report.worst_ratio = std::max(report.worst_ratio, ratio);
        report.worst = where.str();
      }
      if (!(ratio <= 1.0) && report.ok) {
        report.ok = false;
        report.first_failure = where.str();
      }
    }
  }
  // Leave the layer's outputs consistent with the restored inputs.
  objective();
  return report;
}

}  // namespace cortado::testing
