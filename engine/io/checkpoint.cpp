#include "engine/io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/base/numbers.h"

namespace cortado {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'C', 'R', 'T', 'D', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;

void PutBytes(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}
template <typename T>
void Put(std::string& out, T v) {
  PutBytes(out, &v, sizeof(T));
}
void PutString(std::string& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out += s;
}

// Bounds-checked reader over the payload, held in memory (from `begin` of a string) or read
// from a file as it goes; every overrun is a "truncated or corrupt" error.
class Reader {
 public:
  Reader(const std::string& data, const std::string& path, size_t begin = 0)
      : data_(&data), path_(path), pos_(begin), end_(data.size()) {}
  // The `size` bytes from the stream's position.
  Reader(std::istream& in, uint64_t size, const std::string& path)
      : in_(&in), path_(path), end_(size) {}
  void Bytes(void* out, size_t n) {
    CORTADO_CHECK(n <= Remaining(), "checkpoint '", path_, "' is corrupt (record past end)");
    if (in_ != nullptr) {
      in_->read(static_cast<char*>(out), static_cast<std::streamsize>(n));
      CORTADO_CHECK(in_->gcount() == static_cast<std::streamsize>(n), "cannot read checkpoint '",
                    path_, "' (it changed or shrank while being read)");
    } else {
      std::memcpy(out, data_->data() + pos_, n);
    }
    pos_ += n;
  }
  // Passes over n bytes without reading them.
  void Skip(size_t n) {
    CORTADO_CHECK(n <= Remaining(), "checkpoint '", path_, "' is corrupt (record past end)");
    if (in_ != nullptr) in_->seekg(static_cast<std::streamoff>(n), std::ios::cur);
    pos_ += n;
  }
  template <typename T>
  T Get() {
    T v;
    Bytes(&v, sizeof(T));
    return v;
  }
  std::string String() {
    uint64_t n = Get<uint64_t>();
    CORTADO_CHECK(n <= Remaining(), "checkpoint '", path_, "' is corrupt (string past end)");
    std::string s(n, '\0');
    Bytes(s.data(), n);
    return s;
  }
  bool AtEnd() const { return pos_ == end_; }
  size_t Remaining() const { return end_ - pos_; }

 private:
  const std::string* data_ = nullptr;
  std::istream* in_ = nullptr;
  const std::string& path_;
  size_t pos_ = 0, end_ = 0;
};

// The metadata and tensors of a payload; tensors `keep` refuses (when given) are skipped.
Checkpoint ParsePayload(Reader& r, const std::string& path, const CheckpointFilter& keep) {
  Checkpoint ckpt;
  uint32_t n_meta = r.Get<uint32_t>();
  for (uint32_t i = 0; i < n_meta; ++i) {
    std::string k = r.String();
    ckpt.meta[k] = r.String();
  }
  uint32_t n_tensors = r.Get<uint32_t>();
  for (uint32_t i = 0; i < n_tensors; ++i) {
    std::string name = r.String();
    uint8_t dtype = r.Get<uint8_t>();
    CORTADO_CHECK(dtype <= static_cast<uint8_t>(DType::kU8), "checkpoint '", path, "': tensor '",
                  name, "' has unknown dtype ", int{dtype});
    uint32_t ndim = r.Get<uint32_t>();
    CORTADO_CHECK(ndim <= 8, "checkpoint '", path, "': tensor '", name, "' has ", ndim, " dims");
    Shape shape(ndim);
    for (auto& d : shape) {
      d = r.Get<int64_t>();
      CORTADO_CHECK(d >= 0 && d < (int64_t{1} << 40), "checkpoint '", path, "': tensor '", name,
                    "' has a bad dimension");
    }
    // The declared size must fit in what is left before anything is allocated: a damaged
    // shape must not ask for terabytes.
    uint64_t bytes = DTypeSize(static_cast<DType>(dtype));
    for (int64_t d : shape) {
      CORTADO_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
                    "checkpoint '", path, "': tensor '", name, "' has an impossible shape");
    }
    CORTADO_CHECK(bytes <= r.Remaining(), "checkpoint '", path, "' is corrupt: tensor '", name,
                  "' declares ", bytes, " bytes, ", r.Remaining(), " are left");
    if (keep && !keep(name)) {
      r.Skip(bytes);
      continue;
    }
    Tensor t(shape, static_cast<DType>(dtype));
    r.Bytes(t.raw_data(), t.nbytes());
    ckpt.Add(name, t);
  }
  CORTADO_CHECK(r.AtEnd(), "checkpoint '", path, "' has trailing bytes");
  return ckpt;
}

// The header's version and payload size, checked: magic, version, and (given the file's size)
// that the payload is all there.
void CheckHeader(const char* header, size_t file_bytes, const std::string& path, uint32_t* crc,
                 uint64_t* size) {
  CORTADO_CHECK(file_bytes >= kHeaderBytes && std::memcmp(header, kMagic, 8) == 0, "'", path,
                "' is not a Cortado checkpoint (bad magic or too short)");
  uint32_t version;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(crc, header + 12, 4);
  std::memcpy(size, header + 16, 8);
  CORTADO_CHECK(version == kCheckpointVersion, "checkpoint '", path, "' has format version ",
                version, "; this build reads version ", kCheckpointVersion);
  CORTADO_CHECK(*size == file_bytes - kHeaderBytes, "checkpoint '", path, "' is truncated (",
                file_bytes - kHeaderBytes, " of ", *size, " payload bytes)");
}

