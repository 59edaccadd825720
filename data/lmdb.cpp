#include "data/lmdb.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/file_io.h"

namespace cortado {
namespace {

void Check(int rc, const std::string& path, const char* what) {
  if (rc != MDB_SUCCESS) Fail("LMDB ", path, ": ", what, ": ", mdb_strerror(rc));
}

}  // namespace

bool IsLmdb(const std::string& dir) {
  struct stat st;
  return ::stat((dir + "/data.mdb").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void WriteLmdbCompletion(const std::string& dir, const LmdbCompletion& c) {
  const std::string path = (std::filesystem::path(dir) / kLmdbCompleteFile).string();
  const nlohmann::json j = {{"format", "cortado-convert"},
                            {"version", 1},
                            {"records", c.records},
                            {"skipped", c.skipped},
                            {"classes", c.classes},
                            {"channels", c.channels},
                            {"root", c.root},
                            {"task", c.task}};
  const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  // Written with write(2) and fsync'd: the rename that publishes the database must not reach
  // the disk before the record that says it is whole.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CORTADO_CHECK(fd >= 0, "cannot create ", path, ": ", std::strerror(errno));
  try {
    WriteFully(fd, text.data(), text.size(), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  CORTADO_CHECK(synced, "cannot sync ", path, ": ", std::strerror(err));
}

std::optional<LmdbCompletion> ReadLmdbCompletion(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kLmdbCompleteFile).string();
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    Fail(path, ": not JSON (", e.what(), ")");
  }
  CORTADO_CHECK(j.is_object() && j.contains("records") && j["records"].is_number_integer(), path,
                ": no integer \"records\"");
  LmdbCompletion c;
  c.records = j["records"].get<int64_t>();
  if (j.contains("skipped") && j["skipped"].is_number_integer()) c.skipped = j["skipped"];
  if (j.contains("classes") && j["classes"].is_number_integer()) c.classes = j["classes"];
  if (j.contains("channels") && j["channels"].is_number_integer()) c.channels = j["channels"];
  if (j.contains("root") && j["root"].is_string()) c.root = j["root"];
  if (j.contains("task") && j["task"].is_string()) c.task = j["task"];
  return c;
}

LmdbReader::LmdbReader(const std::string& path, bool random_access) : path_(path) {
  CORTADO_CHECK(IsLmdb(path), "'", path, "' is not an LMDB database (no ", path, "/data.mdb)");
  Check(mdb_env_create(&env_), path, "create environment");
  Check(mdb_env_set_maxreaders(env_, 1024), path, "set max readers");
  unsigned flags = MDB_RDONLY | MDB_NOTLS | (random_access ? MDB_NORDAHEAD : 0);
  int rc = mdb_env_open(env_, path.c_str(), flags, 0664);
  if (rc == EACCES || rc == EROFS) {
    // A database on read-only storage: no lock file can be made, and none is needed as long
    // as nothing writes to it meanwhile.
    mdb_env_close(env_);
    Check(mdb_env_create(&env_), path, "create environment");
    rc = mdb_env_open(env_, path.c_str(), flags | MDB_NOLOCK, 0664);
  }
  if (rc != MDB_SUCCESS) {
    mdb_env_close(env_);
    env_ = nullptr;
    Check(rc, path, "open");
  }
  MDB_txn* txn = nullptr;
  try {
    Check(mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn), path, "begin read transaction");
    MDB_dbi dbi;
    Check(mdb_dbi_open(txn, nullptr, 0, &dbi), path, "open database");
    dbi_ = dbi;
    MDB_cursor* cursor = nullptr;
    Check(mdb_cursor_open(txn, dbi, &cursor), path, "open cursor");
    MDB_val key, value;
    key_offsets_.push_back(0);
    // Only the leaf pages are read: for a record too large for its leaf, LMDB returns the
    // address of its overflow pages without touching them.
    for (rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST); rc == MDB_SUCCESS;
         rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)) {
      keys_.append(static_cast<const char*>(key.mv_data), key.mv_size);
      key_offsets_.push_back(static_cast<int64_t>(keys_.size()));
    }
    mdb_cursor_close(cursor);
    if (rc != MDB_NOTFOUND) Check(rc, path, "walk keys");
    mdb_txn_abort(txn);
  } catch (...) {
    if (txn != nullptr) mdb_txn_abort(txn);
    mdb_env_close(env_);
    throw;
  }
}

