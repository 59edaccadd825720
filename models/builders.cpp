#include "models/builders.h"

#include <algorithm>
#include <functional>
#include <map>

#include "engine/base/error.h"

namespace cortado {
namespace {

// Small helpers that append one layer and return its output blob name.
class GraphBuilder {
 public:
  explicit GraphBuilder(NetSpec& spec) : spec_(spec) {}

  std::string Add(const std::string& name, const std::string& type, std::vector<std::string> inputs,
                  Settings settings = {}) {
    LayerSpec layer;
    layer.name = name;
    layer.type = type;
    layer.inputs = std::move(inputs);
    layer.outputs = {name};
    layer.settings = std::move(settings);
    spec_.layers.push_back(std::move(layer));
    return name;
  }
  std::string Conv(const std::string& name, const std::string& in, int64_t out, int64_t kernel,
                   int64_t stride, int64_t pad, bool bias, const std::string& init) {
    Settings s;
    s.Set("num_output", out).Set("kernel", kernel).Set("stride", stride).Set("pad", pad);
    s.Set("bias", bias).Set("weight_init", init);
    return Add(name, "Convolution", {in}, s);
  }
  std::string BatchNorm(const std::string& name, const std::string& in, bool zero_init = false) {
    Settings s;
    if (zero_init) s.Set("zero_init", true);
    return Add(name, "BatchNorm", {in}, s);
  }
  std::string Relu(const std::string& name, const std::string& in) {
    return Add(name, "ReLU", {in});
  }
  std::string MaxPool(const std::string& name, const std::string& in, int64_t k, int64_t s,
                      int64_t pad = 0) {
    Settings st;
    st.Set("pool", "max").Set("kernel", k).Set("stride", s).Set("pad", pad);
    return Add(name, "Pooling", {in}, st);
  }
  std::string GlobalAvgPool(const std::string& name, const std::string& in) {
    Settings s;
    s.Set("pool", "ave").Set("global", true);
    return Add(name, "Pooling", {in}, s);
  }
  std::string Fc(const std::string& name, const std::string& in, int64_t out) {
    Settings s;
    s.Set("num_output", out);
    return Add(name, "InnerProduct", {in}, s);
  }

