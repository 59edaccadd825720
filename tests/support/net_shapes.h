// Test helper: the convolutions of the nets that Cortado trains (LeNet, ResNet-20, ResNet-50,
// VGG-16), read from the model builders: each net is built (inference mode, batch 1, up to its
// last convolution) and every
// Convolution layer's input shape, weight shape and stride/pad/dilation settings give its
// geometry, with N set to the batch the net trains at. The GPU's plans are made and tested for
// these, so a builder that changes changes what is tested.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/cuda/cudnn_conv.h"
#include "engine/graph/net.h"
#include "models/builders.h"

namespace cortado::testing {

struct NetConvolution {
  std::string net;    // "resnet50"
  std::string layer;  // "layer1.0.conv2"
  cuda::ConvGeometry geometry;
};

struct TrainedNet {
  const char* model;
  int64_t channels, height, width, num_classes;
  int64_t batch;  // per GPU, as the configs and the device check train it
};

// LeNet and ResNet-20 as configs/fashion_*.yaml (Fashion-MNIST, batch 128), ResNet-50 as the
// device check's synthetic run (batch 256), VGG-16 as configs/vgg16.yaml (32 per rank).
inline const std::vector<TrainedNet>& TrainedNets() {
  static const std::vector<TrainedNet> nets = {{"lenet", 1, 28, 28, 10, 128},
                                               {"resnet20", 1, 28, 28, 10, 128},
                                               {"resnet50", 3, 224, 224, 1000, 256},
                                               {"vgg16", 3, 224, 224, 1000, 32}};
  return nets;
}

inline std::vector<NetConvolution> ConvolutionsOf(const TrainedNet& trained) {
  ModelOptions options;
  options.in_channels = trained.channels;
  options.height = trained.height;
  options.width = trained.width;
  options.num_classes = trained.num_classes;
  options.batch_size = 1;
  // The layers up to the last convolution: the rest (VGG-16's 120 M classifier weights) would
  // only cost the time to initialize them.
  NetSpec spec = BuildModel(trained.model, options);
  size_t end = 0;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    if (spec.layers[i].type == "Convolution") end = i + 1;
  }
  spec.layers.resize(end);
  Net net(spec, /*seed=*/1, DType::kF32, NetOptions{.mode = NetMode::kInference});
  std::vector<NetConvolution> convolutions;
  for (const auto& layer : net.layers()) {
    if (layer->type() != "Convolution") continue;
    const LayerSpec& spec = layer->spec();
    const Shape& x = net.blob(spec.inputs[0])->data.shape();  // (1, C, H, W)
    const Shape& w = layer->params()[0].value.shape();        // (K, C / groups, kh, kw)
    const std::vector<int64_t> stride = spec.settings.GetPair("stride", 1);
    const std::vector<int64_t> pad = spec.settings.GetPair("pad", 0);
    const std::vector<int64_t> dilation = spec.settings.GetPair("dilation", 1);
    cuda::ConvGeometry g;
    g.n = trained.batch, g.c = x[1], g.h = x[2], g.w = x[3];
    g.k = w[0], g.kh = w[2], g.kw = w[3];
    g.stride_h = stride[0], g.stride_w = stride[1];
    g.pad_h = pad[0], g.pad_w = pad[1];
    g.dilation_h = dilation[0], g.dilation_w = dilation[1];
    g.groups = x[1] / w[1];
    convolutions.push_back({trained.model, layer->name(), g});
  }
  return convolutions;
}

struct NetInnerProduct {
  std::string net, layer;
  int64_t batch, inputs, outputs;  // x (batch x inputs), W (outputs x inputs)
};

// The inner products of a net, in order. The net is built up to its first InnerProduct, whose
// input gives the features; each later one takes the previous one's outputs (ReLU and dropout
// between them keep the shape), so VGG-16's 120 M classifier weights are never initialized.
inline std::vector<NetInnerProduct> InnerProductsOf(const TrainedNet& trained) {
  ModelOptions options;
  options.in_channels = trained.channels;
  options.height = trained.height;
  options.width = trained.width;
  options.num_classes = trained.num_classes;
  options.batch_size = 1;
  NetSpec spec = BuildModel(trained.model, options);
  std::vector<LayerSpec> products;
  for (const LayerSpec& layer : spec.layers) {
    if (layer.type == "InnerProduct") products.push_back(layer);
  }
  if (products.empty()) return {};
  size_t first = 0;
  while (spec.layers[first].type != "InnerProduct") ++first;
  spec.layers.resize(first);
  Net net(spec, /*seed=*/1, DType::kF32, NetOptions{.mode = NetMode::kInference});
  const Shape& x = net.blob(products[0].inputs[0])->data.shape();
  int64_t inputs = 1;
  for (size_t d = 1; d < x.size(); ++d) inputs *= x[d];
  std::vector<NetInnerProduct> out;
  for (const LayerSpec& layer : products) {
    const int64_t outputs = layer.settings.GetInt("num_output");
    out.push_back({trained.model, layer.name, trained.batch, inputs, outputs});
    inputs = outputs;
  }
  return out;
}

// Every net's convolutions, each geometry once (the first layer that has it).
inline std::vector<NetConvolution> DistinctNetConvolutions() {
  std::vector<NetConvolution> distinct;
  for (const TrainedNet& trained : TrainedNets()) {
    for (NetConvolution& conv : ConvolutionsOf(trained)) {
      bool seen = false;
      for (const NetConvolution& d : distinct) seen = seen || d.geometry == conv.geometry;
      if (!seen) distinct.push_back(std::move(conv));
    }
  }
  return distinct;
}

}  // namespace cortado::testing
