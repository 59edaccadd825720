// The run config's model: section (run_config_sections.h): a models/ builder or a graph of layers
// written in the file, each layer's name, type, blobs and settings.
#include <algorithm>

#include "engine/base/error.h"
#include "models/builders.h"
#include "tools/run_config_sections.h"

namespace cortado::run_config {
namespace {

std::string ScalarText(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string(); }

// One entry of model.layers: name, type, inputs, outputs; every other key is a layer setting.
LayerSpec ParseLayer(const YamlConfig& yaml, const YAML::Node& node, size_t index) {
  std::string where = yaml.WhereOf(node, "");
  std::string path = StrCat("model.layers[", index, "]");
  CORTADO_CHECK(node.IsMap(), where, ": ", path, ": each layer must be a mapping");
  LayerSpec spec;
  spec.where = where;
  for (const auto& item : node) {
    CORTADO_CHECK(item.first.IsScalar(), where, ": ", path, ": a key is not a setting name");
    std::string key = item.first.as<std::string>();
    const YAML::Node& value = item.second;
    std::string at = yaml.WhereOf(value, "");
    auto names = [&]() {
      std::vector<std::string> out;
      if (value.IsScalar()) {
        out.push_back(value.Scalar());
      } else if (value.IsSequence()) {
        for (const auto& v : value) {
          CORTADO_CHECK(v.IsScalar(), at, ": ", path, ".", key, ": expected blob names");
          out.push_back(v.Scalar());
        }
      } else {
        Fail(at, ": ", path, ".", key, ": expected a blob name or a list of them");
      }
      return out;
    };
    if (key == "name") {
      spec.name = ScalarText(value);
    } else if (key == "type") {
      spec.type = ScalarText(value);
    } else if (key == "inputs" || key == "bottom") {
      spec.inputs = names();
    } else if (key == "outputs" || key == "top") {
      spec.outputs = names();
    } else if (value.IsScalar()) {
      spec.settings.Set(key, value.Scalar(), at);
    } else if (value.IsSequence()) {
      std::vector<std::string> items;
      for (const auto& v : value) {
        CORTADO_CHECK(v.IsScalar(), at, ": ", path, ".", key, ": lists must hold plain values");
        items.push_back(v.Scalar());
      }
      spec.settings.SetList(key, items, at);
    } else {
      Fail(at, ": ", path, ".", key, ": expected a value or a list of values");
    }
  }
  CORTADO_CHECK(!spec.name.empty(), where, ": ", path, ": missing 'name'");
  CORTADO_CHECK(!spec.type.empty(), where, ": ", path, " ('", spec.name, "'): missing 'type'");
  CORTADO_CHECK(!spec.outputs.empty() || spec.type == "Silence", where, ": ", path, " ('",
                spec.name, "'): missing 'outputs'");
  return spec;
}

}  // namespace

constexpr std::string_view kModelKeys[] = {"builder",     "layers",          "num_classes",
                                           "in_channels", "label_smoothing", "zero_init_residual",
                                           "base_width",  "weights",         "weights_partial",
                                           "layout"};

std::span<const std::string_view> ModelKeys() { return kModelKeys; }

ModelConfig ParseModel(const YamlConfig& yaml, const YamlSection& m) {
  ModelConfig model;
  model.builder = m.String("builder", "");
  const std::vector<std::string> builders = ModelNames();
  if (!model.builder.empty() &&
      std::find(builders.begin(), builders.end(), model.builder) == builders.end()) {
    std::string known;
    for (const std::string& b : builders) known += (known.empty() ? "" : ", ") + b;
    m.Error("builder", "unknown builder '" + model.builder + "' (known: " + known + ")");
  }
  if (m.Has("layers")) {
    YAML::Node layers = m.Node("layers");
    Require(layers.IsSequence(), m, "layers", "expected a list of layers");
    for (size_t i = 0; i < layers.size(); ++i)
      model.layers.push_back(ParseLayer(yaml, layers[i], i));
  }
  Require(model.builder.empty() != model.layers.empty(), m, "",
          "give exactly one of 'builder' (lenet, resnet20, ...) or 'layers' (a graph)");
  model.num_classes = m.Int("num_classes", 0);
  Require(model.num_classes >= 0, m, "num_classes", "must be >= 1 (or 0: from the data)");
  model.in_channels = m.Int("in_channels", 0);
  Require(model.in_channels >= 0, m, "in_channels", "must be >= 1 (or 0: from the data)");
  model.label_smoothing = m.Float("label_smoothing", 0.0);
  Require(model.label_smoothing >= 0 && model.label_smoothing < 1, m, "label_smoothing",
          "must be in [0, 1)");
  model.zero_init_residual = m.Bool("zero_init_residual", false);
  model.base_width = m.Int("base_width", 0);
  Require(model.base_width >= 0, m, "base_width", "must be >= 1 (or 0: the published 64)");
  Require(model.base_width == 0 || !model.builder.empty(), m, "base_width",
          "applies to the resnet18 ... resnet152 builders, not to a layers graph");
  model.weights = m.String("weights", "");
  model.weights_partial = m.Bool("weights_partial", false);
  model.layout = m.String("layout", "auto");
  Require(model.layout == "auto" || model.layout == "nchw" || model.layout == "nhwc", m, "layout",
          "must be auto, nchw or nhwc, got '" + model.layout + "'");
  return model;
}

}  // namespace cortado::run_config
