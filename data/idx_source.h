// IDX files (the MNIST / Fashion-MNIST format): an images file (magic 0x803, u8 [N, H, W])
// and its labels file (magic 0x801, u8 [N]), optionally gzip-compressed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/data_options.h"

namespace cortado {

struct IdxDataset {
  int64_t count = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;  // count * height * width
  std::vector<uint8_t> labels;  // count
};

// The labels file that goes with an images file: "...-images-idx3-ubyte[.gz]" becomes
// "...-labels-idx1-ubyte[.gz]".
std::string IdxLabelsPathFor(const std::string& images_path);
// Reads both files; throws naming the file for a missing file, a bad magic or a short read.
IdxDataset ReadIdxDataset(const std::string& images_path);
// The same from the files' (decompressed) bytes; the paths name them in errors.
IdxDataset ParseIdxDataset(const std::vector<uint8_t>& images, const std::vector<uint8_t>& labels,
                           const std::string& images_path, const std::string& labels_path);

std::unique_ptr<BatchSource> MakeIdxTrainSource(const DataOptions& options, ShardSpec shard,
                                                uint64_t seed);
std::unique_ptr<BatchSource> MakeIdxEvalSource(const DataOptions& options, ShardSpec shard);

}  // namespace cortado
