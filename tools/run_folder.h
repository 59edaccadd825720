// A run folder (checkpoint.dir, and the --metrics file) belongs to one run. Every checkpoint
// carries its run's id; a fresh start refuses a folder that holds another run's checkpoints
// or a metrics file with records in it, unless told to start over (--overwrite), so a second
// run cannot replace or prune the first one's work; a resumed run refuses a folder shared with
// another run's checkpoints; and `checkpoint.keep` prunes only the run's own files
// (engine/io/checkpoint.h).
#pragma once

#include <filesystem>
#include <string>

namespace cortado::tools {

struct RunFolder {
  std::string checkpoint_dir;
  std::string metrics_path;  // "" for none
  std::string config_yaml;   // this run's resolved config, to say how an earlier run differs
  bool overwrite = false;    // --overwrite: start over, deleting what an earlier run left
};

// A new run's id: 16 hex digits from the clock, the process and the system's entropy.
std::string NewRunId();

// Checks before training that the run may use the folder: it can be written (a probe file),
// and, on a fresh start (`continuing` false: no --resume), that it holds no checkpoint and
// the metrics file no record of an earlier run, unless folder.overwrite; when continuing, that
// no checkpoint of a run other than run_id is there. Throws one line naming the folder or file
// and the ways on.
void CheckRunFolder(const RunFolder& folder, bool continuing, const std::string& run_id);

// For --overwrite: deletes every checkpoint in the folder and returns how many there were (the
// metrics file is truncated when it is opened).
int ClearRunFolder(const RunFolder& folder);

// The first folder of `dir`'s chain that does not exist yet ("" when all do): what a probe
// that creates `dir` must remove again.
std::filesystem::path FirstMissing(const std::filesystem::path& dir);

// How many checkpoint files the folder holds.
int CountCheckpoints(const std::string& dir);

}  // namespace cortado::tools
