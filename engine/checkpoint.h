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
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace cortado {

constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  std::map<std::string, std::string> meta;
  std::vector<std::pair<std::string, Tensor>> tensors;

  void Add(const std::string& name, const Tensor& t) { tensors.emplace_back(name, t); }
  // The tensor named `name`, or nullptr.
  const Tensor* Find(const std::string& name) const;
  const std::string& Meta(const std::string& key) const;  // throws when absent
  int64_t MetaInt(const std::string& key) const;
};

void SaveCheckpoint(const Checkpoint& checkpoint, const std::string& path);
// Throws naming the file and what is wrong (not a checkpoint, truncated, CRC mismatch, ...).
Checkpoint LoadCheckpoint(const std::string& path);

// Checkpoint files in dir, named by CheckpointFileName, newest (highest iteration) first.
std::vector<std::string> ListCheckpoints(const std::string& dir);
std::string CheckpointFileName(int64_t iteration);  // "ckpt-00001234.cortado"
// Deletes all but the newest `keep` checkpoints in dir.
void PruneCheckpoints(const std::string& dir, int keep);

}  // namespace cortado