 private:
  NetSpec& spec_;
};

NetSpec LeNet(const ModelOptions& o) {
  // conv 5x5 32 pad 2, ReLU, max pool 2, conv 5x5 64 pad 2, ReLU, max pool 2, fc 512, ReLU, fc.
  NetSpec spec;
  spec.name = "lenet";
  spec.inputs = ImageInputs(o);
  GraphBuilder g(spec);
  std::string x = g.Conv("conv1", "data", 32, 5, 1, 2, true, "kaiming_uniform");
  x = g.MaxPool("pool1", g.Relu("relu1", x), 2, 2);
  x = g.Conv("conv2", x, 64, 5, 1, 2, true, "kaiming_uniform");
  x = g.MaxPool("pool2", g.Relu("relu2", x), 2, 2);
  x = g.Relu("relu3", g.Fc("fc1", x, 512));
  g.Fc("logits", x, o.num_classes);
  AddClassifierHead(spec, o);
  return spec;
}

// Adds the shortcut (identity, or a 1x1 projection + BN when the shape changes) to the
// residual branch x, then applies ReLU.
std::string ResidualJoin(GraphBuilder& g, const std::string& prefix, const std::string& x,
                         const std::string& in, int64_t in_ch, int64_t out_ch, int64_t stride,
                         const std::string& relu_name) {
  std::string shortcut = in;
  if (stride != 1 || in_ch != out_ch) {
    shortcut = g.Conv(prefix + ".proj", in, out_ch, 1, stride, 0, false, "kaiming_normal");
    shortcut = g.BatchNorm(prefix + ".proj_bn", shortcut);
  }
  Settings sum;
  sum.Set("operation", "sum");
  return g.Relu(relu_name, g.Add(prefix + ".add", "Eltwise", {x, shortcut}, sum));
}

// A basic residual block (two 3x3 convs); a 1x1 projection shortcut when the shape changes.
std::string BasicBlock(GraphBuilder& g, const std::string& prefix, const std::string& in,
                       int64_t in_ch, int64_t out_ch, int64_t stride, bool zero_init) {
  std::string x = g.Conv(prefix + ".conv1", in, out_ch, 3, stride, 1, false, "kaiming_normal");
  x = g.Relu(prefix + ".relu1", g.BatchNorm(prefix + ".bn1", x));
  x = g.Conv(prefix + ".conv2", x, out_ch, 3, 1, 1, false, "kaiming_normal");
  x = g.BatchNorm(prefix + ".bn2", x, zero_init);
  return ResidualJoin(g, prefix, x, in, in_ch, out_ch, stride, prefix + ".relu2");
}

// A bottleneck block (1x1 reduce, 3x3, 1x1 expand x4); stride on the 3x3 as torchvision does.
std::string Bottleneck(GraphBuilder& g, const std::string& prefix, const std::string& in,
                       int64_t in_ch, int64_t width, int64_t stride, bool zero_init) {
  const int64_t out_ch = width * 4;
  std::string x = g.Conv(prefix + ".conv1", in, width, 1, 1, 0, false, "kaiming_normal");
  x = g.Relu(prefix + ".relu1", g.BatchNorm(prefix + ".bn1", x));
  x = g.Conv(prefix + ".conv2", x, width, 3, stride, 1, false, "kaiming_normal");
  x = g.Relu(prefix + ".relu2", g.BatchNorm(prefix + ".bn2", x));
  x = g.Conv(prefix + ".conv3", x, out_ch, 1, 1, 0, false, "kaiming_normal");
  x = g.BatchNorm(prefix + ".bn3", x, zero_init);
  return ResidualJoin(g, prefix, x, in, in_ch, out_ch, stride, prefix + ".relu3");
}

// CIFAR-style ResNet-(6n+2): 3x3 stem with 16 channels, three stages of n basic blocks with
// 16, 32, 64 channels (stride 2 at the start of stages 2 and 3), global average pool, fc.
NetSpec CifarResNet(const std::string& name, int64_t n, const ModelOptions& o) {
  NetSpec spec;
  spec.name = name;
  spec.inputs = ImageInputs(o);
  GraphBuilder g(spec);
  std::string x = g.Conv("conv1", "data", 16, 3, 1, 1, false, "kaiming_normal");
  x = g.Relu("relu1", g.BatchNorm("bn1", x));
  int64_t ch = 16;
  const int64_t widths[3] = {16, 32, 64};
  for (int stage = 0; stage < 3; ++stage) {
    for (int64_t b = 0; b < n; ++b) {
      int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      std::string prefix = StrCat("stage", stage + 1, ".block", b + 1);
      x = BasicBlock(g, prefix, x, ch, widths[stage], stride, o.zero_init_residual);
      ch = widths[stage];
    }
  }
  x = g.GlobalAvgPool("avgpool", x);
  g.Fc("logits", x, o.num_classes);
  AddClassifierHead(spec, o);
  return spec;
}

// ImageNet-style ResNet (torchvision layout): 7x7/2 stem, 3x3/2 max pool, four stages.
NetSpec ImageNetResNet(const std::string& name, std::vector<int64_t> depths, bool bottleneck,
                       const ModelOptions& o) {
  NetSpec spec;
  spec.name = name;
  spec.inputs = ImageInputs(o);
  GraphBuilder g(spec);
  const int64_t base = o.base_width > 0 ? o.base_width : 64;
  std::string x = g.Conv("conv1", "data", base, 7, 2, 3, false, "kaiming_normal");
  x = g.Relu("relu1", g.BatchNorm("bn1", x));
  x = g.MaxPool("pool1", x, 3, 2, 1);
  int64_t ch = base;
  const int64_t widths[4] = {base, 2 * base, 4 * base, 8 * base};
  for (int stage = 0; stage < 4; ++stage) {
    for (int64_t b = 0; b < depths[stage]; ++b) {
      int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      std::string prefix = StrCat("layer", stage + 1, ".", b);
      if (bottleneck) {
        x = Bottleneck(g, prefix, x, ch, widths[stage], stride, o.zero_init_residual);
        ch = widths[stage] * 4;
      } else {
        x = BasicBlock(g, prefix, x, ch, widths[stage], stride, o.zero_init_residual);
        ch = widths[stage];
      }
    }
  }
  x = g.GlobalAvgPool("avgpool", x);
  g.Fc("logits", x, o.num_classes);
  AddClassifierHead(spec, o);
  return spec;
}

// VGG (torchvision layout): 3x3 convolutions (pad 1, bias) with ReLU, optionally batch norm
// between them, 2x2/2 max pools between stages, then fc 4096, ReLU, dropout 0.5, fc 4096, ReLU,
// dropout 0.5, fc. torchvision pools the features adaptively to 7x7 before the classifier;
// here the classifier reads the 512 x H/32 x W/32 feature map as it is, which is the same at
// 224x224 (7x7: the adaptive pool is the identity) and keeps small inputs cheap. Initialized as
// torchvision does: kaiming_normal (fan out) convolutions, N(0, 0.01) fc weights, zero biases.
NetSpec Vgg(const std::string& name, const std::vector<int64_t>& stages, bool batch_norm,
            const ModelOptions& o) {
  NetSpec spec;
  spec.name = name;
  spec.inputs = ImageInputs(o);
  GraphBuilder g(spec);
  std::string x = "data";
  int64_t width = 64;
  int layer = 0;  // torchvision's index into `features`, so names match its state dict
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    for (int64_t c = 0; c < stages[stage]; ++c) {
      Settings conv;
      conv.Set("num_output", width).Set("kernel", int64_t{3}).Set("pad", int64_t{1});
      conv.Set("weight_init", "kaiming_normal").Set("bias_init", "zero");
      x = g.Add(StrCat("features.", layer++), "Convolution", {x}, conv);
      if (batch_norm) x = g.BatchNorm(StrCat("features.", layer++), x);
      x = g.Relu(StrCat("features.", layer++), x);
    }
    x = g.MaxPool(StrCat("features.", layer++), x, 2, 2);
    width = std::min<int64_t>(width * 2, 512);
  }
  auto fc = [&](const std::string& layer_name, const std::string& in, int64_t out) {
    Settings s;
    s.Set("num_output", out).Set("weight_init", "normal").Set("bias_init", "zero");
    return g.Add(layer_name, "InnerProduct", {in}, s);
  };
  auto dropout = [&](const std::string& layer_name, const std::string& in) {
    Settings s;
    s.Set("ratio", 0.5);
    return g.Add(layer_name, "Dropout", {in}, s);
  };
  x = dropout("classifier.2", g.Relu("classifier.1", fc("classifier.0", x, 4096)));
  x = dropout("classifier.5", g.Relu("classifier.4", fc("classifier.3", x, 4096)));
  // The classifier's last layer is `logits`, as every builder's is.
  fc("logits", x, o.num_classes);
  AddClassifierHead(spec, o);
  return spec;
}

// SSD's heads on the feature maps: per map a 3x3 convolution (bias, xavier_uniform) of
// anchors[k] x columns outputs, NCHW -> NHWC, (N, H W A, columns); then concatenated over the
// maps into cls_logits (columns: num_classes) and bbox_regression (4), in torchvision's order
// and with its module paths; then `loss` (MultiBoxLoss on `label`) and `detections`.
void AddSsdHeads(GraphBuilder& g, const std::vector<std::string>& maps,
                 const std::vector<int64_t>& anchors, int64_t num_classes) {
  auto head = [&](const std::string& kind, const std::string& out, int64_t columns) {
    std::vector<std::string> parts;
    for (size_t k = 0; k < maps.size(); ++k) {
      const std::string name = StrCat("head.", kind, "_head.module_list.", k);
      Settings s;
      s.Set("num_output", anchors[k] * columns).Set("kernel", int64_t{3}).Set("stride", int64_t{1});
      s.Set("pad", int64_t{1}).Set("weight_init", "xavier_uniform").Set("bias_init", "zero");
      std::string y = g.Add(name, "Convolution", {maps[k]}, s);
      Settings permute, reshape;
      permute.SetInts("order", {0, 2, 3, 1});
      reshape.SetInts("shape", {0, -1, columns});
      y = g.Add(name + ".nhwc", "Permute", {y}, permute);
      parts.push_back(g.Add(name + ".rows", "Reshape", {y}, reshape));
    }
    Settings cat;
    cat.Set("axis", int64_t{1});
    return g.Add(out, "Concat", parts, cat);
  };
  const std::string cls = head("classification", "cls_logits", num_classes);
  const std::string reg = head("regression", "bbox_regression", 4);
  g.Add("loss", "MultiBoxLoss", {cls, reg, "priors", "label"});
  g.Add("detections", "DetectionOutput", {cls, reg, "priors"});
}

// SSD300 with a VGG-16 backbone, laid out as torchvision's ssd300_vgg16 (layer names are its
// module paths, so its state dict loads; the L2Norm's weight is its backbone.scale_weight, see
// tools/weights.cpp). num_classes counts the background (VOC: 21), as torchvision's and Caffe
// SSD's do.
//   backbone.features    VGG-16's conv1_1 .. conv4_3 with ReLUs; pool3 in ceil mode (75 -> 38)
//   backbone.conv4_3_norm  L2Norm on conv4_3 (scale 20): feature map 0 (38x38, 512)
//   backbone.extra.0     pool4, conv5_1 .. conv5_3, pool5 3x3/1 pad 1, fc6 (3x3, dilation 6,
//                        1024), fc7 (1x1, 1024): feature map 1 (19x19)
//   backbone.extra.1-4   1x1 then 3x3 (stride 2 pad 1 twice, then unpadded twice): maps 2-5
//                        (10x10 512, 5x5 256, 3x3 256, 1x1 256)
//   head.*_head.module_list.k  a 3x3 convolution per map (A_k x (K + 1) class logits, A_k x 4
//                        box offsets; A = 4, 6, 6, 6, 4, 4), each permuted to NHWC and reshaped
//                        to (N, H W A_k, columns), then concatenated over the maps
// Outputs: cls_logits (N, 8732, K + 1) and bbox_regression (N, 8732, 4) in torchvision's order,
// priors (8732, 4) (torchvision's DefaultBoxGenerator for ssd300_vgg16), the training loss
// `loss` (MultiBoxLoss against `label`, the batch's (1, 1, G, 8) ground truth, kept in f32) and
// `detections` (DetectionOutput, (1, 1, D, 7), rows in the test phase only).
// Initialized as torchvision: VGG's convolutions kaiming_normal (fan out), the rest
// xavier_uniform, zero biases.
NetSpec Ssd300Vgg16(const ModelOptions& o) {
  CORTADO_CHECK(o.num_classes >= 2,
                "ssd300_vgg16: model.num_classes counts the background, so it "
                "must be at least 2 (VOC: 21, COCO: 81), got ",
                o.num_classes);
  CORTADO_CHECK(o.in_channels == 3, "ssd300_vgg16 takes 3-channel images, got model.in_channels ",
                o.in_channels);
  NetSpec spec;
  spec.name = "ssd300_vgg16";
  spec.inputs = {NetInput{"data", {o.batch_size, o.in_channels, o.height, o.width}, DType::kF32},
                 NetInput{"label", {1, 1, 0, 8}, DType::kF32, /*keep_dtype=*/true}};
  GraphBuilder g(spec);
  auto conv = [&](const std::string& name, const std::string& in, int64_t out, int64_t kernel,
                  int64_t stride, int64_t pad, const std::string& init, int64_t dilation = 1) {
    Settings s;
    s.Set("num_output", out).Set("kernel", kernel).Set("stride", stride).Set("pad", pad);
    if (dilation != 1) s.Set("dilation", dilation);
    s.Set("weight_init", init).Set("bias_init", "zero");
    return g.Add(name, "Convolution", {in}, s);
  };
  // VGG-16 up to conv4_3's ReLU, torchvision's indices into vgg16().features.
  std::string x = "data";
  int layer = 0;
  int64_t width = 64;
  const int64_t convs[4] = {2, 2, 3, 3};
  for (int stage = 0; stage < 4; ++stage) {
    for (int64_t c = 0; c < convs[stage]; ++c) {
      x = conv(StrCat("backbone.features.", layer++), x, width, 3, 1, 1, "kaiming_normal");
      x = g.Relu(StrCat("backbone.features.", layer++), x);
    }
    if (stage == 3) break;  // pool4 opens backbone.extra.0
    Settings pool;
    pool.Set("pool", "max").Set("kernel", int64_t{2}).Set("stride", int64_t{2});
    if (stage == 2) pool.Set("ceil_mode", true);  // torchvision patches pool3: 75 -> 38
    x = g.Add(StrCat("backbone.features.", layer++), "Pooling", {x}, pool);
    width *= 2;
  }
  const std::string conv4_3 = x;
  Settings norm;
  norm.Set("scale_init", 20.0);
  std::vector<std::string> maps = {g.Add("backbone.conv4_3_norm", "L2Norm", {conv4_3}, norm)};
  // extra.0: pool4, conv5_x, pool5 (3x3/1 pad 1), fc6 (dilated), fc7.
  x = g.MaxPool("backbone.extra.0.0", conv4_3, 2, 2);
  for (int i = 1; i <= 5; i += 2) {
    x = conv(StrCat("backbone.extra.0.", i), x, 512, 3, 1, 1, "kaiming_normal");
    x = g.Relu(StrCat("backbone.extra.0.", i + 1), x);
  }
  x = g.MaxPool("backbone.extra.0.7.0", x, 3, 1, 1);
  x = g.Relu("backbone.extra.0.7.2",
             conv("backbone.extra.0.7.1", x, 1024, 3, 1, 6, "xavier_uniform", /*dilation=*/6));
  x = g.Relu("backbone.extra.0.7.4",
             conv("backbone.extra.0.7.3", x, 1024, 1, 1, 0, "xavier_uniform"));
  maps.push_back(x);
  // extra.1-4: (1x1 width, 3x3 out, stride, pad).
  const int64_t extra[4][4] = {
      {256, 512, 2, 1}, {128, 256, 2, 1}, {128, 256, 1, 0}, {128, 256, 1, 0}};
  for (int e = 0; e < 4; ++e) {
    const std::string prefix = StrCat("backbone.extra.", e + 1, ".");
    x = g.Relu(prefix + "1", conv(prefix + "0", x, extra[e][0], 1, 1, 0, "xavier_uniform"));
    x = g.Relu(prefix + "3",
               conv(prefix + "2", x, extra[e][1], 3, extra[e][2], extra[e][3], "xavier_uniform"));
    maps.push_back(x);
  }
  // Priors: torchvision's DefaultBoxGenerator for ssd300_vgg16.
  Settings priors;
  priors.SetInts("aspect_ratios", {2, 2, 3, 2, 3, 2, 3, 2, 2});
  priors.SetInts("aspect_ratios_per_map", {1, 2, 2, 2, 1, 1});
  priors.SetList("scales", {"0.07", "0.15", "0.33", "0.51", "0.69", "0.87", "1.05"});
  priors.SetInts("steps", {8, 16, 32, 64, 100, 300});
  std::vector<std::string> prior_inputs = maps;
  prior_inputs.push_back("data");
  g.Add("priors", "PriorBox", prior_inputs, priors);
  AddSsdHeads(g, maps, {4, 6, 6, 6, 4, 4}, o.num_classes);
  return spec;
}

// ssd_lite: a small SSD for small images (the Fashion-MNIST miniature's 128x128 canvases), the
// same inputs, heads and outputs as ssd300_vgg16 on a VGG-like backbone of 3x3 convolutions
// with batch norm: 32, pool, 64, pool, 64, 64, pool, 128 (map 0, stride 8), then 3x3 stride 2
// convolutions to map 1 (stride 16, 128) and map 2 (stride 32, 128). Priors (torchvision's
// convention, 4 per position: s_k, sqrt(s_k s_k+1) and aspect ratios 2 and 1/2) of scales
// 0.15, 0.3, 0.5 with 0.75 closing the list: boxes of 19 to 96 pixels at 128x128. Height and
// width must be multiples of 32.
NetSpec SsdLite(const ModelOptions& o) {
  CORTADO_CHECK(o.num_classes >= 2,
                "ssd_lite: model.num_classes counts the background, so it must be at least 2, got ",
                o.num_classes);
  CORTADO_CHECK(o.height % 32 == 0 && o.width % 32 == 0 && o.height >= 32 && o.width >= 32,
                "ssd_lite takes images whose sides are multiples of 32 (data.resize), got ",
                o.height, "x", o.width);
  NetSpec spec;
  spec.name = "ssd_lite";
  spec.inputs = {NetInput{"data", {o.batch_size, o.in_channels, o.height, o.width}, DType::kF32},
                 NetInput{"label", {1, 1, 0, 8}, DType::kF32, /*keep_dtype=*/true}};
  GraphBuilder g(spec);
  int index = 0;
  auto block = [&](const std::string& in, int64_t out, int64_t stride) {
    const std::string prefix = StrCat("backbone.", index++);
    std::string y = g.Conv(prefix + ".conv", in, out, 3, stride, 1, false, "kaiming_normal");
    return g.Relu(prefix + ".relu", g.BatchNorm(prefix + ".bn", y));
  };
  std::string x = g.MaxPool("backbone.pool1", block("data", 32, 1), 2, 2);
  x = g.MaxPool("backbone.pool2", block(x, 64, 1), 2, 2);
  x = g.MaxPool("backbone.pool3", block(block(x, 64, 1), 64, 1), 2, 2);
  std::vector<std::string> maps;
  maps.push_back(block(x, 128, 1));
  maps.push_back(block(maps.back(), 128, 2));
  maps.push_back(block(maps.back(), 128, 2));
  Settings priors;
  priors.SetInts("aspect_ratios", {2});
  priors.SetList("scales", {"0.15", "0.3", "0.5", "0.75"});
  std::vector<std::string> prior_inputs = maps;
  prior_inputs.push_back("data");
  g.Add("priors", "PriorBox", prior_inputs, priors);
  AddSsdHeads(g, maps, {4, 4, 4}, o.num_classes);
  return spec;
}

using Builder = std::function<NetSpec(const ModelOptions&)>;
const std::map<std::string, Builder>& Builders() {
  static const std::map<std::string, Builder> builders = {
      {"lenet", LeNet},
      {"resnet20", [](const ModelOptions& o) { return CifarResNet("resnet20", 3, o); }},
      {"resnet32", [](const ModelOptions& o) { return CifarResNet("resnet32", 5, o); }},
      {"resnet44", [](const ModelOptions& o) { return CifarResNet("resnet44", 7, o); }},
      {"resnet56", [](const ModelOptions& o) { return CifarResNet("resnet56", 9, o); }},
      {"resnet18",
       [](const ModelOptions& o) {
         return ImageNetResNet("resnet18", {2, 2, 2, 2}, false, o);
       }},
      {"resnet34",
       [](const ModelOptions& o) {
         return ImageNetResNet("resnet34", {3, 4, 6, 3}, false, o);
       }},
      {"resnet50",
       [](const ModelOptions& o) {
         return ImageNetResNet("resnet50", {3, 4, 6, 3}, true, o);
       }},
      {"resnet101",
       [](const ModelOptions& o) {
         return ImageNetResNet("resnet101", {3, 4, 23, 3}, true, o);
       }},
      {"resnet152",
       [](const ModelOptions& o) {
         return ImageNetResNet("resnet152", {3, 8, 36, 3}, true, o);
       }},
      {"vgg11",
       [](const ModelOptions& o) {
         return Vgg("vgg11", {1, 1, 2, 2, 2}, false, o);
       }},
      {"vgg11_bn",
       [](const ModelOptions& o) {
         return Vgg("vgg11_bn", {1, 1, 2, 2, 2}, true, o);
       }},
      {"vgg16",
       [](const ModelOptions& o) {
         return Vgg("vgg16", {2, 2, 3, 3, 3}, false, o);
       }},
      {"vgg16_bn",
       [](const ModelOptions& o) {
         return Vgg("vgg16_bn", {2, 2, 3, 3, 3}, true, o);
       }},
      {"ssd300_vgg16", Ssd300Vgg16},
      {"ssd_lite", SsdLite},
  };
  return builders;
}

}  // namespace

