// LossScaler: dynamic loss scaling for mixed-precision training (the `precision:` section).
//
// Low-precision activation gradients (f16 above all: nothing below 2^-24 survives) would lose
// small values, so the loss is multiplied by `scale` before backward and every gradient carries
// that factor; the solver divides it out (SgdSolver::Step's grad_scale) while updating the f32
// master weights. After the gradients are complete (all-reduced, on every rank alike), a
// non-finite loss or gradient value anywhere means the step overflowed (a forward pass beyond
// f16's range, or a scale too large): the step is skipped (no weight, momentum or decay change;
// the trainer also puts back the batch-norm statistics and error-feedback residuals) and the
// scale shrinks by backoff_factor. After growth_interval clean steps in a row it grows by
// growth_factor (PyTorch's GradScaler rule, with its defaults). A static scale (dynamic =
// false) never changes; the trainer stops the run, naming the iteration, at a step whose loss
// or gradients are not finite under a static scale (and without a scaler, in fp16 and bf16).
//
// Checkpoint state: "loss_scaler/state" = f64 [scale, clean steps in a row, skipped steps], so
// a resumed run scales exactly as an uninterrupted one.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/graph/layer.h"
#include "engine/io/checkpoint.h"

namespace cortado {

struct LossScalerOptions {
  bool dynamic = true;
  double init_scale = 65536.0;  // the first scale (the static scale when !dynamic)
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler : public CheckpointState {
 public:
  // Throws naming the option that is out of range (scale > 0 and finite, growth > 1,
  // 0 < backoff < 1, interval >= 1).
  explicit LossScaler(LossScalerOptions options);

  double scale() const { return scale_; }
  const LossScalerOptions& options() const { return options_; }
  int64_t skipped_steps() const { return skipped_; }
  int64_t clean_steps() const { return clean_; }

  // Whether every gradient element of `params` is finite (one pass, in parallel).
  static bool AllFinite(const std::vector<Param*>& params);
  // Records the outcome of a step whose gradients were (all) finite or not, and returns the
  // factor by which the scale changed (1 when it did not): error-feedback residuals, which
  // carry the old scale, are multiplied by it.
  double Update(bool finite);

  void SaveState(Checkpoint& checkpoint) const override;
  void LoadState(const Checkpoint& checkpoint, const std::string& path) override;

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_ = 0;    // clean steps since the last change
  int64_t skipped_ = 0;  // steps skipped in the whole run
};

}  // namespace cortado