std::shared_ptr<const LmdbReader> LmdbReader::Open(const std::string& path, bool random_access) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const LmdbReader>> open;
  std::error_code ec;
  std::string key = std::filesystem::weakly_canonical(path, ec).string();
  if (ec) key = path;
  std::lock_guard<std::mutex> lock(mu);
  if (auto reader = open[key].lock()) return reader;
  auto reader = std::make_shared<const LmdbReader>(path, random_access);
  open[key] = reader;
  return reader;
}

LmdbReader::~LmdbReader() {
  if (env_ != nullptr) mdb_env_close(env_);
}

std::string_view LmdbReader::key(int64_t i) const {
  CORTADO_ASSERT(i >= 0 && i < size());
  return std::string_view(keys_).substr(key_offsets_[i], key_offsets_[i + 1] - key_offsets_[i]);
}

LmdbReader::ReadTxn LmdbReader::BeginRead() const {
  MDB_txn* txn = nullptr;
  Check(mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn), path_, "begin read transaction");
  return ReadTxn(this, txn);
}

LmdbReader::ReadTxn::ReadTxn(ReadTxn&& other) noexcept : reader_(other.reader_), txn_(other.txn_) {
  other.txn_ = nullptr;
}

LmdbReader::ReadTxn::~ReadTxn() {
  if (txn_ != nullptr) mdb_txn_abort(txn_);
}

std::string_view LmdbReader::ReadTxn::Get(int64_t i) const {
  std::string_view k = reader_->key(i);
  MDB_val key{k.size(), const_cast<char*>(k.data())};
  MDB_val value;
  int rc = mdb_get(txn_, reader_->dbi_, &key, &value);
  if (rc != MDB_SUCCESS) {
    Fail("LMDB ", reader_->path_, ": read record ", i, " ('", k, "'): ", mdb_strerror(rc));
  }
  return std::string_view(static_cast<const char*>(value.mv_data), value.mv_size);
}

LmdbWriter::LmdbWriter(const std::string& path, size_t initial_map_size)
    : path_(path), map_size_(initial_map_size) {
  Check(mdb_env_create(&env_), path, "create environment");
  int rc = mdb_env_set_mapsize(env_, map_size_);
  if (rc == MDB_SUCCESS) rc = mdb_env_open(env_, path.c_str(), MDB_NOSYNC | MDB_NOMETASYNC, 0664);
  if (rc != MDB_SUCCESS) {
    mdb_env_close(env_);
    env_ = nullptr;
    Check(rc, path, "open for writing");
  }
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;  // an existing database may already be larger
}

LmdbWriter::~LmdbWriter() {
  if (env_ != nullptr) mdb_env_close(env_);
}

void LmdbWriter::Put(std::string key, std::string value) {
  pending_bytes_ += key.size() + value.size();
  pending_.emplace_back(std::move(key), std::move(value));
  if (pending_.size() >= batch_records || pending_bytes_ >= batch_bytes) Commit();
}

void LmdbWriter::Commit() {
  CORTADO_CHECK(env_ != nullptr, "LMDB ", path_, ": write after Close");
  if (pending_.empty()) return;
  for (;;) {
    MDB_txn* txn = nullptr;
    Check(mdb_txn_begin(env_, nullptr, 0, &txn), path_, "begin write transaction");
    MDB_dbi dbi;
    int rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
    std::string last = last_key_;
    for (size_t i = 0; rc == MDB_SUCCESS && i < pending_.size(); ++i) {
      auto& [k, v] = pending_[i];
      MDB_val key{k.size(), k.data()};
      MDB_val value{v.size(), v.data()};
      // MDB_APPEND only after a key this writer wrote: an existing database may hold larger
      // keys, which MDB_APPEND would reject.
      const bool in_order = !last.empty() && k > last;
      rc = mdb_put(txn, dbi, &key, &value, in_order ? MDB_APPEND : 0);
      last = k;
    }
    if (rc == MDB_SUCCESS) {
      rc = mdb_txn_commit(txn);
    } else {
      mdb_txn_abort(txn);
    }
    if (rc == MDB_MAP_FULL) {
      // Grow and write the whole batch again; no transaction is open now, as
      // mdb_env_set_mapsize requires.
      map_size_ *= 2;
      ++map_growths_;
      Check(mdb_env_set_mapsize(env_, map_size_), path_, "grow the map");
      continue;
    }
    Check(rc, path_, "write records");
    last_key_ = std::move(last);
    break;
  }
  records_ += static_cast<int64_t>(pending_.size());
  pending_.clear();
  pending_bytes_ = 0;
}

void LmdbWriter::Close() {
  if (env_ == nullptr) return;
  Commit();
  Check(mdb_env_sync(env_, 1), path_, "sync");
  mdb_env_close(env_);
  env_ = nullptr;
}

}  // namespace cortado