CheckpointWriteHook g_write_hook;

// The fault a test injects at this point (0: none); errno is set to it.
bool Injected(const char* stage, size_t offset) {
  if (!g_write_hook) return false;
  const int err = g_write_hook(stage, offset);
  if (err == 0) return false;
  errno = err;
  return true;
}

// In pieces of at most 8 MiB, so that a fault can be injected between them.
void WriteAll(int fd, const std::string& data, const std::string& path) {
  constexpr size_t kPiece = size_t{8} << 20;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = Injected("write", done)
                    ? -1
                    : ::write(fd, data.data() + done, std::min(kPiece, data.size() - done));
    if (n < 0 && errno == EINTR) continue;
    CORTADO_CHECK(n > 0, "writing checkpoint '", path, "': ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void SetCheckpointWriteHookForTesting(CheckpointWriteHook hook) { g_write_hook = std::move(hook); }

std::string NewestLoadableCheckpoint(const std::string& dir, Checkpoint* checkpoint,
                                     const CheckpointFilter& keep) {
  for (const std::string& candidate : ListCheckpoints(dir)) {
    try {
      *checkpoint = LoadCheckpoint(candidate, keep);
      return candidate;
    } catch (const Error& e) {
      LogWarning("skipping unusable checkpoint: ", e.what());
    }
  }
  return "";
}

const Tensor* Checkpoint::Find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

const std::string& Checkpoint::Meta(const std::string& key) const {
  auto it = meta.find(key);
  CORTADO_CHECK(it != meta.end(), "checkpoint has no '", key, "' entry");
  return it->second;
}

int64_t Checkpoint::MetaInt(const std::string& key, const std::string& path) const {
  const std::string file = path.empty() ? "checkpoint" : StrCat("checkpoint '", path, "'");
  auto it = meta.find(key);
  CORTADO_CHECK(it != meta.end(), file, " has no '", key, "' entry");
  int64_t x = 0;
  if (ParseInt64(it->second, &x)) return x;
  Fail(file, ": entry '", key, "' is not an integer: '", it->second.substr(0, 40), "'");
}

std::string SerializeCheckpoint(const Checkpoint& checkpoint) {
  std::string payload;
  Put<uint32_t>(payload, static_cast<uint32_t>(checkpoint.meta.size()));
  for (const auto& [k, v] : checkpoint.meta) {
    PutString(payload, k);
    PutString(payload, v);
  }
  Put<uint32_t>(payload, static_cast<uint32_t>(checkpoint.tensors.size()));
  for (const auto& [name, t] : checkpoint.tensors) {
    CORTADO_CHECK(t.device() == Device::CPU(), "checkpoint tensor '", name, "' is on ",
                  t.device().ToString(), ": checkpoints hold host copies (To(cpu))");
    PutString(payload, name);
    Put<uint8_t>(payload, static_cast<uint8_t>(t.dtype()));
    Put<uint32_t>(payload, static_cast<uint32_t>(t.ndim()));
    for (int64_t d : t.shape()) Put<int64_t>(payload, d);
    PutBytes(payload, t.raw_data(), t.nbytes());
  }
  std::string file;
  file.reserve(kHeaderBytes + payload.size());
  PutBytes(file, kMagic, 8);
  Put<uint32_t>(file, kCheckpointVersion);
  uLong crc = crc32_z(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size());
  Put<uint32_t>(file, static_cast<uint32_t>(crc));
  Put<uint64_t>(file, payload.size());
  file += payload;
  return file;
}

void SaveCheckpoint(const Checkpoint& checkpoint, const std::string& path) {
  const std::string file = SerializeCheckpoint(checkpoint);
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  CORTADO_CHECK(!ec, "cannot create checkpoint folder '", dir.string(), "': ", ec.message());
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp")).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CORTADO_CHECK(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
  try {
    WriteAll(fd, file, tmp);
    CORTADO_CHECK(!Injected("fsync", file.size()) && ::fsync(fd) == 0, "writing checkpoint '", tmp,
                  "': fsync: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (Injected("rename", file.size()) || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    Fail("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  Injected("renamed", file.size());
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
}

Checkpoint LoadCheckpoint(const std::string& path, const CheckpointFilter& keep) {
  // Read in two passes, never the whole file at once: the CRC over the payload in pieces, then
  // the records, straight into their tensors (those `keep` refuses are passed over unread).
  std::ifstream in(path, std::ios::binary);
  CORTADO_CHECK(in.good(), "cannot open checkpoint '", path, "'");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  CORTADO_CHECK(end >= 0, "cannot read checkpoint '", path, "'");
  const size_t file_bytes = static_cast<size_t>(end);
  char header[kHeaderBytes] = {};
  in.seekg(0);
  in.read(header, static_cast<std::streamsize>(std::min(file_bytes, kHeaderBytes)));
  uint32_t crc;
  uint64_t size;
  CheckHeader(header, file_bytes, path, &crc, &size);
  std::vector<char> piece(size_t{4} << 20);
  uLong actual = crc32_z(0L, nullptr, 0);
  for (uint64_t done = 0; done < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), size - done));
    in.read(piece.data(), static_cast<std::streamsize>(n));
    CORTADO_CHECK(in.gcount() == static_cast<std::streamsize>(n), "cannot read checkpoint '", path,
                  "' (it changed or shrank while being read)");
    actual = crc32_z(actual, reinterpret_cast<const Bytef*>(piece.data()), n);
    done += n;
  }
  CORTADO_CHECK(static_cast<uint32_t>(actual) == crc, "checkpoint '", path,
                "' is corrupt (CRC mismatch)");
  piece = {};
  in.clear();
  in.seekg(static_cast<std::streamoff>(kHeaderBytes));
  Reader r(in, size, path);
  return ParsePayload(r, path, keep);
}

Checkpoint ParseCheckpoint(const std::string& file, const std::string& path) {
  uint32_t crc;
  uint64_t size;
  CheckHeader(file.data(), file.size(), path, &crc, &size);
  uLong actual = crc32_z(0L, reinterpret_cast<const Bytef*>(file.data() + kHeaderBytes),
                         file.size() - kHeaderBytes);
  CORTADO_CHECK(static_cast<uint32_t>(actual) == crc, "checkpoint '", path,
                "' is corrupt (CRC mismatch)");
  Reader r(file, path, kHeaderBytes);
  return ParsePayload(r, path, {});
}

std::string CheckpointFileName(int64_t iteration) {
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt-%08lld.cortado", static_cast<long long>(iteration));
  return name;
}

namespace {

// The iteration in a name CheckpointFileName wrote ("ckpt-00001234.cortado" -> 1234); -1 for
// any other name.
int64_t IterationOfName(const std::string& name) {
  constexpr std::string_view kPrefix = "ckpt-", kSuffix = ".cortado";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.rfind(kPrefix, 0) != 0 ||
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
    return -1;
  }
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size() - kSuffix.size();
  int64_t iteration = -1;
  const auto [end, ec] = std::from_chars(first, last, iteration);
  return ec == std::errc() && end == last && iteration >= 0 ? iteration : -1;
}

}  // namespace

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t iteration = IterationOfName(entry.path().filename().string());
    if (iteration >= 0) found.emplace_back(iteration, entry.path().string());
  }
  // By the number, newest first: past 10^8 iterations the zero padding no longer makes text
  // order the number's order.
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& [iteration, path] : found) out.push_back(std::move(path));
  return out;
}

