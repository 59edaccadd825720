// Model builders: C++ functions that emit a NetSpec, so common nets need no YAML graph.
//
// Every classification builder takes the input image shape {C, H, W} and emits a graph from the
// net inputs `data` (f32 [N, C, H, W]) and `label` (i32 [N]) to `logits` [N, num_classes],
// followed by the training loss (`loss`, SoftmaxWithLoss) and accuracy layers `top1` and `top5`
// (Accuracy, top_k 1 and 5). The trainer reads these names; a YAML graph follows the same
// convention.
// The detection builders (ssd300_vgg16, ssd_lite) take `data` and `label` (f32 [1, 1, G, 8], the
// batch's ground-truth boxes, docs/DETECTION.md) and emits `loss` (MultiBoxLoss) and `detections`
// (DetectionOutput, [1, 1, D, 7]), with the head's `cls_logits`, `bbox_regression` and `priors`;
// its num_classes counts the background.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/graph/net.h"

namespace cortado {

struct ModelOptions {
  int64_t num_classes = 10;
  int64_t in_channels = 1;
  int64_t height = 28;
  int64_t width = 28;
  int64_t batch_size = 1;  // batch dimension of the declared inputs (reshaped per batch)
  double label_smoothing = 0.0;
  bool zero_init_residual = false;  // gamma = 0 in the last BN of each residual block
  // Channels of the first stage of an ImageNet-style ResNet (the stages have 1, 2, 4 and 8
  // times as many); 0: the published 64. Small widths make small test and trial models.
  int64_t base_width = 0;
};

// Builds the named model: lenet, resnet20, resnet32, resnet44, resnet56 (CIFAR-style),
// resnet18, resnet34, resnet50, resnet101, resnet152 (ImageNet-style, v1.5), vgg11, vgg11_bn,
// vgg16, vgg16_bn, ssd300_vgg16 and ssd_lite (detection: a small SSD for 128x128 images). Throws
// listing the known names for an unknown one.
NetSpec BuildModel(const std::string& name, const ModelOptions& options);
std::vector<std::string> ModelNames();
// resnet18 ... resnet152: the builders laid out as torchvision's ResNet.
bool IsImageNetResNet(const std::string& name);
// ssd300_vgg16, ssd_lite: detectors (ground-truth boxes in, `loss` and `detections` out).
bool IsDetector(const std::string& name);

// Appends the standard head: loss (SoftmaxWithLoss), top1 and top5 (Accuracy) on `logits`.
void AddClassifierHead(NetSpec& spec, const ModelOptions& options);
// The net inputs `data` and `label` for the options' shape.
std::vector<NetInput> ImageInputs(const ModelOptions& options);

}  // namespace cortado
