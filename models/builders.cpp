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
  };
  return builders;
}

}  // namespace

bool IsImageNetResNet(const std::string& name) {
  return name == "resnet18" || name == "resnet34" || name == "resnet50" || name == "resnet101" ||
         name == "resnet152";
}

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