std::map<std::string, std::string> ReadCheckpointMeta(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORTADO_CHECK(in.good(), "cannot open checkpoint '", path, "'");
  std::string header(kHeaderBytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(kHeaderBytes));
  CORTADO_CHECK(in.gcount() == static_cast<std::streamsize>(kHeaderBytes) &&
                    std::memcmp(header.data(), kMagic, 8) == 0,
                "'", path, "' is not a Cortado checkpoint (bad magic or too short)");
  uint32_t version;
  uint64_t size;
  std::memcpy(&version, header.data() + 8, 4);
  std::memcpy(&size, header.data() + 16, 8);
  CORTADO_CHECK(version == kCheckpointVersion, "checkpoint '", path, "' has format version ",
                version, "; this build reads version ", kCheckpointVersion);
  // Reads the payload in growing pieces until the metadata is complete: the metadata is a few
  // kilobytes at the front, the tensors after it may be gigabytes.
  std::string payload;
  size_t want = 64 * 1024;
  while (true) {
    const size_t target = static_cast<size_t>(std::min<uint64_t>(size, want));
    const size_t have = payload.size();
    payload.resize(target);
    in.read(payload.data() + have, static_cast<std::streamsize>(target - have));
    payload.resize(have + static_cast<size_t>(in.gcount()));
    try {
      Reader r(payload, path);
      std::map<std::string, std::string> meta;
      const uint32_t n_meta = r.Get<uint32_t>();
      for (uint32_t i = 0; i < n_meta; ++i) {
        std::string k = r.String();
        meta[k] = r.String();
      }
      return meta;
    } catch (const Error&) {
      // Not all of the metadata yet: read more, unless the file has no more.
      if (payload.size() < target || target == size) throw;
    }
    want *= 4;
  }
}

void PruneCheckpoints(const std::string& dir, int keep, const std::string& run_id) {
  if (keep <= 0) return;
  int kept = 0;
  for (const std::string& path : ListCheckpoints(dir)) {
    std::string owner;
    try {
      const auto meta = ReadCheckpointMeta(path);
      auto it = meta.find("run_id");
      if (it == meta.end()) continue;
      owner = it->second;
    } catch (const Error&) {
      continue;
    }
    if (owner != run_id || ++kept <= keep) continue;
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) LogWarning("could not remove old checkpoint '", path, "': ", ec.message());
  }
}

}  // namespace cortado
