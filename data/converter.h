// The converter: a folder of images (ImageNet layout, or a Caffe-style list file) to an LMDB of
// Caffe Datum records, as `cortado convert` runs it.
//
// Input: ROOT/<class>/<...>/<file> with labels in sorted class-folder order (torchvision's
// ImageFolder: files with an image extension, walked recursively, sorted), or a list file of
// "relative/path label" lines (Caffe's convert_imageset; the label is after the last space).
// The class list is written to DB/classes.txt; a list given with --classes is reused, so a
// validation set keeps the training set's labels.
//
// Records: key "%08d_<relative path>" (the item's position in the list, as Caffe numbers them,
// so skipped items leave gaps), value a Datum with encoded=true, label, channels/height/width.
// Every record has the same channel count, 3 (RGB), or 1 with `gray`, as Caffe's
// convert_imageset stores them (its data layer and compute_image_mean take the first record's
// shape for all). A JPEG that decodes cleanly and already has that channel count is stored byte
// for byte; everything else that decodes (a grey JPEG without `gray`, a colour one with it,
// CMYK/YCCK JPEG, PNG named .JPEG, other formats) is converted and re-encoded as a JPEG at
// `quality`; a JPEG that decodes only with warnings (premature end of data, corrupt entropy
// data) is re-encoded from what libjpeg recovered, so the loader never meets the warning. With
// a resize option every image is resized and re-encoded. Items that do not decode (truncated
// beyond decoding, empty, not an image) are skipped, counted, and listed with the reason in
// DB/skipped.txt; so are the files of the folder walk without an image extension ("ignored: no
// image extension"), which are not items.
//
// Output: everything is written into `<out>.partial-<host>-<pid>`, a sibling of `out`; when the
// last record is synced, DB/cortado-complete.json (data/lmdb.h) is written and the folder is
// renamed to `out`, replacing an old database there (with `overwrite`) in the same step. An
// error or `stop` removes the temporary and leaves `out` as it was; a temporary that a killed
// conversion left behind is removed by the next conversion into the same `out` on this host.
//
// Threads: `threads` workers read and decode; the calling thread writes records in list order,
// so the database is byte-identical whatever the thread count.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cortado {

struct ConvertOptions {
  std::string root;        // image folder (or the folder list paths are relative to)
  std::string out;         // database directory (created by renaming a finished temporary)
  std::string list;        // optional "relative/path label" list file
  std::string classes;     // optional class list to reuse (one name per line)
  int resize_shorter = 0;  // > 0: resize so the shorter side is this long
  int resize_width = 0;    // > 0 with resize_height: resize to exactly this size
  int resize_height = 0;
  int quality = 90;      // JPEG quality of re-encoded images
  bool gray = false;     // 1-channel records (Caffe's --gray); else 3-channel
  bool shuffle = false;  // shuffle the list (with seed) before numbering
  uint64_t seed = 0;
  int threads = 0;                            // decode threads; 0: the core count
  bool overwrite = false;                     // replace an existing database (at the end)
  size_t initial_map_size = size_t{1} << 30;  // LMDB map; doubles whenever it fills up
  // Called from the calling thread about every 1000 records written, and once at the end.
  std::function<void(int64_t done, int64_t total, double seconds)> progress;
  // When set and true (SIGINT/SIGTERM, tools/stop_signals.h): stop, remove the temporary, throw.
  const std::atomic<bool>* stop = nullptr;
  // Tests: called from the calling thread after each item is written or skipped; may throw.
  std::function<void(int64_t done)> on_record;
};

struct ConvertSummary {
  std::string db;
  int64_t items = 0;      // images listed
  int64_t converted = 0;  // records written
  int64_t reencoded = 0;  // of which re-encoded (resized, converted colour, repaired)
  int64_t skipped = 0;    // items that could not be read or decoded (DB/skipped.txt)
  int64_t ignored = 0;    // folder mode: files without an image extension, not listed
  std::vector<std::string> ignored_files;  // their paths under root (also in DB/skipped.txt)
  int64_t classes = 0;
  int64_t bytes_read = 0;     // input file bytes
  int64_t bytes_written = 0;  // record bytes (keys + values)
  int64_t map_growths = 0;    // times the LMDB map was doubled
  double seconds = 0;
};

// Converts; throws cortado::Error for a bad argument, an unreadable list, an existing database
// without `overwrite` (refused before any work), or an interruption. Broken images are not
// errors: they are skipped.
ConvertSummary ConvertImages(const ConvertOptions& options);

// The summary as one line of JSON / as human-readable lines.
std::string SummaryJson(const ConvertSummary& summary);
std::string SummaryText(const ConvertSummary& summary);

}  // namespace cortado
