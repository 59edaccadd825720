#include "tools/weights.h"

#include <map>
#include <set>

#include "engine/base/error.h"
#include "models/builders.h"

namespace cortado::tools {
namespace {

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

void ReplaceAll(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

bool IsVgg(const std::string& builder) { return StartsWith(builder, "vgg"); }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string List(const std::vector<std::string>& names, size_t max = 6) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > max) s += StrCat(" and ", names.size() - max, " more");
  return s;
}

// "layer1.0.conv1" of "layer1.0.conv1.weight".
std::string LayerOf(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// The layer of the net's last parameter: the final classifier.
std::string ClassifierLayer(Net& net) {
  return net.params().empty() ? std::string() : LayerOf(net.params().back()->name);
}

// Whether `layer` is part of what fine-tuning to another class count replaces: the final
// classifier, or for a detector every feature map's class-logit convolution.
bool InClassifier(const std::string& builder, const std::string& layer,
                  const std::string& classifier) {
  if (IsDetector(builder)) return StartsWith(layer, "head.classification_head.");
  return layer == classifier;
}

}  // namespace

std::string TorchvisionName(const std::string& builder, const std::string& name) {
  std::string out = name;
  if (IsImageNetResNet(builder)) {
    // Order matters: ".proj_bn." also contains ".proj".
    ReplaceAll(out, ".proj_bn.", ".downsample.1.");
    ReplaceAll(out, ".proj.", ".downsample.0.");
    if (StartsWith(out, "logits.")) out = "fc." + out.substr(7);
  } else if (IsVgg(builder)) {
    if (StartsWith(out, "logits.")) out = "classifier.6." + out.substr(7);
  } else if (IsDetector(builder)) {
    // torchvision keeps the conv4_3 L2 norm's scale on the backbone itself.
    if (out == "backbone.conv4_3_norm.weight") out = "backbone.scale_weight";
  }
  return out;
}

Safetensors ExportWeights(const Checkpoint& checkpoint, const std::string& builder) {
  Safetensors file;
  file.metadata["format"] = "pt";  // what loaders of the Hugging Face convention look for
  file.metadata["cortado_builder"] = builder.empty() ? "graph" : builder;
  if (checkpoint.meta.count("iteration")) file.metadata["iteration"] = checkpoint.Meta("iteration");
  std::set<std::string> norm_layers;
  for (const auto& [name, tensor] : checkpoint.tensors) {
    std::string local;
    if (StartsWith(name, "param/")) {
      local = name.substr(6);
    } else if (StartsWith(name, "buffer/")) {
      local = name.substr(7);
      const std::string suffix = ".running_mean";
      if (EndsWith(local, suffix))
        norm_layers.insert(local.substr(0, local.size() - suffix.size()));
    } else {
      continue;  // momentum, error-feedback residuals, solver state: not weights
    }
    file.Add(TorchvisionName(builder, local), tensor);
  }
  for (const std::string& layer : norm_layers) {
    SafetensorsEntry e;
    e.name = TorchvisionName(builder, layer + ".num_batches_tracked");
    e.dtype = "I64";
    e.bytes.assign(8, '\0');
    file.AddRaw(std::move(e));
  }
  CORTADO_CHECK(!file.entries.empty(), "the checkpoint holds no weights (param/... entries)");
  return file;
}

std::string WeightsReport::Summary(const std::string& path) const {
  std::string s = StrCat("weights: ", loaded, " tensor(s) loaded from '", path, "'");
  if (!resized.empty()) {
    s += StrCat("; ", resized.size(), " left at initialization (shape differs): ", List(resized));
  }
  if (!missing.empty()) {
    s += StrCat("; ", missing.size(), " not in the file (left at initialization): ", List(missing));
  }
  if (!unused.empty()) s += StrCat("; ", unused.size(), " unused: ", List(unused));
  return s;
}

WeightsReport LoadWeights(Net& net, const std::string& builder, const Safetensors& file,
                          const std::string& path, bool strict) {
  WeightsReport report;
  std::set<std::string> used;
  const std::string classifier = ClassifierLayer(net);
  auto outside = [&](const std::string& name, const std::string& what) {
    if (!InClassifier(builder, LayerOf(name), classifier)) {
      report.outside_classifier.push_back(what);
    }
  };
  auto load = [&](const std::string& name, Tensor& value) {
    const std::string file_name = TorchvisionName(builder, name);
    const SafetensorsEntry* e = file.Find(file_name);
    if (e == nullptr) {
      CORTADO_CHECK(!strict, "weights file '", path, "' has no tensor '", file_name,
                    "' (the model's '", name, "')");
      report.missing.push_back(file_name);
      outside(name, file_name + " (not in the file)");
      return;
    }
    used.insert(file_name);
    const Shape shape(e->shape.begin(), e->shape.end());
    if (shape != value.shape()) {
      const std::string what = StrCat(file_name, " (", ShapeString(shape), " in the file, ",
                                      ShapeString(value.shape()), " in the model)");
      CORTADO_CHECK(!strict, "weights file '", path, "': tensor ", what);
      report.resized.push_back(what);
      outside(name, what);
      return;
    }
    Tensor t;
    try {
      t = e->ToTensor();
    } catch (const Error& err) {
      Fail("weights file '", path, "': ", err.what());
    }
    const DType d = t.dtype();
    CORTADO_CHECK(d == DType::kF32 || d == DType::kF64 || d == DType::kF16 || d == DType::kBF16,
                  "weights file '", path, "': tensor '", file_name, "' is ", e->dtype,
                  "; weights must be floating point");
    value.ConvertFrom(t);
    ++report.loaded;
  };
  for (Param* p : net.params()) load(p->name, p->value);
  for (Buffer* b : net.buffers()) load(b->name, b->value);
  net.ParamsChanged();  // layers that keep derived copies of their weights refresh them
  // A larger architecture's file (resnet34's into resnet18) fills every tensor of the net; only
  // its extra blocks, left over here, tell that it is another architecture's.
  const std::string file_classifier =
      classifier.empty() ? std::string()
                         : LayerOf(TorchvisionName(builder, classifier + ".weight"));
  for (const SafetensorsEntry& e : file.entries) {
    const bool counter = EndsWith(e.name, ".num_batches_tracked");  // torchvision's, ignored
    if (used.count(e.name) || counter) continue;
    report.unused.push_back(e.name);
    if (!InClassifier(builder, LayerOf(e.name), file_classifier)) {
      report.outside_classifier.push_back(e.name + " (not in the model)");
    }
  }
  CORTADO_CHECK(!strict || report.unused.empty(), "weights file '", path,
                "' has tensors the model lacks: ", List(report.unused));
  CORTADO_CHECK(
      report.loaded > 0, "no tensor of weights file '", path,
      "' fits the model (its names: ", List(report.unused.empty() ? report.missing : report.unused),
      "); was it exported from another architecture?");
  return report;
}

void CheckFineTuning(const WeightsReport& report, const std::string& path, bool partial) {
  if (partial || report.outside_classifier.empty()) return;
  Fail("weights file '", path, "' does not fit the model outside its final classifier (",
       report.outside_classifier.size(), " tensor(s): ", List(report.outside_classifier, 4),
       "); is it another architecture's? --weights-partial (model.weights_partial: true) loads "
       "what fits anyway");
}

std::string BuilderWarning(const Safetensors& file, const std::string& builder,
                           const std::string& path) {
  auto stored = file.metadata.find("cortado_builder");
  const std::string ours = builder.empty() ? "graph" : builder;
  if (stored == file.metadata.end() || stored->second == ours) return "";
  return StrCat("weights file '", path, "' was exported from a '", stored->second,
                "' model; this run builds '", ours, "'");
}

}  // namespace cortado::tools
