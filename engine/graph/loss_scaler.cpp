#include "engine/graph/loss_scaler.h"

#include <atomic>
#include <cmath>

#include "engine/base/error.h"
#include "engine/base/thread_pool.h"
#include "engine/tensor/device_kernels.h"
#include "engine/tensor/device_runtime.h"

namespace cortado {
namespace {

template <typename T>
bool RangeFinite(const T* x, int64_t n) {
  // x - x is 0 for finite x and NaN for inf and NaN: one branch-free pass that vectorizes.
  T acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += x[i] - x[i];
  return acc == T(0);
}

}  // namespace

LossScaler::LossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {
  const LossScalerOptions& o = options_;
  CORTADO_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0,
                "precision.init_scale must be positive and finite, got ", o.init_scale);
  CORTADO_CHECK(o.growth_factor > 1 && std::isfinite(o.growth_factor),
                "precision.growth_factor must be > 1, got ", o.growth_factor);
  CORTADO_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1,
                "precision.backoff_factor must be in (0, 1), got ", o.backoff_factor);
  CORTADO_CHECK(o.growth_interval >= 1, "precision.growth_interval must be >= 1, got ",
                o.growth_interval);
}

bool LossScaler::AllFinite(const std::vector<Param*>& params) {
  if (!params.empty() && params[0]->grad.device().type != DeviceType::kCPU) {
    // On a device: one flag for the whole step, set by the shared finite-check body over every
    // gradient, and one copy of it to the host.
    const Device device = params[0]->grad.device();
    Tensor flag({1}, DType::kI32, AllocatorFor(device));
    flag.Zero();
    for (const Param* p : params) DeviceMarkNonFinite(p->grad, flag);
    return flag.To(Device::CPU()).data<int32_t>()[0] == 0;
  }
  for (const Param* p : params) {
    const Tensor& g = p->grad;
    std::atomic<bool> finite{true};
    ParallelFor(g.numel(), 65536, [&](int64_t b, int64_t e) {
      bool ok = true;
      if (g.dtype() == DType::kF32) {
        ok = RangeFinite(g.data<float>() + b, e - b);
      } else if (g.dtype() == DType::kF64) {
        ok = RangeFinite(g.data<double>() + b, e - b);
      } else {
        for (int64_t i = b; i < e && ok; ++i) ok = std::isfinite(ElementAsDouble(g, i));
      }
      if (!ok) finite.store(false, std::memory_order_relaxed);
    });
    if (!finite.load()) return false;
  }
  return true;
}

double LossScaler::Update(bool finite) {
  if (!finite) {
    ++skipped_;
    clean_ = 0;
    if (!options_.dynamic) return 1.0;
    scale_ *= options_.backoff_factor;
    return options_.backoff_factor;
  }
  if (!options_.dynamic) return 1.0;
  if (++clean_ < options_.growth_interval) return 1.0;
  clean_ = 0;
  const double grown = scale_ * options_.growth_factor;
  // An f32 gradient times a scale beyond f32's range is inf whatever it is: stop growing there.
  if (!std::isfinite(static_cast<float>(grown))) return 1.0;
  scale_ = grown;
  return options_.growth_factor;
}

void LossScaler::SaveState(Checkpoint& checkpoint) const {
  Tensor state({3}, DType::kF64);
  double* s = state.data<double>();
  s[0] = scale_;
  s[1] = static_cast<double>(clean_);
  s[2] = static_cast<double>(skipped_);
  checkpoint.Add("loss_scaler/state", state);
}

void LossScaler::LoadState(const Checkpoint& checkpoint, const std::string& path) {
  const Tensor* t = checkpoint.Find("loss_scaler/state");
  if (t == nullptr) return;  // a run that scaled nothing (or an older checkpoint): keep init
  CORTADO_CHECK(t->dtype() == DType::kF64 && t->numel() == 3, "checkpoint '", path,
                "': loss_scaler/state is ", t->ToString(), ", expected f64[3]");
  const double* s = t->data<double>();
  // The counts become integers: whole numbers within what a double holds exactly.
  const auto count = [](double c) { return c >= 0 && c <= 0x1p53 && c == std::floor(c); };
  CORTADO_CHECK(std::isfinite(s[0]) && s[0] > 0 && count(s[1]) && count(s[2]), "checkpoint '", path,
                "': loss_scaler/state holds scale ", s[0], ", clean steps ", s[1], ", skipped ",
                s[2], " (a positive scale and two whole counts expected)");
  scale_ = s[0];
  clean_ = static_cast<int64_t>(s[1]);
  skipped_ = static_cast<int64_t>(s[2]);
}

}  // namespace cortado
