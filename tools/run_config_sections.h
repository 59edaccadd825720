// The run config's sections (run_config.h), each read by one function in the file of its concern,
// beside the list of keys it reads: run_config_model.cpp (model:), run_config_data.cpp (data:,
// data.synthetic:), run_config_solver.cpp (solver:, checkpoint:, precision:) and
// run_config_distributed.cpp (distributed:). run_config.cpp declares every section against its
// list before any value is read, then calls the parse functions in order. For those files only.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "tools/run_config.h"

namespace cortado::run_config {

// Refuses `key` of section `s` with `what` (the key's place and path) unless `ok`.
inline void Require(bool ok, const YamlSection& s, const std::string& key,
                    const std::string& what) {
  if (!ok) s.Error(key, what);
}

// Each section's keys (YamlSection::Declare), and its parse function.
std::span<const std::string_view> ModelKeys();
ModelConfig ParseModel(const YamlConfig& yaml, const YamlSection& m);

std::span<const std::string_view> DataKeys();
std::span<const std::string_view> SyntheticKeys();
DataOptions ParseData(const YamlSection& d, const YamlSection& syn, bool need_train,
                      bool check_data);

std::span<const std::string_view> SolverKeys();
std::span<const std::string_view> OtherSchedulesKeys(const YamlSection& solver);
SolverConfig ParseSolver(const YamlSection& s);

std::span<const std::string_view> CheckpointKeys();
// `file`: the config's path, whose stem names the default checkpoint.dir.
CheckpointConfig ParseCheckpoint(const YamlSection& k, const std::string& file, bool epoch_based);

std::span<const std::string_view> PrecisionKeys();
PrecisionConfig ParsePrecision(const YamlSection& pr);

std::span<const std::string_view> DistributedKeys();
DistributedConfig ParseDistributed(const YamlSection& dd);

}  // namespace cortado::run_config
