// LMDB access for image databases.
//
// LmdbReader opens a database read-only and indexes its keys once (a cursor walk over the
// leaf pages, which hold only keys when records are large), so record i, in key order, is one
// B-tree lookup. Values are returned as views into the memory map: no copy, valid while the
// read transaction that produced them is open. Each loader thread begins its own ReadTxn and
// keeps it for its lifetime (MDB_NOTLS: transactions are not tied to OS threads).
//
// LmdbWriter appends records in batches (one write transaction per batch). When the map is
// full it aborts the batch, doubles the map size and writes the batch again, so the database
// grows as needed from a small initial map. Durability: the environment is opened without
// per-commit fsync; Close() syncs once at the end.
//
// Completion: `cortado convert` builds a database in a temporary folder and, once every record
// is synced, writes DB/cortado-complete.json (LmdbCompletion) and renames the folder into
// place. The record is a file beside data.mdb, not a key inside it, because Caffe's data layer,
// its compute_image_mean and DALI's Caffe reader parse every key of the database as a Datum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct MDB_env;
struct MDB_txn;

namespace cortado {

// Whether `dir` holds an LMDB environment (dir/data.mdb).
bool IsLmdb(const std::string& dir);

// The completion record's file name inside the database folder.
inline constexpr const char* kLmdbCompleteFile = "cortado-complete.json";

// What DB/cortado-complete.json says: written by the converter after the last record, checked
// by the LMDB sources against the database before training (data/lmdb_source.h).
struct LmdbCompletion {
  int64_t records = 0;  // records in data.mdb
  int64_t skipped = 0;  // inputs that did not decode (skipped.txt also names ignored files)
  int64_t classes = 0;  // lines of classes.txt
  int channels = 0;     // channels of every record (3, or 1 with --gray)
  std::string root;     // the image folder it was converted from
  // "classification" (Datum records) or "detection" (AnnotatedDatum records); databases from
  // before detection existed say nothing, and hold Datum records.
  std::string task = "classification";
};

// Writes dir/cortado-complete.json and syncs it to disk; throws cortado::Error naming the file.
void WriteLmdbCompletion(const std::string& dir, const LmdbCompletion& completion);
// Reads dir/cortado-complete.json: std::nullopt when there is none; throws cortado::Error
// naming the file when it does not parse or lacks "records".
std::optional<LmdbCompletion> ReadLmdbCompletion(const std::string& dir);

class LmdbReader {
 public:
  // The process's reader of the database at `path`, opened on first use and shared while
  // anyone holds it: LMDB forbids opening one environment twice in a process (closing either
  // would drop the other's file locks), and a training and an evaluation source, or two
  // sources in a test, may read the same database. random_access (used by the first opener):
  // turn off OS read-ahead, which only wastes I/O when records are read in random order from
  // a database larger than the page cache.
  static std::shared_ptr<const LmdbReader> Open(const std::string& path,
                                                bool random_access = false);

  // Prefer Open(); this opens a private environment.
  explicit LmdbReader(const std::string& path, bool random_access = false);
  ~LmdbReader();
  LmdbReader(const LmdbReader&) = delete;
  LmdbReader& operator=(const LmdbReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return static_cast<int64_t>(key_offsets_.size()) - 1; }
  std::string_view key(int64_t i) const;

  class ReadTxn {
   public:
    ReadTxn(ReadTxn&& other) noexcept;
    ReadTxn& operator=(ReadTxn&&) = delete;
    ~ReadTxn();
    // Record i's value, valid while this transaction lives.
    std::string_view Get(int64_t i) const;

   private:
    friend class LmdbReader;
    ReadTxn(const LmdbReader* reader, MDB_txn* txn) : reader_(reader), txn_(txn) {}
    const LmdbReader* reader_;
    MDB_txn* txn_;
  };
  ReadTxn BeginRead() const;

 private:
  std::string path_;
  MDB_env* env_ = nullptr;
  unsigned dbi_ = 0;
  std::string keys_;                  // all keys, concatenated in order
  std::vector<int64_t> key_offsets_;  // key i is keys_[offsets[i], offsets[i+1])
};

class LmdbWriter {
 public:
  // Creates (or opens) the environment in directory `path`, which must exist.
  LmdbWriter(const std::string& path, size_t initial_map_size = size_t{1} << 30);
  ~LmdbWriter();  // aborts what was not committed; call Close() to keep it
  LmdbWriter(const LmdbWriter&) = delete;
  LmdbWriter& operator=(const LmdbWriter&) = delete;

  // Queues a record; a batch is written when it reaches batch_records or batch_bytes.
  void Put(std::string key, std::string value);
  // Writes the queued records.
  void Commit();
  // Commits, syncs to disk and closes.
  void Close();

  size_t map_size() const { return map_size_; }
  int64_t map_growths() const { return map_growths_; }
  int64_t records() const { return records_; }

  size_t batch_records = 1000;
  size_t batch_bytes = size_t{64} << 20;

 private:
  std::string path_;
  MDB_env* env_ = nullptr;
  size_t map_size_ = 0;
  int64_t map_growths_ = 0;
  int64_t records_ = 0;
  std::string last_key_;  // keys arriving in order are appended (MDB_APPEND: dense pages)
  std::vector<std::pair<std::string, std::string>> pending_;
  size_t pending_bytes_ = 0;
};

}  // namespace cortado
