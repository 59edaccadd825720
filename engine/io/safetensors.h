// Safetensors files: the weights format of PyTorch's and Hugging Face's ecosystems, small
// enough to read and write here without a library (Debian packages none for C++).
//
// Layout: u64 little-endian N, then N bytes of JSON header, then the data. The header maps
// each tensor's name to {"dtype": "F32" | "F16" | "BF16" | "F64" | "I64" | ..., "shape": [...],
// "data_offsets": [begin, end]} (offsets into the data, which follows the header), plus an
// optional "__metadata__" object of string values. Tensors are row-major and little-endian.
//
// Reading checks everything before trusting it: the header length against the file size, the
// JSON, every entry's dtype, shape and offsets (inside the data, the size its shape and dtype
// need, no overlap), and throws naming the file and the entry. Writing is atomic (a temporary
// file in the same folder, renamed when complete).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/tensor/tensor.h"

namespace cortado {

// One stored tensor as raw bytes: dtype is the file's name for it ("F32", "I64", ...).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;

  // As an engine tensor (F32, F64, F16, BF16, I32, U8); throws naming `name` for others.
  Tensor ToTensor() const;
};

struct Safetensors {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> entries;  // in the order of their data in the file

  void Add(const std::string& name, const Tensor& tensor);  // copies the tensor's bytes
  void AddRaw(SafetensorsEntry entry);
  const SafetensorsEntry* Find(const std::string& name) const;
};

// The file's name for an engine dtype ("F32", ...), and the bytes per element of a file dtype
// (0 for an unknown one).
const char* SafetensorsDType(DType dtype);
size_t SafetensorsDTypeSize(const std::string& dtype);

Safetensors LoadSafetensors(const std::string& path);
// `path` names the source in errors.
Safetensors ParseSafetensors(const std::string& bytes, const std::string& path);
std::string SerializeSafetensors(const Safetensors& file);
void SaveSafetensors(const Safetensors& file, const std::string& path);

}  // namespace cortado
