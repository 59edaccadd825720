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
// Detection (data/detection_sets.h for the layouts): when `root` is laid out as a Pascal VOC root
// (JPEGImages/, Annotations/; `split` names ImageSets/Main/<split>.txt; `extra_roots` are joined
// after it, as VOC07+12 is), or with `coco` (an instances JSON; `root` its image folder), every
// record is a Caffe SSD AnnotatedDatum (data/annotated_datum.h): the image as above (Datum label
// -1, as Caffe SSD leaves it) and its objects' boxes normalized to the image, grouped by class.
// The classes are numbered by `label_map` (another set's DB/labelmap.prototxt, so a test set is
// numbered as its training set), else as found (VOC: names sorted; COCO: category ids in order),
// 1..K with 0 the background; DB/labelmap.prototxt (Caffe SSD's format) and DB/classes.txt
// (line i names label i, line 0 "background") are written. An item is skipped, and named in
// DB/skipped.txt with the reason, when its annotation is malformed, names a class outside the
// label map, states an image size other than the image's, or holds a box with no area inside the
// image; a box partly outside is clipped to the image (counted in `clipped_boxes`).
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
  int threads = 0;         // decode threads; 0: the core count
  bool overwrite = false;  // replace an existing database (at the end)
  // Detection (see above).
  std::vector<std::string> extra_roots;       // VOC roots joined after `root`
  std::string split;                          // VOC: ImageSets/Main/<split>.txt
  std::string coco;                           // a COCO instances JSON; `root` is its image folder
  std::string label_map;                      // number the classes by this label map
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
  bool detection = false;  // AnnotatedDatum records (VOC or COCO input)
  int64_t items = 0;       // images listed
  int64_t converted = 0;   // records written
  int64_t reencoded = 0;   // of which re-encoded (resized, converted colour, repaired)
  int64_t skipped = 0;     // items that could not be read or decoded (DB/skipped.txt)
  int64_t ignored = 0;     // folder mode: files without an image extension, not listed
  std::vector<std::string> ignored_files;  // their paths under root (also in DB/skipped.txt)
  int64_t classes = 0;                     // detection: K + 1, the background included
  int64_t boxes = 0;                       // detection: objects in the records written
  int64_t clipped_boxes = 0;               // detection: of which clipped to their image
  int64_t bytes_read = 0;                  // input file bytes
  int64_t bytes_written = 0;               // record bytes (keys + values)
  int64_t map_growths = 0;                 // times the LMDB map was doubled
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
