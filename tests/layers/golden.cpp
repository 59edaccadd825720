#include "tests/layers/golden.h"

#include <cstring>
#include <fstream>
#include <iterator>

namespace cortado::testing {
namespace {

constexpr char kMagic[8] = {'C', 'R', 'T', 'G', 'O', 'L', 'D', '\0'};
constexpr uint32_t kVersion = 1;

class Reader {
 public:
  Reader(std::string path, std::vector<char> bytes)
      : path_(std::move(path)), bytes_(std::move(bytes)) {}
  void Read(void* out, size_t n) {
    if (pos_ + n > bytes_.size()) {
      Fail(path_, ": truncated at byte ", pos_, " (wanted ", n, " more of ", bytes_.size(), ")");
    }
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
  }
  template <typename T>
  T Get() {
    T v;
    Read(&v, sizeof(T));
    return v;
  }
  std::string Str() {
    const uint32_t n = Get<uint32_t>();
    if (n > (1u << 20)) Fail(path_, ": implausible string length ", n, " at byte ", pos_);
    std::string s(n, '\0');
    Read(s.data(), n);
    return s;
  }
  size_t pos() const { return pos_; }
  bool done() const { return pos_ == bytes_.size(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<char> bytes_;
  size_t pos_ = 0;
};

}  // namespace

const Tensor& GoldenCase::Get(const std::string& key) const {
  auto it = tensors.find(key);
  if (it == tensors.end()) Fail("golden case '", name, "' has no tensor '", key, "'");
  return it->second;
}

GoldenFile ReadGoldenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    Fail("cannot open golden file ", path, " (regenerate: /usr/bin/python3 tests/make_golden.py)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Reader r(path, std::move(bytes));
  char magic[8];
  r.Read(magic, 8);
  if (std::memcmp(magic, kMagic, 8) != 0) Fail(path, ": not a Cortado golden file (bad magic)");
  GoldenFile file;
  file.version = r.Get<uint32_t>();
  if (file.version != kVersion) {
    Fail(path, ": format version ", file.version, ", this reader knows ", kVersion);
  }
  file.torch_version = r.Str();
  file.note = r.Str();
  const uint32_t num_cases = r.Get<uint32_t>();
  for (uint32_t c = 0; c < num_cases; ++c) {
    GoldenCase gc;
    gc.name = r.Str();
    gc.type = r.Str();
    gc.phase = r.Get<uint8_t>() == 0 ? Phase::kTrain : Phase::kTest;
    const uint32_t num_settings = r.Get<uint32_t>();
    for (uint32_t s = 0; s < num_settings; ++s) {
      const std::string key = r.Str();
      const uint8_t is_list = r.Get<uint8_t>();
      const uint32_t count = r.Get<uint32_t>();
      std::vector<std::string> items;
      for (uint32_t i = 0; i < count; ++i) items.push_back(r.Str());
      if (is_list) {
        gc.settings.SetList(key, items);
      } else {
        if (items.size() != 1)
          Fail(path, ": case '", gc.name, "' scalar setting '", key, "' has ", items.size(),
               " items");
        gc.settings.Set(key, items[0]);
      }
    }
    const uint32_t num_tensors = r.Get<uint32_t>();
    for (uint32_t t = 0; t < num_tensors; ++t) {
      const std::string name = r.Str();
      const uint8_t code = r.Get<uint8_t>();
      if (code != static_cast<uint8_t>(DType::kF32) && code != static_cast<uint8_t>(DType::kF64) &&
          code != static_cast<uint8_t>(DType::kI32)) {
        Fail(path, ": case '", gc.name, "' tensor '", name, "' has unknown dtype code ", int{code});
      }
      const uint32_t ndim = r.Get<uint32_t>();
      if (ndim > 8) Fail(path, ": case '", gc.name, "' tensor '", name, "' has ", ndim, " dims");
      Shape shape(ndim);
      for (uint32_t d = 0; d < ndim; ++d) shape[d] = r.Get<int64_t>();
      Tensor tensor(shape, static_cast<DType>(code));
      r.Read(tensor.raw_data(), tensor.nbytes());
      gc.tensors[name] = tensor;
    }
    file.cases.push_back(std::move(gc));
  }
  if (!r.done()) Fail(path, ": ", "trailing bytes after the last case at byte ", r.pos());
  return file;
}

}  // namespace cortado::testing
