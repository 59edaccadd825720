// How a net rewrites the graph it is given (engine/graph/net.h): the fusions of the spec (batch
// norm or a sum with the ReLU that follows), the layout the net keeps (AutoLayout) and the
// reorders where a layer wants another, the layers a neighbour absorbs, and the layers that run
// in place.
#include <map>
#include <string>
#include <vector>

#include "engine/graph/conv_onednn.h"
#include "engine/graph/net.h"

namespace cortado {

MemoryFormat AutoLayout(Device device, DType compute) {
  if (device.type != DeviceType::kCPU) return MemoryFormat::kNCHW;
  const bool fast = ChannelsLastConv::Built() && compute != DType::kF64;
  return fast ? MemoryFormat::kNHWC : MemoryFormat::kNCHW;
}

NetSpec FuseSpec(const NetSpec& spec) {
  std::map<std::string, std::vector<size_t>> readers;  // blob -> the layers that read it
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    for (const std::string& in : spec.layers[i].inputs) readers[in].push_back(i);
  }
  NetSpec out = spec;
  out.layers.clear();
  std::vector<bool> dropped(spec.layers.size(), false);
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    if (dropped[i]) continue;
    LayerSpec layer = spec.layers[i];
    const bool bn = layer.type == "BatchNorm";
    const bool sum =
        layer.type == "Eltwise" &&
        (!layer.settings.Has("operation") || layer.settings.GetString("operation", "") == "sum");
    if ((bn || sum) && !layer.settings.Has("relu") && layer.outputs.size() == 1) {
      const std::vector<size_t>& r = readers[layer.outputs[0]];
      if (r.size() == 1 && r[0] > i) {
        const LayerSpec& next = spec.layers[r[0]];
        const bool plain_relu = next.type == "ReLU" && next.inputs.size() == 1 &&
                                next.settings.GetFloat("negative_slope", 0.0) == 0.0;
        if (plain_relu) {
          layer.settings.Set("relu", true);
          layer.outputs = next.outputs;
          dropped[r[0]] = true;
        }
      }
    }
    out.layers.push_back(std::move(layer));
  }
  return out;
}

void Net::AbsorbLayers() {
  std::vector<int> readers(blobs_.size(), 0), reader(blobs_.size(), -1);
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (Blob* b : bottoms_[i]) {
      const size_t index = blob_index_.at(b->name);
      ++readers[index];
      reader[index] = static_cast<int>(i);
    }
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (tops_[i].size() != 1 || layers_[i]->absorbed()) continue;
    const size_t out = blob_index_.at(tops_[i][0]->name);
    if (readers[out] != 1) continue;
    const size_t j = static_cast<size_t>(reader[out]);
    if (bottoms_[j].size() != 1 || tops_[j].size() != 1) continue;
    if (layers_[i]->AbsorbNext(*layers_[j])) layers_[j]->set_absorbed(true);
  }
}

MemoryFormat Net::WantedFormat(const Layer& layer) const {
  return layer.TakesChannelsLast() ? options_.layout : MemoryFormat::kNCHW;
}

std::string Net::ReorderedInput(const Layer& layer, const std::string& name) {
  const Tensor& t = blobs_[blob_index_.at(name)]->data;
  const MemoryFormat want = WantedFormat(layer);
  if (t.ndim() != 4 || t.format() == want || t.IsLayoutTrivial()) return name;
  LayerSpec reorder;
  reorder.name = StrCat(name, ".to_", MemoryFormatName(want));
  for (int k = 2; blob_index_.count(reorder.name); ++k) {
    reorder.name = StrCat(name, ".to_", MemoryFormatName(want), "_", k);
  }
  reorder.type = "Reorder";
  reorder.inputs = {name};
  reorder.outputs = {reorder.name};
  reorder.settings.Set("format", MemoryFormatName(want));
  reorders_.push_back(StrCat(reorder.name, " (", name, " ", MemoryFormatName(t.format()), " -> ",
                             MemoryFormatName(want), ", before ", layer.Describe(), ")"));
  AddLayer(reorder);
  return reorder.name;
}

void Net::PlanInPlaceLayers() {
  std::vector<int> readers(blobs_.size(), 0), producer(blobs_.size(), -1);
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (Blob* b : bottoms_[i]) ++readers[blob_index_.at(b->name)];
    for (Blob* t : tops_[i]) producer[blob_index_.at(t->name)] = static_cast<int>(i);
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = *layers_[i];
    // Layers with several inputs (a sum) write into input 0.
    if (!layer.CanRunInPlace() || bottoms_[i].empty() || tops_[i].size() != 1) continue;
    const size_t input = blob_index_.at(bottoms_[i][0]->name);
    const int from = producer[input];
    // Net inputs, inputs read by others too, and outputs whose producer reads them again in
    // backward (or shares them, as Split does) keep their own storage.
    if (from < 0 || readers[input] != 1 ||
        layers_[static_cast<size_t>(from)]->BackwardReadsOutputs()) {
      continue;
    }
    layer.set_in_place(true);
  }
}

}  // namespace cortado
