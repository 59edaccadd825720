// `cortado inspect --config F [--set k=v]...` prints the net a config builds (layers, output
// shapes, parameter counts) and what its data yields (records, and the samples an epoch is
// made of, and the activation memory plan: MB alive at each layer in training and inference;
// where the data is not on this machine, the net from the config alone and a note);
// `--checkpoint PATH` a checkpoint's position, its stored config and a table of its tensors;
// `--weights PATH` a safetensors file's metadata and tensors (either flag takes either format);
// `--db PATH` an LMDB of Datum records: record count, classes, the image sizes seen in a sample of
// records, a few keys, and whether it is complete (data/lmdb.h). They combine.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "data/annotated_datum.h"
#include "data/datum.h"
#include "data/jpeg.h"
#include "data/lmdb.h"
#include "data/lmdb_source.h"
#include "engine/base/log.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/file_kind.h"
#include "tools/metrics.h"
#include "tools/trainer.h"

namespace cortado::tools {
namespace {

// Records whose sizes `--db` reads, spread evenly over the database.
constexpr int64_t kSampledRecords = 200;

// One row of a tensor table: name, shape, dtype, number of values.
struct TensorRow {
  std::string name, shape, dtype;
  int64_t values = 0;
};

void PrintTensorTable(const std::vector<TensorRow>& rows) {
  size_t name_w = 4, shape_w = 5;
  for (const TensorRow& r : rows) {
    name_w = std::max(name_w, r.name.size());
    shape_w = std::max(shape_w, r.shape.size());
  }
  const int nw = static_cast<int>(name_w), sw = static_cast<int>(shape_w);
  std::printf("%-*s  %-*s  %-5s  %s\n", nw, "name", sw, "shape", "dtype", "values");
  int64_t total = 0;
  for (const TensorRow& r : rows) {
    total += r.values;
    std::printf("%-*s  %-*s  %-5s  %lld\n", nw, r.name.c_str(), sw, r.shape.c_str(),
                r.dtype.c_str(), static_cast<long long>(r.values));
  }
  std::printf("%zu tensors, %lld values\n", rows.size(), static_cast<long long>(total));
}

void PrintCheckpoint(const std::string& path) {
  Checkpoint ckpt = LoadCheckpoint(path);
  std::printf("checkpoint %s\n", path.c_str());
  for (const auto& [k, v] : ckpt.meta) {
    if (k != "config") std::printf("  %-20s %s\n", k.c_str(), v.c_str());
  }
  if (auto c = ckpt.meta.find("config"); c != ckpt.meta.end()) {
    std::printf("stored config (the run's resolved YAML; `cortado eval --checkpoint` uses it):\n");
    std::istringstream lines(c->second);
    for (std::string line; std::getline(lines, line);) std::printf("  %s\n", line.c_str());
  }
  std::vector<TensorRow> rows;
  for (const auto& [name, t] : ckpt.tensors) {
    rows.push_back({name, ShapeString(t.shape()), DTypeName(t.dtype()), t.numel()});
  }
  PrintTensorTable(rows);
}

// A safetensors file (`cortado export`'s, or PyTorch's): its metadata (cortado_builder names
// the architecture the weights are for) and its tensors, in the order of their data.
void PrintSafetensors(const std::string& path) {
  const Safetensors file = LoadSafetensors(path);
  std::printf("safetensors %s\n", path.c_str());
  if (file.metadata.empty()) std::printf("  (no metadata)\n");
  for (const auto& [k, v] : file.metadata) std::printf("  %-20s %s\n", k.c_str(), v.c_str());
  std::vector<TensorRow> rows;
  for (const SafetensorsEntry& e : file.entries) {
    int64_t values = 1;
    for (int64_t d : e.shape) values *= d;
    rows.push_back({e.name, ShapeString(e.shape), e.dtype, values});
  }
  PrintTensorTable(rows);
}

// --checkpoint and --weights take either format: the file's first bytes say which it is.
void PrintWeightsFile(const std::string& flag, const std::string& path) {
  CheckInputFile(flag, path, "a checkpoint (ckpt-*.cortado) or a safetensors file");
  if (SniffFileKind(path) == FileKind::kSafetensors) {
    PrintSafetensors(path);
  } else {
    PrintCheckpoint(path);
  }
}

// Whether the database is complete, as the training sources check it.
std::string Completeness(const std::string& path, int64_t records) {
  try {
    const std::optional<LmdbCompletion> done = ReadLmdbCompletion(path);
    CheckLmdbComplete(path, records);
    return done ? StrCat("yes (", kLmdbCompleteFile, ": ", done->records, " records, ",
                         done->skipped, " skipped inputs, converted from ",
                         done->root.empty() ? "?" : done->root, ")")
                : StrCat("unknown: no ", kLmdbCompleteFile,
                         " and no classes.txt (another tool's database)");
  } catch (const Error& e) {
    return StrCat("NO: ", e.what());
  }
}

// What an even sample of a database's records holds.
struct RecordSample {
  int64_t sampled = 0, encoded = 0, raw = 0, unreadable = 0;
  std::map<std::string, int64_t> sizes;  // "WxHxC" -> records
  std::map<int, int64_t> labels;         // label -> records (detection: objects)
  bool detection = false;                // Caffe SSD AnnotatedDatum records
  int64_t objects = 0, difficult = 0;    // detection
};

RecordSample SampleRecords(const LmdbReader& reader, int64_t records) {
  RecordSample out;
  out.sampled = std::min(records, kSampledRecords);
  DatumParser parser;
  AnnotatedDatumParser annotated;
  std::string why;
  JpegDecoder jpeg;
  LmdbReader::ReadTxn txn = reader.BeginRead();
  // A classification Datum never parses as an AnnotatedDatum with an image, so the first record
  // tells which kind the database holds.
  if (records > 0) {
    const std::string_view first = txn.Get(0);
    out.detection = annotated.Parse(first.data(), first.size(), &why);
  }
  for (int64_t s = 0; s < out.sampled; ++s) {
    const int64_t i = out.sampled > 1 ? s * (records - 1) / (out.sampled - 1) : 0;
    const std::string_view value = txn.Get(i);
    const bool parsed = out.detection ? annotated.Parse(value.data(), value.size(), &why)
                                      : parser.Parse(value.data(), value.size());
    if (!parsed) {
      ++out.unreadable;
      continue;
    }
    const DatumFields& f = out.detection ? annotated.fields() : parser.fields();
    if (out.detection) {
      for (const BoxAnnotation& b : annotated.boxes()) {
        ++out.labels[b.label];
        ++out.objects;
        out.difficult += b.difficult;
      }
    } else {
      ++out.labels[f.label];
    }
    int w = f.width, h = f.height, c = f.channels;
    if (f.encoded) {
      ++out.encoded;
      JpegHeader header;
      const std::string_view data = out.detection ? annotated.data() : parser.data();
      if (!jpeg.Open(reinterpret_cast<const uint8_t*>(data.data()), data.size(), &header)) {
        ++out.unreadable;
        continue;
      }
      w = header.width;
      h = header.height;
      c = header.components;
    } else {
      ++out.raw;
    }
    ++out.sizes[StrCat(w, "x", h, "x", c)];
  }
  return out;
}

// "8x6x3 (10), 16x12x3 (2)": the six commonest sizes, most records first.
std::string CommonSizes(const std::map<std::string, int64_t>& sizes) {
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [size, n] : sizes) by_count.emplace_back(n, size);
  std::sort(by_count.rbegin(), by_count.rend());
  std::string seen;
  for (size_t i = 0; i < by_count.size() && i < 6; ++i) {
    seen += StrCat(i ? ", " : "", by_count[i].second, " (", by_count[i].first, ")");
  }
  if (by_count.size() > 6) seen += StrCat(", and ", by_count.size() - 6, " other sizes");
  return seen.empty() ? "-" : seen;
}

void PrintDb(const std::string& path) {
  CheckInputDir("--db", path, "an LMDB folder (from cortado convert)");
  std::shared_ptr<const LmdbReader> reader = LmdbReader::Open(path);
  const int64_t records = reader->size();
  std::printf("LMDB %s\n", path.c_str());
  std::printf("  records    %lld\n", static_cast<long long>(records));
  // Classes: classes.txt names them, line i label i.
  std::vector<std::string> classes;
  {
    std::ifstream in(path + "/classes.txt");
    for (std::string line; std::getline(in, line);) classes.push_back(line);
  }
  if (!classes.empty()) {
    std::string some;
    for (size_t i = 0; i < classes.size() && i < 5; ++i) some += (i ? ", " : "") + classes[i];
    std::printf("  classes    %zu (classes.txt: %s%s)\n", classes.size(), some.c_str(),
                classes.size() > 5 ? ", ..." : "");
  } else {
    std::printf("  classes    unknown (no classes.txt)\n");
  }
  std::printf("  complete   %s\n", Completeness(path, records).c_str());
  const RecordSample sample = SampleRecords(*reader, records);
  std::printf(
      "  sampled    %lld of %lld records: %lld encoded (JPEG), %lld raw, %lld unreadable; "
      "%zu distinct labels\n",
      static_cast<long long>(sample.sampled), static_cast<long long>(records),
      static_cast<long long>(sample.encoded), static_cast<long long>(sample.raw),
      static_cast<long long>(sample.unreadable), sample.labels.size());
  if (sample.detection) {
    std::printf(
        "  objects    %lld in the sampled records (%.2f per image), %lld difficult: Caffe SSD "
        "AnnotatedDatum records (detection)\n",
        static_cast<long long>(sample.objects),
        sample.sampled > 0 ? static_cast<double>(sample.objects) / sample.sampled : 0.0,
        static_cast<long long>(sample.difficult));
  }
  std::printf("  sizes      WxHxC (records): %s\n", CommonSizes(sample.sizes).c_str());
  std::string keys;
  for (int64_t i = 0; i < records && i < 3; ++i) keys += StrCat(i ? ", " : "", reader->key(i));
  if (records > 3) keys += StrCat(", ..., ", reader->key(records - 1));
  std::printf("  keys       %s\n", keys.c_str());
}

std::string Megabytes(size_t bytes) { return StrCat(Fixed(static_cast<double>(bytes) / 1e6, 2)); }

// The activation memory plan of the config's net (engine/tensor/memory_plan.h): bytes alive while
// each layer's forward and backward run in training, and in inference, and the peaks.
std::string MemoryPlanTable(const NetSpec& spec, const RunConfig& config) {
  Net train(spec, config.seed, config.precision.compute, ConfigNetOptions(config, NetMode::kTrain));
  Net infer(spec, config.seed, config.precision.compute,
            ConfigNetOptions(config, NetMode::kInference));
  const MemoryPlan& t = train.memory_plan();
  const MemoryPlan& f = infer.memory_plan();
  size_t all = 0;  // every activation (not their gradients) alive at once
  for (size_t g = 0; g < t.group_bytes.size(); ++g) {
    if (!t.group_is_grad[g]) all += t.group_bytes[g];
  }
  // Inference has no Split layers: its layers are the training net's without them.
  std::map<std::string, size_t> infer_live;
  for (size_t i = 0; i < infer.layers().size(); ++i) {
    infer_live[infer.layers()[i]->name()] = f.live_bytes[i];
  }
  size_t name_w = 5;
  for (const auto& layer : train.layers()) name_w = std::max(name_w, layer->name().size());
  const int nw = static_cast<int>(name_w);
  std::string out = StrCat(
      "activation memory plan (MB of activations, and in training their gradients, alive while "
      "the layer runs):\n");
  char line[256];
  std::snprintf(line, sizeof line, "%-*s  %9s  %9s  %9s\n", nw, "layer", "train fwd", "train bwd",
                "inference");
  out += line;
  for (size_t i = 0; i < train.layers().size(); ++i) {
    const std::string& name = train.layers()[i]->name();
    auto it = infer_live.find(name);
    std::snprintf(line, sizeof line, "%-*s  %9s  %9s  %9s\n", nw, name.c_str(),
                  Megabytes(t.live_bytes[i]).c_str(),
                  Megabytes(t.live_bytes[static_cast<size_t>(t.steps) - 1 - i]).c_str(),
                  it == infer_live.end() ? "-" : Megabytes(it->second).c_str());
    out += line;
  }
  out += StrCat(
      "planned activation peak: training ", Megabytes(t.peak_bytes), " MB in a ",
      Megabytes(t.arena_bytes), " MB arena (activations alone, every one kept: ", Megabytes(all),
      " MB), inference ", Megabytes(f.peak_bytes), " MB in ", Megabytes(f.arena_bytes), " MB\n");
  return out;
}

}  // namespace

