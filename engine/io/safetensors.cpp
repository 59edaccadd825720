#include "engine/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/file_io.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;

// The format's own limit on the header (100 MB): a larger length is a damaged or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct FileDType {
  const char* name;
  size_t size;
  bool engine;  // has an engine DType
  DType dtype;
};
constexpr FileDType kDTypes[] = {
    {"F32", 4, true, DType::kF32},   {"F64", 8, true, DType::kF64},  {"F16", 2, true, DType::kF16},
    {"BF16", 2, true, DType::kBF16}, {"I32", 4, true, DType::kI32},  {"U8", 1, true, DType::kU8},
    {"I64", 8, false, DType::kF32},  {"I16", 2, false, DType::kF32}, {"I8", 1, false, DType::kF32},
    {"U16", 2, false, DType::kF32},  {"U32", 4, false, DType::kF32}, {"U64", 8, false, DType::kF32},
    {"BOOL", 1, false, DType::kF32}};

const FileDType* FindDType(const std::string& name) {
  for (const FileDType& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

}  // namespace

const char* SafetensorsDType(DType dtype) {
  for (const FileDType& d : kDTypes) {
    if (d.engine && d.dtype == dtype) return d.name;
  }
  Fail("dtype ", DTypeName(dtype), " has no safetensors name");
}

size_t SafetensorsDTypeSize(const std::string& dtype) {
  const FileDType* d = FindDType(dtype);
  return d ? d->size : 0;
}

Tensor SafetensorsEntry::ToTensor() const {
  const FileDType* d = FindDType(dtype);
  CORTADO_CHECK(d != nullptr && d->engine, "tensor '", name, "' is ", dtype,
                ", which Cortado does not load (F32, F64, F16, BF16, I32 and U8 it does)");
  Tensor t(Shape(shape.begin(), shape.end()), d->dtype);
  CORTADO_CHECK(t.nbytes() == bytes.size(), "tensor '", name, "': ", bytes.size(), " bytes for ",
                t.ToString());
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

void Safetensors::Add(const std::string& name, const Tensor& tensor) {
  CORTADO_CHECK(tensor.device().type == DeviceType::kCPU, "safetensors tensor '", name, "' is on ",
                tensor.device().ToString(), ": copy it to the host with To(cpu) first");
  SafetensorsEntry e;
  e.name = name;
  e.dtype = SafetensorsDType(tensor.dtype());
  e.shape.assign(tensor.shape().begin(), tensor.shape().end());
  e.bytes.assign(static_cast<const char*>(tensor.raw_data()), tensor.nbytes());
  AddRaw(std::move(e));
}

void Safetensors::AddRaw(SafetensorsEntry entry) {
  CORTADO_CHECK(!entry.name.empty() && entry.name != "__metadata__",
                "a safetensors tensor cannot be named '", entry.name, "'");
  CORTADO_CHECK(Find(entry.name) == nullptr, "tensor '", entry.name, "' added twice");
  entries.push_back(std::move(entry));
}

const SafetensorsEntry* Safetensors::Find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Safetensors ParseSafetensors(const std::string& bytes, const std::string& path) {
  auto bad = [&](auto&&... why) {
    Fail("'", path, "' is not a valid safetensors file: ", std::forward<decltype(why)>(why)...);
  };
  if (bytes.size() < 8) bad("it has ", bytes.size(), " bytes, fewer than the 8 of its header size");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  }
  if (header_bytes > kMaxHeaderBytes || header_bytes > bytes.size() - 8) {
    bad("its header claims ", header_bytes, " bytes of a ", bytes.size(), "-byte file");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_bytes);
  } catch (const nlohmann::json::exception& e) {
    bad("its header is not JSON (", e.what(), ")");
  }
  if (!header.is_object()) bad("its header is not a JSON object");
  const size_t data_begin = 8 + header_bytes;
  const uint64_t data_bytes = bytes.size() - data_begin;
  Safetensors file;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) bad("__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) bad("__metadata__ entry '", k, "' is not a string");
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets") || !value["dtype"].is_string() ||
        !value["shape"].is_array() || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2) {
      bad("tensor '", name, "' lacks a string dtype, a shape list or two data_offsets");
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = value["dtype"].get<std::string>();
    const size_t element = SafetensorsDTypeSize(e.dtype);
    if (element == 0) bad("tensor '", name, "' has the unknown dtype '", e.dtype, "'");
    // The size in bytes, checked at every product: a shape whose size wraps (2^61 F64 values
    // are 2^64 bytes, 0 in 64 bits) would match empty data_offsets.
    uint64_t count = 1, size = element;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) bad("tensor '", name, "' has a shape entry that is not a size");
      const uint64_t n = d.get<uint64_t>();
      if (n > (uint64_t{1} << 62) || __builtin_mul_overflow(count, n, &count) ||
          __builtin_mul_overflow(size, n, &size) || size > (uint64_t{1} << 62)) {
        bad("tensor '", name, "' is too large");
      }
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const auto& off = value["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      bad("tensor '", name, "' has data_offsets that are not sizes");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_bytes) {
      bad("tensor '", name, "' lies at [", begin, ", ", end, ") outside the ", data_bytes,
          " bytes of data");
    }
    if (end - begin != size) {
      bad("tensor '", name, "' has ", end - begin, " bytes for ", count, " ", e.dtype, " values");
    }
    e.bytes.assign(bytes, data_begin + begin, end - begin);
    spans.push_back({begin, end, name});
    file.entries.push_back(std::move(e));
  }
  // Entries in the order of their data; no two may share bytes.
  std::vector<size_t> order(file.entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return spans[a].begin != spans[b].begin ? spans[a].begin < spans[b].begin
                                            : spans[a].end < spans[b].end;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (spans[order[i]].begin < spans[order[i - 1]].end) {
      bad("tensors '", spans[order[i - 1]].name, "' and '", spans[order[i]].name, "' overlap");
    }
  }
  std::vector<SafetensorsEntry> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(std::move(file.entries[i]));
  file.entries = std::move(sorted);
  return file;
}

Safetensors LoadSafetensors(const std::string& path) {
  std::error_code ec;
  CORTADO_CHECK(fs::is_regular_file(path, ec), "weights file '", path,
                "' does not exist or is not a file");
  std::ifstream in(path, std::ios::binary);
  CORTADO_CHECK(in.good(), "cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  CORTADO_CHECK(!in.bad(), "reading '", path, "' failed");
  return ParseSafetensors(ss.str(), path);
}

std::string SerializeSafetensors(const Safetensors& file) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : file.metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : file.entries) {
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  // Pad the header with spaces so the data starts 8-byte aligned, as the reference writer does.
  while ((8 + text.size()) % 8 != 0) text += ' ';
  std::string out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out += text;
  for (const SafetensorsEntry& e : file.entries) out += e.bytes;
  return out;
}

void SaveSafetensors(const Safetensors& file, const std::string& path) {
  WriteFileAtomically(path, SerializeSafetensors(file));
}

}  // namespace cortado