bool IsImageNetResNet(const std::string& name) {
  return name == "resnet18" || name == "resnet34" || name == "resnet50" || name == "resnet101" ||
         name == "resnet152";
}

bool IsDetector(const std::string& name) { return name == "ssd300_vgg16" || name == "ssd_lite"; }

std::vector<NetInput> ImageInputs(const ModelOptions& o) {
  return {NetInput{"data", {o.batch_size, o.in_channels, o.height, o.width}, DType::kF32},
          NetInput{"label", {o.batch_size}, DType::kI32}};
}

void AddClassifierHead(NetSpec& spec, const ModelOptions& o) {
  GraphBuilder g(spec);
  Settings loss;
  if (o.label_smoothing > 0) loss.Set("label_smoothing", o.label_smoothing);
  g.Add("loss", "SoftmaxWithLoss", {"logits", "label"}, loss);
  Settings top1, top5;
  top1.Set("top_k", int64_t{1});
  top5.Set("top_k", std::min<int64_t>(5, o.num_classes));
  g.Add("top1", "Accuracy", {"logits", "label"}, top1);
  g.Add("top5", "Accuracy", {"logits", "label"}, top5);
}

NetSpec BuildModel(const std::string& name, const ModelOptions& options) {
  CORTADO_CHECK(options.num_classes >= 1, "model.num_classes must be at least 1, got ",
                options.num_classes);
  CORTADO_CHECK(options.in_channels >= 1, "model.in_channels must be at least 1, got ",
                options.in_channels);
  CORTADO_CHECK(options.base_width >= 0,
                "model.base_width must be positive (or 0: the published "
                "width), got ",
                options.base_width);
  CORTADO_CHECK(options.base_width == 0 || IsImageNetResNet(name),
                "model.base_width applies to "
                "resnet18, resnet34, resnet50, resnet101 and resnet152, not to '",
                name, "'");
  auto it = Builders().find(name);
  if (it == Builders().end()) {
    std::string known;
    for (const auto& [n, b] : Builders()) known += (known.empty() ? "" : ", ") + n;
    Fail("unknown model builder '", name, "' (known: ", known, ")");
  }
  return it->second(options);
}

std::vector<std::string> ModelNames() {
  std::vector<std::string> names;
  for (const auto& [n, b] : Builders()) names.push_back(n);
  return names;
}

}  // namespace cortado
