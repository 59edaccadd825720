// `cortado inspect --config F [--set k=v]...` prints the net a config builds (layers, output
// shapes, parameter counts) and what its data yields (records, and the samples an epoch is
// made of, and the activation memory plan: MB alive at each layer in training and inference;
// where the data is not on this machine, the net from the config alone and a note);
// `--checkpoint PATH` a checkpoint's position, its stored config and a table of its tensors; `--db
// PATH` an LMDB of Datum records: record count, classes, the image sizes seen in a sample of
// records, a few keys, and whether it is complete (data/lmdb.h). They combine.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "data/datum.h"
#include "data/jpeg.h"
#include "data/lmdb.h"
#include "data/lmdb_source.h"
#include "engine/checkpoint.h"
#include "engine/log.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/metrics.h"
#include "tools/trainer.h"

namespace cortado::tools {
namespace {

// Records whose sizes `--db` reads, spread evenly over the database.
constexpr int64_t kSampledRecords = 200;

void PrintCheckpoint(const std::string& path) {
  CheckInputFile("--checkpoint", path, "a checkpoint file (ckpt-*.cortado)");
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
  size_t name_w = 4, shape_w = 5;
  for (const auto& [name, t] : ckpt.tensors) {
    name_w = std::max(name_w, name.size());
    shape_w = std::max(shape_w, ShapeString(t.shape()).size());
  }
  const int nw = static_cast<int>(name_w), sw = static_cast<int>(shape_w);
  std::printf("%-*s  %-*s  %-5s  %s\n", nw, "name", sw, "shape", "dtype", "values");
  int64_t total = 0;
  for (const auto& [name, t] : ckpt.tensors) {
    total += t.numel();
    std::printf("%-*s  %-*s  %-5s  %lld\n", nw, name.c_str(), sw, ShapeString(t.shape()).c_str(),
                DTypeName(t.dtype()), static_cast<long long>(t.numel()));
  }
  std::printf("%zu tensors, %lld values\n", ckpt.tensors.size(), static_cast<long long>(total));
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
  // Completeness, as the training sources check it.
  std::string complete;
  try {
    const std::optional<LmdbCompletion> done = ReadLmdbCompletion(path);
    CheckLmdbComplete(path, records);
    complete = done ? StrCat("yes (", kLmdbCompleteFile, ": ", done->records, " records, ",
                             done->skipped, " skipped inputs, converted from ",
                             done->root.empty() ? "?" : done->root, ")")
                    : StrCat("unknown: no ", kLmdbCompleteFile,
                             " and no classes.txt (another tool's database)");
  } catch (const Error& e) {
    complete = StrCat("NO: ", e.what());
  }
  std::printf("  complete   %s\n", complete.c_str());
  // Sizes and labels over an even sample of the records.
  const int64_t sample = std::min(records, kSampledRecords);
  std::map<std::string, int64_t> sizes;
  std::map<int, int64_t> labels;
  int64_t encoded = 0, raw = 0, unreadable = 0;
  DatumParser parser;
  JpegDecoder jpeg;
  LmdbReader::ReadTxn txn = reader->BeginRead();
  for (int64_t s = 0; s < sample; ++s) {
    const int64_t i = sample > 1 ? s * (records - 1) / (sample - 1) : 0;
    const std::string_view value = txn.Get(i);
    if (!parser.Parse(value.data(), value.size())) {
      ++unreadable;
      continue;
    }
    const DatumFields& f = parser.fields();
    ++labels[f.label];
    int w = f.width, h = f.height, c = f.channels;
    if (f.encoded) {
      ++encoded;
      JpegHeader header;
      const std::string_view data = parser.data();
      if (jpeg.Open(reinterpret_cast<const uint8_t*>(data.data()), data.size(), &header)) {
        w = header.width;
        h = header.height;
        c = header.components;
      } else {
        ++unreadable;
        continue;
      }
    } else {
      ++raw;
    }
    ++sizes[StrCat(w, "x", h, "x", c)];
  }
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [size, n] : sizes) by_count.emplace_back(n, size);
  std::sort(by_count.rbegin(), by_count.rend());
  std::string seen;
  for (size_t i = 0; i < by_count.size() && i < 6; ++i) {
    seen += StrCat(i ? ", " : "", by_count[i].second, " (", by_count[i].first, ")");
  }
  if (by_count.size() > 6) seen += StrCat(", and ", by_count.size() - 6, " other sizes");
  std::printf(
      "  sampled    %lld of %lld records: %lld encoded (JPEG), %lld raw, %lld unreadable; "
      "%zu distinct labels\n",
      static_cast<long long>(sample), static_cast<long long>(records),
      static_cast<long long>(encoded), static_cast<long long>(raw),
      static_cast<long long>(unreadable), labels.size());
  std::printf("  sizes      WxHxC (records): %s\n", seen.empty() ? "-" : seen.c_str());
  std::string keys;
  for (int64_t i = 0; i < records && i < 3; ++i) keys += StrCat(i ? ", " : "", reader->key(i));
  if (records > 3) keys += StrCat(", ..., ", reader->key(records - 1));
  std::printf("  keys       %s\n", keys.c_str());
}

std::string Megabytes(size_t bytes) { return StrCat(Fixed(static_cast<double>(bytes) / 1e6, 2)); }

// The activation memory plan of the config's net (engine/memory_plan.h): bytes alive while each
// layer's forward and backward run in training, and in inference, and the peaks.
std::string MemoryPlanTable(const NetSpec& spec, const RunConfig& config) {
  NetOptions train_options, infer_options;
  train_options.plan_memory = true;
  infer_options.mode = NetMode::kInference;
  Net train(spec, config.seed, config.precision.compute, train_options);
  Net infer(spec, config.seed, config.precision.compute, infer_options);
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
    std::string config, checkpoint, db;
    std::vector<std::string> sets;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show a config's net and data, a checkpoint's contents, or an LMDB's records");
  cmd->add_option("--config", args->config, "YAML config file: the net and the data it yields");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint file: position, stored config, tensors");
  cmd->add_option("--db", args->db, "LMDB folder: records, classes, image sizes, completeness");
  cmd->add_option("--set", args->sets, "Override a config key (with --config)");
  cmd->callback([args] {
    if (args->config.empty() && args->checkpoint.empty() && args->db.empty()) {
      UsageFail("give --config, --checkpoint and/or --db");
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
      Net net(spec, config.seed, config.precision.compute);
      std::printf("%s", NetTable(net).c_str());
      std::printf("%s", MemoryPlanTable(spec, config).c_str());
      std::printf("%s", DataSummary(config, *source).c_str());
    }
    if (!args->checkpoint.empty()) PrintCheckpoint(args->checkpoint);
    if (!args->db.empty()) PrintDb(args->db);
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
