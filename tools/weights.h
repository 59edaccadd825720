// Weights files: a model's parameters and batch-norm statistics as safetensors
// (engine/io/safetensors.h), under torchvision's state-dict names where the model is a
// torchvision architecture, so weights move between Cortado and PyTorch both ways.
//
//   cortado export --checkpoint C --out model.safetensors     (ExportWeights)
//   cortado train --weights model.safetensors                  (LoadWeights, non-strict)
//   cortado eval --weights model.safetensors --config F        (LoadWeights, strict)
//
// Names: torchvision's for the resnet18 ... resnet152 builders (the projection shortcut
// `layerS.B.proj` / `.proj_bn` is torchvision's `downsample.0` / `downsample.1`, the classifier
// `logits` its `fc`), the VGG builders (classifier `logits` is `classifier.6`) and ssd300_vgg16
// (its layers carry torchvision's module paths; the conv4_3 L2Norm's `backbone.conv4_3_norm.weight`
// is torchvision's `backbone.scale_weight`); Cortado's own
// (layer name + "." + weight, bias, running_mean, running_var) for every other model. Batch
// norm layers also get torchvision's `num_batches_tracked` (I64, 0), so the file loads into
// torchvision with strict=True; Cortado ignores it on import.
#pragma once

#include <string>
#include <vector>

#include "engine/graph/net.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"

namespace cortado::tools {

// The file name of a Cortado parameter or buffer name for models built by `builder` ("" for a
// YAML graph: names stay as they are).
std::string TorchvisionName(const std::string& builder, const std::string& name);

// The weights of a checkpoint ("param/<name>" and "buffer/<name>" entries) under file names.
// The metadata records the builder and the checkpoint's iteration.
Safetensors ExportWeights(const Checkpoint& checkpoint, const std::string& builder);

struct WeightsReport {
  int loaded = 0;                    // tensors copied into the net
  std::vector<std::string> resized;  // in the file with another shape: left at initialization
  std::vector<std::string> missing;  // the net's tensors the file lacks: left at initialization
  std::vector<std::string> unused;   // the file's tensors the net has no place for
  // Of `resized`, `missing` and `unused`, those outside the final classifier (the layer of the
  // net's last parameter; a detector's class-logit convolutions, head.classification_head.*):
  // fine-tuning replaces only the classifier, so these mean another architecture (an unused
  // one: a larger architecture's file, such as resnet34's in resnet18).
  std::vector<std::string> outside_classifier;
  std::string Summary(const std::string& path) const;  // one line for the log
};

// Copies every tensor of `file` whose name (TorchvisionName) and shape match one of the net's
// parameters or buffers into it, converting F16, BF16, F32 and F64 to the net's dtype. Non-
// strict (fine-tuning: a classifier for another class count is left at its initialization and
// listed); strict: any difference throws, naming the first. Throws when nothing matches.
WeightsReport LoadWeights(Net& net, const std::string& builder, const Safetensors& file,
                          const std::string& path, bool strict);

// Training's check of a non-strict load: throws, listing the first few, when a tensor outside
// the final classifier was missing, of another shape or unused, unless `partial`
// (model.weights_partial,
// --weights-partial) says a partial load is intended.
void CheckFineTuning(const WeightsReport& report, const std::string& path, bool partial);

// A warning (empty when none) when the file's metadata names another builder than `builder`
// ("" for a YAML graph, which export records as "graph").
std::string BuilderWarning(const Safetensors& file, const std::string& builder,
                           const std::string& path);

}  // namespace cortado::tools
