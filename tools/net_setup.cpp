#include "tools/net_setup.h"

#include <algorithm>
#include <array>
#include <map>
#include <sstream>

#include "data/lmdb_source.h"
#include "engine/base/error.h"
#include "models/builders.h"

namespace cortado {

MemoryFormat ConfigLayout(const RunConfig& config) {
  if (config.model.layout == "nchw") return MemoryFormat::kNCHW;
  if (config.model.layout == "nhwc") return MemoryFormat::kNHWC;
  return AutoLayout(Device::CPU(), config.precision.compute);
}

NetOptions ConfigNetOptions(const RunConfig& config, NetMode mode) {
  NetOptions options;
  options.mode = mode;
  options.plan_memory = true;
  options.layout = ConfigLayout(config);
  // On a device the layers run unfused: an absorbing layer reads the absorbed one's parameters
  // from its own kernel, which a device kernel is not given.
  options.fuse = config.device == Device::CPU();
  options.device = config.device;
  return options;
}

std::string LayoutSummary(const RunConfig& config, const Net& net) {
  std::string reorders;
  for (const std::string& r : net.reorders()) reorders += StrCat(reorders.empty() ? "" : "; ", r);
  std::string out =
      StrCat("layout: ", MemoryFormatName(net.layout()), " (model.layout: ", config.model.layout,
             "); reorders: ", reorders.empty() ? std::string("none") : reorders, "\n");
  // Which kernels run the convolutions, grouped.
  std::map<std::string, int> kernels;
  for (const auto& layer : net.layers()) {
    if (layer->type() == "Convolution") ++kernels[layer->KernelInfo()];
  }
  if (!kernels.empty()) {
    out += "convolutions:";
    bool first = true;
    for (const auto& [what, count] : kernels) {
      out += StrCat(first ? " " : "; ", count, " on ", what);
      first = false;
    }
    out += "\n";
  }
  return out;
}

NetSpec MakeNetSpec(const RunConfig& config, const Shape& sample_shape, int64_t num_classes,
                    int64_t batch_size) {
  CORTADO_CHECK(sample_shape.size() == 3, "data samples must be [C, H, W], got ",
                ShapeString(sample_shape));
  ModelOptions o;
  o.num_classes = config.model.num_classes > 0 ? config.model.num_classes : num_classes;
  CORTADO_CHECK(o.num_classes >= 1,
                "model.num_classes is not set and the data does not say "
                "how many classes it has");
  CORTADO_CHECK(num_classes <= 0 || o.num_classes >= num_classes, "model.num_classes is ",
                o.num_classes, " but the data has labels up to ", num_classes - 1);
  o.in_channels = sample_shape[0];
  CORTADO_CHECK(config.model.in_channels == 0 || config.model.in_channels == sample_shape[0],
                "model.in_channels is ", config.model.in_channels, " but the data has ",
                sample_shape[0], " channel(s)");
  o.height = sample_shape[1];
  o.width = sample_shape[2];
  o.batch_size = batch_size;
  o.label_smoothing = config.model.label_smoothing;
  o.zero_init_residual = config.model.zero_init_residual;
  o.base_width = config.model.base_width;
  if (!config.model.builder.empty()) return BuildModel(config.model.builder, o);
  NetSpec spec;
  spec.name = "graph";
  spec.inputs = ImageInputs(o);
  spec.layers = config.model.layers;
  return spec;
}

std::string NetTable(Net& net) {
  std::vector<std::array<std::string, 4>> rows = {{"layer", "type", "output", "params"}};
  for (const auto& layer : net.layers()) {
    int64_t n = 0;
    for (const Param& p : layer->params()) n += p.value.numel();
    const std::vector<std::string>& outs = layer->spec().outputs;
    const std::string shape = !outs.empty() && net.has_blob(outs[0])
                                  ? ShapeString(net.blob(outs[0])->data.shape())
                                  : std::string("-");
    rows.push_back({layer->name(), layer->type() + layer->Note(), shape, std::to_string(n)});
  }
  // Each column as wide as its longest entry plus two spaces: a long layer name never runs
  // into its type.
  size_t width[3] = {0, 0, 0};
  for (const auto& r : rows) {
    for (int c = 0; c < 3; ++c) width[c] = std::max(width[c], r[static_cast<size_t>(c)].size());
  }
  std::ostringstream out;
  for (const auto& r : rows) {
    for (int c = 0; c < 3; ++c) {
      out << r[static_cast<size_t>(c)]
          << std::string(width[c] + 2 - r[static_cast<size_t>(c)].size(), ' ');
    }
    out << r[3] << "\n";
  }
  out << "total parameters: " << net.num_parameters() << "\n";
  return out.str();
}

std::string NetTableWithoutData(const RunConfig& config) {
  const DataOptions& d = config.data;
  CORTADO_CHECK(d.type != "idx", "the input size of an IDX net comes from its files");
  CORTADO_CHECK(config.model.num_classes > 0 || d.type == "synthetic",
                "model.num_classes is not set, and only the data could say how many classes");
  const Shape sample = d.type == "synthetic"
                           ? Shape(d.synthetic_shape.begin(), d.synthetic_shape.end())
                           : LmdbSampleShape(d);
  const int64_t classes = d.type == "synthetic" ? d.synthetic_classes : -1;
  Net net(MakeNetSpec(config, sample, classes, d.batch_size), config.seed, config.precision.compute,
          ConfigNetOptions(config, NetMode::kTrain));
  return StrCat(NetTable(net), LayoutSummary(config, net), "(built from the config alone: ",
                config.model.num_classes > 0 ? config.model.num_classes : classes,
                " classes, input ", ShapeString(sample), ")\n");
}

namespace {
// Records at `path` of the config's data type: the size of one evaluation pass over it, which
// neither drops nor pads.
int64_t RecordCount(const DataOptions& options, const std::string& path) {
  DataOptions o = options;
  o.val = path;
  o.val_batch_size = o.batch_size;
  return MakeEvalSource(o, ShardSpec{})->samples_per_epoch();
}
}  // namespace

std::string DataSummary(const RunConfig& config, const BatchSource& train) {
  const DataOptions& d = config.data;
  std::ostringstream out;
  const int64_t per_epoch = train.samples_per_epoch();
  const int64_t batches = train.batches_per_epoch();
  if (d.type == "synthetic") {
    out << "data: synthetic, " << d.synthetic_samples << " samples of "
        << ShapeString(train.sample_shape()) << "; an epoch is " << batches << " batches of "
        << d.batch_size << " = " << per_epoch << " samples; "
        << (d.synthetic_val_samples > 0
                ? StrCat(d.synthetic_val_samples, " samples evaluated")
                : std::string("no evaluation (data.synthetic.val_samples: 0)"))
        << "\n";
    return out.str();
  }
  const int64_t records = RecordCount(d, d.train);
  out << "data.train: " << records << " records (" << d.type << ", " << d.train << "), samples "
      << ShapeString(train.sample_shape());
  if (train.num_classes() > 0) out << ", " << train.num_classes() << " classes";
  out << "; an epoch is " << batches << " batches of " << d.batch_size << " = " << per_epoch
      << " samples";
  if (per_epoch < records) {
    out << " (drop_last leaves " << records - per_epoch << " records out of each shuffled epoch)";
  } else if (per_epoch > records) {
    out << " (padded by wrapping: " << per_epoch - records << " records twice)";
  }
  out << "\n";
  if (!d.val.empty()) {
    const int64_t val_batch = d.val_batch_size > 0 ? d.val_batch_size : d.batch_size;
    out << "data.val: " << RecordCount(d, d.val) << " records (" << d.val
        << "), evaluated in batches of " << val_batch << "\n";
  } else {
    out << "data.val: none (no evaluation)\n";
  }
  return out.str();
}

}  // namespace cortado