void AddInspectCommand(CLI::App& app) {
  struct Args {
    std::string config, checkpoint, weights, db;
    std::vector<std::string> sets;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show a config's net and data, a checkpoint's contents, or an LMDB's records");
  cmd->add_option("--config", args->config, "YAML config file: the net and the data it yields");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint file: position, stored config, tensors (a safetensors file too)");
  cmd->add_option("--weights", args->weights,
                  "Safetensors file (cortado export, PyTorch): metadata such as the builder, "
                  "tensors");
  cmd->add_option("--db", args->db, "LMDB folder: records, classes, image sizes, completeness");
  cmd->add_option("--set", args->sets, "Override a config key (with --config)");
  cmd->callback([args] {
    if (args->config.empty() && args->checkpoint.empty() && args->weights.empty() &&
        args->db.empty()) {
      UsageFail("give --config, --checkpoint, --weights and/or --db");
    }
    if (!args->config.empty()) {
      RunConfig config;
      try {
        config = LoadRunConfig(args->config, args->sets);
      } catch (const Error& e) {
        // The data may be on another machine: the net can still be shown when the config
        // says enough about it (anything else wrong with the config throws again here).
        const RunConfig without = LoadRunConfig(args->config, args->sets, /*need_train=*/true,
                                                /*check_data=*/false);
        std::string table;
        try {
          table = NetTableWithoutData(without);
        } catch (const Error&) {
          throw e;
        }
        std::printf("%snote: %s; the data summary is left out\n", table.c_str(), e.what());
        return SetExitCode(0);
      }
      std::unique_ptr<BatchSource> source = MakeTrainSource(config.data, ShardSpec{}, config.seed);
      NetSpec spec = MakeNetSpec(config, source->sample_shape(), source->num_classes(),
                                 config.data.batch_size);
      Net net(spec, config.seed, config.precision.compute,
              ConfigNetOptions(config, NetMode::kTrain));
      std::printf("%s", NetTable(net).c_str());
      std::printf("%s", LayoutSummary(config, net).c_str());
      std::printf("%s", MemoryPlanTable(spec, config).c_str());
      std::printf("%s", DataSummary(config, *source).c_str());
    }
    if (!args->checkpoint.empty()) PrintWeightsFile("--checkpoint", args->checkpoint);
    if (!args->weights.empty()) PrintWeightsFile("--weights", args->weights);
    if (!args->db.empty()) PrintDb(args->db);
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
