// RunConfig (run_config.h): reading the file (LoadRunConfig), declaring every section against its
// keys before any value is read, and ParseRunConfig, which reads the sections in order (each in
// its own file, run_config_sections.h) and checks what spans two of them.
#include "tools/run_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string_view>

#include "engine/base/error.h"
#include "engine/tensor/device_runtime.h"
#include "tools/run_config_sections.h"

namespace cortado {

RunConfig LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                        bool need_train, bool check_data) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  CORTADO_CHECK(fs::exists(st), "config file '", path, "' does not exist");
  if (fs::is_directory(st)) {
    std::vector<std::string> yamls;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string ext = e.path().extension().string();
      if (ext == ".yaml" || ext == ".yml") yamls.push_back(e.path().string());
    }
    std::sort(yamls.begin(), yamls.end());
    std::string some;
    for (size_t i = 0; i < yamls.size() && i < 3; ++i) some += (i ? ", " : "") + yamls[i];
    Fail("config '", path, "' is a folder; expected a YAML config file",
         some.empty() ? std::string() : " such as " + some);
  }
  std::ifstream in(path);
  CORTADO_CHECK(in.good(), "cannot open config file '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  // Nothing but blank lines and comments: an empty config would fail on its first required
  // key, which says nothing about the real mistake (a wrong path).
  bool content = false;
  std::istringstream lines(text.str());
  for (std::string line; !content && std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t\r");
    content =
        first != std::string::npos && line[first] != '#' && line.compare(first, 3, "---") != 0;
  }
  CORTADO_CHECK(content, "config file '", path,
                "' is empty; expected a YAML mapping with model, "
                "data and solver sections (see configs/)");
  YamlConfig yaml = YamlConfig::FromString(text.str(), path);
  for (const std::string& o : overrides) yaml.Set(o);
  return ParseRunConfig(yaml, need_train, check_data);
}

namespace {

using run_config::Require;

// Every section's keys, beside the function that reads them. Declare() checks the whole file
// against these lists before any value is read, so a misspelled key (max_iters, trian, buildr,
// a top-level solvr) is named as unknown with the closest key instead of being reported as the
// required key it was meant to be; a getter on a key missing from its list is an internal
// error, so the lists cannot drift from the getters.
constexpr std::string_view kTopKeys[] = {"seed",        "model",     "data", "solver", "checkpoint",
                                         "distributed", "precision", "log",  "device"};

// The document's sections, each declared (checked against its key list) before any is read.
struct Sections {
  YamlSection root, model, data, synthetic, solver, checkpoint, distributed, precision, log;
};

constexpr std::string_view kLogKeys[] = {"interval"};

// The root and every section, each checked against its key list: an unknown key anywhere in
// the file stops here, before any value is read.
Sections DeclareSections(const YamlConfig& yaml) {
  YamlSection root = yaml.Root();
  root.Declare(kTopKeys);
  auto declared = [](YamlSection section, std::span<const std::string_view> keys) {
    section.Declare(keys);
    return section;
  };
  // Each Section() call asks the parent about the key, so the parents are copied last.
  YamlSection model = declared(root.Section("model"), run_config::ModelKeys());
  YamlSection data = declared(root.Section("data"), run_config::DataKeys());
  YamlSection synthetic = declared(data.Section("synthetic"), run_config::SyntheticKeys());
  YamlSection solver = root.Section("solver");
  solver.Declare(run_config::SolverKeys(), run_config::OtherSchedulesKeys(solver));
  YamlSection checkpoint = declared(root.Section("checkpoint"), run_config::CheckpointKeys());
  YamlSection distributed = declared(root.Section("distributed"), run_config::DistributedKeys());
  YamlSection precision = declared(root.Section("precision"), run_config::PrecisionKeys());
  YamlSection log = declared(root.Section("log"), kLogKeys);
  return Sections{root, model, data, synthetic, solver, checkpoint, distributed, precision, log};
}

}  // namespace

RunConfig ParseRunConfig(YamlConfig& yaml, bool need_train, bool check_data) {
  const Sections s = DeclareSections(yaml);
  RunConfig c;
  c.file = yaml.file();
  const int64_t seed = s.root.Int("seed", 1);
  Require(seed >= 0, s.root, "seed", "must be >= 0");
  c.seed = static_cast<uint64_t>(seed);
  c.model = run_config::ParseModel(yaml, s.model);
  c.data = run_config::ParseData(s.data, s.synthetic, need_train, check_data);
  c.solver = run_config::ParseSolver(s.solver);
  c.checkpoint = run_config::ParseCheckpoint(s.checkpoint, c.file, c.solver.epoch_based);
  c.distributed = run_config::ParseDistributed(s.distributed);
  c.precision = run_config::ParsePrecision(s.precision);
  if (c.precision.compute == DType::kF64 && c.distributed.codec.codec != "f32") {
    s.distributed.Error("codec",
                        "the gradient codecs compress f32 gradients; precision.compute "
                        "is fp64 (use distributed.codec: f32 with it)");
  }
  const std::string device = s.root.String("device", "cpu");
  try {
    c.device = ParseDevice(device);
  } catch (const Error& e) {
    s.root.Error("device", e.what());
  }
  std::string why;
  if (!DeviceUsable(c.device, &why)) {
    s.root.Error("device", StrCat("cannot use ", c.device.ToString(), ": ", why));
  }
  c.log_interval = s.log.Int("interval", 50);
  Require(c.log_interval >= 1, s.log, "interval", "must be >= 1");
  for (const YamlSection* section : {&s.model, &s.data, &s.synthetic, &s.solver, &s.checkpoint,
                                     &s.distributed, &s.precision, &s.log, &s.root}) {
    section->Finish();
  }
  c.resolved_yaml = yaml.Resolved();
  return c;
}

}  // namespace cortado
