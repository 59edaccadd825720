// Checkpoints: one file holding named tensors (weights, batch-norm statistics, momentum) and
// string metadata (iteration, epoch, data position, the resolved config).
//
// File layout (little-endian):
//   "CRTDCKPT"  u32 format_version  u32 crc32(payload)  u64 payload_bytes  payload
//   payload:    u32 n_meta  { str key, str value }*  u32 n_tensors  { str name, u8 dtype,
//               u32 ndim, i64 dims[ndim], bytes data }*           (str = u64 length + bytes)
// Writes are atomic: a temporary file in the same folder, fsync, rename, fsync of the folder,
// so a crash leaves either the old or the new checkpoint, never half of one. Reads check the
// magic, version, size and CRC before parsing anything.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor/tensor.h"

namespace cortado {

constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  std::map<std::string, std::string> meta;
  std::vector<std::pair<std::string, Tensor>> tensors;

  // Checkpoints are device-independent: a tensor on a device is added as its host copy.
  void Add(const std::string& name, const Tensor& t) {
    tensors.emplace_back(name, t.To(Device::CPU()));
  }
  // The tensor named `name`, or nullptr.
  const Tensor* Find(const std::string& name) const;
  const std::string& Meta(const std::string& key) const;  // throws when absent
  // The entry as an integer; throws naming the file (`path`, when given) and the key when it is
  // absent or not an integer.
  int64_t MetaInt(const std::string& key, const std::string& path = "") const;
};

void SaveCheckpoint(const Checkpoint& checkpoint, const std::string& path);
// Fault injection for tests: called by SaveCheckpoint before each piece it writes ("write",
// offset into the file), before the fsync ("fsync"), before the rename ("rename") and after
// it ("renamed"); a non-zero return fails that step with that errno (ENOSPC, EIO). A test may
// also kill its process from here. Empty function: none.
using CheckpointWriteHook = std::function<int(const char* stage, size_t offset)>;
void SetCheckpointWriteHookForTesting(CheckpointWriteHook hook);
// Which tensors (by name) a load materialises; the others are passed over in the file.
using CheckpointFilter = std::function<bool(const std::string& name)>;
// Throws naming the file and what is wrong (not a checkpoint, truncated, CRC mismatch, ...).
// The file is read piece by piece (its CRC first, then its records straight into their
// tensors), never held whole in memory. With `keep`, only the tensors it accepts are loaded:
// an inference net takes the weights and statistics (Net::IsNetState) and no solver state.
Checkpoint LoadCheckpoint(const std::string& path, const CheckpointFilter& keep = {});
// The file's bytes, and back (`path` names the source in errors): data-parallel ranks receive
// rank 0's state this way.
std::string SerializeCheckpoint(const Checkpoint& checkpoint);
Checkpoint ParseCheckpoint(const std::string& bytes, const std::string& path);

// An object that keeps part of the training state in checkpoints under names of its own
// ("param/<name>", "momentum/<name>", meta keys): each saves and loads itself, so the schema
// is not written in one place and read in another.
class CheckpointState {
 public:
  virtual ~CheckpointState() = default;
  virtual void SaveState(Checkpoint& checkpoint) const = 0;
  // Throws naming `path` and the first entry that is missing or does not fit.
  virtual void LoadState(const Checkpoint& checkpoint, const std::string& path) = 0;
};

// Checkpoint files in dir, named by CheckpointFileName, newest (highest iteration, as a number)
// first; other files are not listed.
std::vector<std::string> ListCheckpoints(const std::string& dir);
std::string CheckpointFileName(int64_t iteration);  // "ckpt-00001234.cortado"
// The newest checkpoint in dir that loads (corrupt or truncated ones are skipped with a
// warning), into *checkpoint; "" when there is none. What `--resume auto` resumes from.
std::string NewestLoadableCheckpoint(const std::string& dir, Checkpoint* checkpoint,
                                     const CheckpointFilter& keep = {});
// The metadata alone, read from the front of the file without loading the tensors (so
// without the CRC check of the whole payload): which run and config a file belongs to. Throws
// as LoadCheckpoint does when the header or the metadata is damaged.
std::map<std::string, std::string> ReadCheckpointMeta(const std::string& path);
// Deletes all but the newest `keep` of the checkpoints in dir whose "run_id" entry is run_id
// (another run's files, and files whose metadata cannot be read, are never touched).
void PruneCheckpoints(const std::string& dir, int keep, const std::string& run_id);

}  // namespace cortado
