#include "tools/run_folder.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/base/error.h"
#include "engine/io/checkpoint.h"
#include "engine/io/yaml_config.h"

namespace cortado::tools {
namespace fs = std::filesystem;
namespace {

std::string FileName(const std::string& path) { return fs::path(path).filename().string(); }

// "the same config" or "a config that differs in solver.base_lr, seed", for the message that
// refuses a fresh start.
std::string HowConfigDiffers(const std::map<std::string, std::string>& meta,
                             const std::string& config_yaml) {
  auto it = meta.find("config");
  if (it == meta.end() || config_yaml.empty()) return "";
  std::vector<std::string> changes;
  try {
    changes = YamlDifferences(it->second, config_yaml);
  } catch (const Error&) {
    return "";
  }
  if (changes.empty()) return ", the same config as this run";
  std::string keys;
  for (size_t i = 0; i < changes.size() && i < 4; ++i) {
    keys += (i ? ", " : "") + changes[i].substr(0, changes[i].find(':'));
  }
  if (changes.size() > 4) keys += StrCat(" and ", changes.size() - 4, " more");
  return StrCat(", a config that differs in ", keys);
}

// Creates a file in dir and removes it again, with any folder it had to create (the first
// checkpoint creates them for good): an unwritable folder stops the run at its start, not at
// its first checkpoint an epoch later.
void ProbeWritable(const std::string& dir) {
  const fs::path created = FirstMissing(fs::absolute(dir));
  std::error_code ec;
  fs::create_directories(dir, ec);
  CORTADO_CHECK(!ec, "checkpoint.dir '", dir, "': cannot create the folder: ", ec.message());
  const fs::path probe = fs::path(dir) / StrCat(".cortado-probe-", ::getpid());
  std::ofstream out(probe);
  const bool ok = out.good() && (out << "probe").flush().good();
  const int err = errno;
  out.close();
  fs::remove(probe, ec);
  if (!created.empty()) fs::remove_all(created, ec);
  CORTADO_CHECK(ok, "checkpoint.dir '", dir, "': cannot write in the folder (", std::strerror(err),
                "); checkpoints could not be saved");
}

}  // namespace

// The first folder of `dir`'s chain that does not exist yet ("" when all do).
fs::path FirstMissing(const fs::path& dir) {
  fs::path missing;
  std::error_code ec;
  for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) break;
    missing = p;
    if (p == p.parent_path()) break;
  }
  return missing;
}

std::string NewRunId() {
  std::random_device entropy;
  const uint64_t now =
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  std::mt19937_64 mix(now ^ (static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^
                      static_cast<uint64_t>(::getpid()));
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(mix()));
  return buf;
}

int CountCheckpoints(const std::string& dir) {
  return static_cast<int>(ListCheckpoints(dir).size());
}

void CheckRunFolder(const RunFolder& folder, bool continuing, const std::string& run_id) {
  ProbeWritable(folder.checkpoint_dir);
  const std::vector<std::string> files = ListCheckpoints(folder.checkpoint_dir);
  if (continuing) {
    for (const std::string& path : files) {
      std::map<std::string, std::string> meta;
      try {
        meta = ReadCheckpointMeta(path);
      } catch (const Error&) {
        continue;  // damaged: --resume auto skips it with a warning; nobody's to protect
      }
      auto it = meta.find("run_id");
      if (it == meta.end() || it->second == run_id) continue;
      Fail("checkpoint.dir '", folder.checkpoint_dir, "' also holds checkpoints of another run (",
           FileName(path), ", run ", it->second, "; this run is ", run_id.empty() ? "?" : run_id,
           "): move them away, or continue in another folder with --set checkpoint.dir=DIR");
    }
    return;
  }
  if (folder.overwrite) return;
  if (!files.empty()) {
    std::string about;
    try {
      const auto meta = ReadCheckpointMeta(files.front());
      about = StrCat("; the newest, ", FileName(files.front()), ", is at iteration ",
                     meta.count("iteration") ? meta.at("iteration") : "?",
                     HowConfigDiffers(meta, folder.config_yaml));
    } catch (const Error&) {
      about = StrCat("; the newest, ", FileName(files.front()), ", is damaged");
    }
    Fail("checkpoint.dir '", folder.checkpoint_dir, "' holds ", files.size(),
         " checkpoint(s) of an earlier run", about,
         ". Continue that run with --resume auto, or start over with --overwrite (which deletes "
         "them)");
  }
  if (!folder.metrics_path.empty()) {
    std::error_code ec;
    const auto size = fs::file_size(folder.metrics_path, ec);
    CORTADO_CHECK(ec || size == 0, "--metrics '", folder.metrics_path, "' already holds ", size,
                  " bytes of an earlier run's records. Continue that run with --resume "
                  "auto (which appends), write to another file, or start over with --overwrite "
                  "(which empties it)");
  }
}

int ClearRunFolder(const RunFolder& folder) {
  int removed = 0;
  for (const std::string& path : ListCheckpoints(folder.checkpoint_dir)) {
    std::error_code ec;
    fs::remove(path, ec);
    CORTADO_CHECK(!ec, "--overwrite: cannot delete '", path, "': ", ec.message());
    ++removed;
  }
  return removed;
}

}  // namespace cortado::tools
