#include "data/converter.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <thread>
#include <vector>

#include "data/annotated_datum.h"
#include "data/datum.h"
#include "data/detection_sets.h"
#include "data/jpeg.h"
#include "data/label_map.h"
#include "data/lmdb.h"
#include "data/transforms.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"

namespace cortado {
namespace fs = std::filesystem;

namespace {

// LMDB's compile-time key limit (mdb_env_get_maxkeysize).
constexpr size_t kMaxKeyBytes = 511;

struct Item {
  std::string path;  // relative to root, '/'-separated; detection: the key's path part
  int label = 0;
  const DetectionItem* detection = nullptr;  // detection: the image's file and objects
};

// Why the folder walk passes a file over (ConvertSummary::ignored_files, skipped.txt).
constexpr const char* kIgnoredReason = "no image extension";

// torchvision's IMG_EXTENSIONS.
bool HasImageExtension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::set<std::string> kExtensions = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                                    ".pgm", ".tif",  ".tiff", ".webp"};
  return kExtensions.count(ext) != 0;
}

std::string TrimLine(std::string line) {
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

std::vector<std::string> ReadClassList(const std::string& path) {
  std::ifstream in(path);
  CORTADO_CHECK(in, "--classes: cannot read '", path, "'");
  std::vector<std::string> names;
  std::set<std::string> seen;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    line = TrimLine(line);
    CORTADO_CHECK(!line.empty(), path, ":", line_no, ": empty class name");
    CORTADO_CHECK(seen.insert(line).second, path, ":", line_no, ": class '", line,
                  "' is listed twice");
    names.push_back(line);
  }
  CORTADO_CHECK(!names.empty(), "--classes: '", path, "' lists no classes");
  return names;
}

// Whether SIGINT/SIGTERM (ConvertOptions::stop) has arrived.
bool StopRequested(const ConvertOptions& o) { return o.stop != nullptr && o.stop->load(); }

// The error a stopped conversion ends with; `where` says what was underway.
[[noreturn]] void FailStopped(const ConvertOptions& o, const std::string& where) {
  Fail("interrupted while ", where, "; --out ", o.out, " was left as it was");
}

// ImageFolder's walk: class folders in sorted order, files below each (recursively) sorted by
// (folder, name). Hidden entries (".name") are left out.
std::vector<Item> ListFolder(const ConvertOptions& o, std::vector<std::string>* classes,
                             std::vector<std::string>* ignored) {
  CORTADO_CHECK(fs::is_directory(o.root), "--root: '", o.root, "' is not a folder");
  std::vector<std::string> folders;
  for (const fs::directory_entry& e : fs::directory_iterator(o.root)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (e.is_directory()) folders.push_back(name);
  }
  std::sort(folders.begin(), folders.end());
  CORTADO_CHECK(!folders.empty(), "--root: '", o.root,
                "' has no class folders (expected ROOT/<class>/<image>, or give --list)");
  if (o.classes.empty()) {
    *classes = folders;
  } else {
    *classes = ReadClassList(o.classes);
    for (const std::string& f : folders) {
      CORTADO_CHECK(std::find(classes->begin(), classes->end(), f) != classes->end(),
                    "class folder '", f, "' of ", o.root, " is not in --classes ", o.classes);
    }
  }
  std::vector<Item> items;
  for (const std::string& folder : folders) {
    if (StopRequested(o)) FailStopped(o, StrCat("listing ", o.root));
    const int label =
        static_cast<int>(std::find(classes->begin(), classes->end(), folder) - classes->begin());
    std::vector<std::pair<std::string, std::string>> files;  // (relative folder, name)
    const fs::path base = fs::path(o.root) / folder;
    auto it =
        fs::recursive_directory_iterator(base, fs::directory_options::follow_directory_symlink);
    for (; it != fs::recursive_directory_iterator(); ++it) {
      const std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file()) continue;
      if (!HasImageExtension(it->path())) {
        ignored->push_back(fs::relative(it->path(), o.root).generic_string());
        continue;
      }
      files.emplace_back(fs::relative(it->path().parent_path(), o.root).generic_string(), name);
    }
    std::sort(files.begin(), files.end());
    for (auto& [dir, name] : files) items.push_back(Item{dir + "/" + name, label});
  }
  return items;
}

// Caffe's list format: "relative/path label", the label after the last space.
std::vector<Item> ListFile(const ConvertOptions& o, std::vector<std::string>* classes) {
  std::ifstream in(o.list);
  CORTADO_CHECK(in, "--list: cannot read '", o.list, "'");
  std::vector<Item> items;
  std::string line;
  int line_no = 0;
  int max_label = -1;
  while (std::getline(in, line)) {
    ++line_no;
    line = TrimLine(line);
    if (line.empty()) continue;
    const size_t space = line.find_last_of(" \t");
    // The devkit's validation ground truth: a class number per line, in the devkit's order.
    CORTADO_CHECK(
        space != std::string::npos || line.find_first_not_of("0123456789") != std::string::npos,
        o.list, ":", line_no, ": '", line,
        "' is a bare class number, as in the devkit's "
        "ILSVRC2012_validation_ground_truth.txt, whose numbers are the devkit's own "
        "class order; make the list with scripts/imagenet_val_list.py --labels "
        "LOC_val_solution.csv (docs/IMAGENET.md)");
    CORTADO_CHECK(space != std::string::npos && space > 0, o.list, ":", line_no,
                  ": expected 'relative/path label', got '", line, "'");
    std::string path = TrimLine(line.substr(0, space));
    const std::string label_text = line.substr(space + 1);
    int label = -1;
    auto [end, ec] =
        std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    CORTADO_CHECK(ec == std::errc() && end == label_text.data() + label_text.size() && label >= 0,
                  o.list, ":", line_no, ": label '", label_text, "' is not a non-negative integer");
    max_label = std::max(max_label, label);
    items.push_back(Item{std::move(path), label});
  }
  CORTADO_CHECK(!items.empty(), "--list: '", o.list, "' lists no images");
  if (!o.classes.empty()) {
    *classes = ReadClassList(o.classes);
    CORTADO_CHECK(max_label < static_cast<int>(classes->size()), o.list, ": label ", max_label,
                  " is outside the ", classes->size(), " classes of ", o.classes);
  } else {
    classes->clear();
    for (int i = 0; i <= max_label; ++i) classes->push_back(std::to_string(i));
  }
  return items;
}

// Detection input: the VOC roots or the COCO file, listed; the classes numbered by the label map
// (--label-map, else as found); items naming a class outside it marked as malformed.
std::vector<Item> ListDetection(const ConvertOptions& o, DetectionSet* set,
                                std::vector<LabelMapEntry>* label_map) {
  if (!o.coco.empty()) {
    CORTADO_CHECK(fs::is_directory(o.root), "--root: '", o.root,
                  "' is not a folder (with --coco: the folder of its images)");
    *set = ListCoco(o.coco, o.root);
  } else {
    std::vector<std::string> roots = {o.root};
    roots.insert(roots.end(), o.extra_roots.begin(), o.extra_roots.end());
    *set = ListVoc(roots, o.split, o.stop);
  }
  *label_map = o.label_map.empty() ? MakeLabelMap(set->names, set->display_names)
                                   : ReadLabelMap(o.label_map);
  CORTADO_CHECK(label_map->size() >= 2, "no objects found in ", o.coco.empty() ? o.root : o.coco,
                ", so no classes to number (give --label-map)");
  std::map<std::string, int> label_of;
  for (const LabelMapEntry& e : *label_map) {
    if (e.label > 0) label_of[e.name] = e.label;
  }
  std::vector<Item> items;
  for (DetectionItem& d : set->items) {
    for (size_t b = 0; b < d.boxes.size(); ++b) {
      PixelBox& box = d.boxes[b];
      const auto it = label_of.find(box.name);
      if (it != label_of.end()) {
        box.label = it->second;
      } else if (d.error.empty()) {
        d.error = StrCat(d.source, ": object ", b + 1, " is of class '", box.name,
                         "', which is not in the label map ", o.label_map);
      }
    }
    items.push_back(Item{d.key, 0, &d});
  }
  return items;
}

// Where a conversion writes, and what it replaces at the end. The database is built in a
// sibling of --out, `<out>.partial-<host>-<pid>`, so that --out only ever holds a whole
// database: the staging folder is renamed into place once its last record is synced and its
// completion record written. A sibling, so the rename stays within one filesystem; host and pid
// in the name, so a later run can tell a temporary of a dead process on this machine (safe to
// delete) from one of a conversion still running, here or on another machine sharing the disk.
struct OutputPlan {
  std::string out;            // --out, without trailing slashes
  std::string parent;         // its folder
  std::string name;           // its last component
  std::string staging;        // the temporary sibling
  bool replace = false;       // --out holds a database that --overwrite replaces at the end
  bool empty_folder = false;  // --out is an empty folder, replaced too
};

// The host name as it appears in temporary names: '-' (the pid separator) and anything unusual
// in a file name become '_'.
std::string HostTag() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  std::string tag;
  for (const char* p = host; *p != '\0'; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    tag += std::isalnum(c) || c == '.' || c == '_' ? static_cast<char>(c) : '_';
  }
  return tag;
}

// Checks --out before any work: an existing database is refused without --overwrite, and
// something that is not a database (a file, a folder with other things in it) is never replaced.
OutputPlan PlanOutput(const ConvertOptions& o) {
  CORTADO_CHECK(!o.out.empty(), "--out: no database path given");
  OutputPlan plan;
  plan.out = o.out;
  while (plan.out.size() > 1 && plan.out.back() == '/') plan.out.pop_back();
  const fs::path out(plan.out);
  plan.name = out.filename().string();
  CORTADO_CHECK(!plan.name.empty() && plan.name != "." && plan.name != "..", "--out '", o.out,
                "' does not name a folder");
  plan.parent = out.has_parent_path() ? out.parent_path().string() : ".";
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (IsLmdb(plan.out)) {
      CORTADO_CHECK(o.overwrite, "--out '", plan.out,
                    "' already holds a database; pass --overwrite to replace it");
      plan.replace = true;
    } else if (fs::is_directory(out, ec) && fs::is_empty(out, ec)) {
      plan.empty_folder = true;
    } else {
      Fail("--out '", plan.out,
           "' exists and is not a database; give a new path (--overwrite replaces only a "
           "database)");
    }
  }
  plan.staging = StrCat(plan.out, ".partial-", HostTag(), "-", ::getpid());
  return plan;
}

// Deletes temporaries that conversions into the same --out on this machine left when they were
// killed (SIGKILL, a crash, a power cut: nothing ran to remove them). One whose process still
// runs is another conversion's, and is left alone.
void RemoveStaleStaging(const OutputPlan& plan) {
  const std::string prefix = StrCat(plan.name, ".partial-", HostTag(), "-");
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(plan.parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    long pid = 0;
    auto [end, err] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (err != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0) continue;
    if (pid == ::getpid()) continue;  // ours: replaced below
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // still running
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) {
      LogInfo("convert: removed ", e.path().string(),
              ", left by an interrupted conversion (process ", pid, " is gone)");
    }
  }
}

// Creates the staging folder (and --out's parent folder).
void CreateStaging(const OutputPlan& plan) {
  std::error_code ec;
  fs::create_directories(plan.parent, ec);
  CORTADO_CHECK(!ec && fs::is_directory(plan.parent), "--out: cannot create folder '", plan.parent,
                "': ", ec.message());
  RemoveStaleStaging(plan);
  fs::remove_all(plan.staging, ec);
  CORTADO_CHECK(fs::create_directory(plan.staging, ec) && !ec, "--out: cannot create '",
                plan.staging, "': ", ec.message());
}

// Removes the staging folder unless the database was published.
class StagingGuard {
 public:
  explicit StagingGuard(std::string dir) : dir_(std::move(dir)) {}
  ~StagingGuard() {
    if (dir_.empty()) return;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  StagingGuard(const StagingGuard&) = delete;
  StagingGuard& operator=(const StagingGuard&) = delete;
  void Release() { dir_.clear(); }

 private:
  std::string dir_;
};

void SyncFolder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Moves the finished staging folder to --out. Replacing a database is one atomic exchange
// (renameat2 RENAME_EXCHANGE) where the filesystem has it, so a reader opening --out finds the
// old database or the new one, never neither; elsewhere the old one is moved aside first and
// deleted only after the new one is in place. A new --out is created with RENAME_NOREPLACE, so
// a database that another conversion put there meanwhile is not clobbered.
void Publish(const OutputPlan& plan) {
  const char* from = plan.staging.c_str();
  const char* to = plan.out.c_str();
  std::error_code ec;
  if (plan.replace) {
    if (::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) == 0) {
      fs::remove_all(plan.staging, ec);  // now the old database
    } else {
      CORTADO_CHECK(errno == EINVAL || errno == ENOSYS, "cannot replace ", plan.out, " with ",
                    plan.staging, ": ", std::strerror(errno));
      // Without RENAME_EXCHANGE: --out is briefly absent, never partial. A crash in between
      // leaves the old database at `aside`.
      const std::string aside = StrCat(plan.out, ".old-", HostTag(), "-", ::getpid());
      fs::remove_all(aside, ec);
      CORTADO_CHECK(::rename(to, aside.c_str()) == 0, "cannot move ", plan.out, " aside to ", aside,
                    ": ", std::strerror(errno));
      CORTADO_CHECK(::rename(from, to) == 0, "cannot rename ", plan.staging, " to ", plan.out, ": ",
                    std::strerror(errno), " (the old database is at ", aside, ")");
      fs::remove_all(aside, ec);
    }
  } else {
    if (plan.empty_folder) fs::remove(plan.out, ec);  // rmdir: fails if it filled up meanwhile
    int rc = ::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
      rc = fs::exists(plan.out, ec) ? (errno = EEXIST, -1) : ::rename(from, to);
    }
    CORTADO_CHECK(rc == 0 || errno != EEXIST, "--out '", plan.out,
                  "' appeared while converting (another conversion?); not replaced (run again "
                  "with --overwrite to replace it)");
    CORTADO_CHECK(rc == 0, "cannot rename ", plan.staging, " to ", plan.out, ": ",
                  std::strerror(errno));
  }
  SyncFolder(plan.parent);
}

bool ReadFile(const std::string& path, std::string* out, std::string* why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *why = StrCat("cannot open: ", std::strerror(errno));
    return false;
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  out->resize(size > 0 ? static_cast<size_t>(size) : 0);
  if (size > 0 && !in.read(out->data(), size)) {
    *why = "read error";
    return false;
  }
  return true;
}

// Every record gets the same channel count, as Caffe's convert_imageset gives them: it reads each
// image with OpenCV as colour (grey with --gray) and stores what it read, because Caffe's data
// layer and compute_image_mean take the first record's shape for all of them. Grey to RGB
// repeats the channel; RGB to grey is OpenCV's (ITU-R 601 luma, what its grey decode gives).
void ConvertChannels(const ImageU8& in, int channels, ImageU8* out) {
  out->Reshape(in.width, in.height, channels);
  if (in.channels == 1 && channels == 3) {
    for (int y = 0; y < in.height; ++y) {
      const uint8_t* src = in.row(y);
      uint8_t* dst = out->row(y);
      for (int x = 0; x < in.width; ++x) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = src[x];
    }
  } else {
    CORTADO_ASSERT(in.channels == 3 && channels == 1);
    const cv::Mat rgb(in.height, in.width, CV_8UC3, const_cast<uint8_t*>(in.pixels.data()),
                      in.stride());
    cv::Mat gray(out->height, out->width, CV_8UC1, out->pixels.data(), out->stride());
    cv::cvtColor(rgb, gray, cv::COLOR_RGB2GRAY);
  }
}

struct Result {
  bool ok = false;
  bool reencoded = false;
  int64_t boxes = 0;          // detection: objects in the record
  int64_t clipped_boxes = 0;  // of which clipped to the image
  std::string key;
  std::string record;  // serialized Datum
  std::string reason;  // why skipped
  int64_t bytes_read = 0;
};

// One worker's codec state: decoders and buffers reused from item to item.
class ItemEncoder {
 public:
  explicit ItemEncoder(const ConvertOptions& o) : o_(o) {}

  Result Process(const Item& item, int64_t index) {
    Result r;
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "%08lld_", static_cast<long long>(index));
    r.key = prefix + item.path;
    if (r.key.size() > kMaxKeyBytes) {
      r.reason = StrCat("path too long for an LMDB key (", kMaxKeyBytes, " bytes)");
      return r;
    }
    const DetectionItem* det = item.detection;
    if (det != nullptr && !det->error.empty()) {
      r.reason = det->error;
      return r;
    }
    std::string why;
    const std::string file = det != nullptr ? det->file : (fs::path(o_.root) / item.path).string();
    if (!ReadFile(file, &file_, &why)) {
      r.reason = why;
      return r;
    }
    r.bytes_read = static_cast<int64_t>(file_.size());
    if (file_.empty()) {
      r.reason = "empty file";
      return r;
    }
    DatumFields fields;
    fields.label = det != nullptr ? -1 : item.label;  // Caffe SSD leaves an image's label at -1
    fields.encoded = true;
    const std::string* payload = nullptr;
    if (!Encode(&fields, &payload, &r.reencoded, &r.reason)) return r;
    if (det == nullptr) {
      r.record = SerializeDatum(fields, *payload);
    } else {
      if (!NormalizeBoxes(*det, &r)) return r;
      r.record = SerializeAnnotatedDatum(fields, *payload, boxes_);
    }
    r.ok = true;
    return r;
  }

 private:
  bool resizing() const { return o_.resize_shorter > 0 || o_.resize_width > 0; }

  // The objects of `det` as boxes normalized to the image as read (source_width_ x
  // source_height_: a resize does not change normalized coordinates), clipped to it, into
  // boxes_; false, with r->reason, when the annotation does not fit the image.
  bool NormalizeBoxes(const DetectionItem& det, Result* r) {
    const int w = source_width_, h = source_height_;
    if (det.width > 0 && det.height > 0 && (det.width != w || det.height != h)) {
      r->reason = StrCat(det.source, " states a ", det.width, "x", det.height,
                         " image, but the image is ", w, "x", h);
      return false;
    }
    boxes_.clear();
    std::map<int, int> instances;  // label -> objects so far: Caffe SSD's instance ids
    for (size_t b = 0; b < det.boxes.size(); ++b) {
      const PixelBox& p = det.boxes[b];
      BoxAnnotation box;
      box.label = p.label;
      box.instance_id = instances[p.label]++;
      box.difficult = p.difficult;
      const double x0 = std::clamp(p.xmin / w, 0.0, 1.0), x1 = std::clamp(p.xmax / w, 0.0, 1.0);
      const double y0 = std::clamp(p.ymin / h, 0.0, 1.0), y1 = std::clamp(p.ymax / h, 0.0, 1.0);
      if (!(x1 > x0 && y1 > y0)) {
        r->reason =
            StrCat(det.source, ": object ", b + 1, " (", p.name, ") box (", p.xmin, ", ", p.ymin,
                   ") - (", p.xmax, ", ", p.ymax, ") has no area inside the ", w, "x", h, " image");
        return false;
      }
      if (p.xmin < 0 || p.ymin < 0 || p.xmax > w || p.ymax > h) ++r->clipped_boxes;
      box.xmin = static_cast<float>(x0);
      box.ymin = static_cast<float>(y0);
      box.xmax = static_cast<float>(x1);
      box.ymax = static_cast<float>(y1);
      boxes_.push_back(box);
    }
    r->boxes = static_cast<int64_t>(boxes_.size());
    return true;
  }

  // Target size for an image of w x h.
  void TargetSize(int w, int h, int* tw, int* th) const {
    if (o_.resize_width > 0) {
      *tw = o_.resize_width;
      *th = o_.resize_height;
      return;
    }
    const int s = o_.resize_shorter;
    if (w <= h) {
      *tw = s;
      *th = std::max(1, static_cast<int>(std::lround(static_cast<double>(h) * s / w)));
    } else {
      *th = s;
      *tw = std::max(1, static_cast<int>(std::lround(static_cast<double>(w) * s / h)));
    }
  }

  // Fills fields and points *payload at the bytes to store (the file or a new JPEG).
  bool Encode(DatumFields* fields, const std::string** payload, bool* reencoded,
              std::string* reason) {
    const int channels = o_.gray ? 1 : 3;  // of every record
    const auto* data = reinterpret_cast<const uint8_t*>(file_.data());
    JpegHeader header;
    const bool is_jpeg = jpeg_.Open(data, file_.size(), &header);
    const bool direct =
        is_jpeg && (header.color == JpegColor::kGray || header.color == JpegColor::kYCbCr ||
                    header.color == JpegColor::kRGB);
    std::string jpeg_error = is_jpeg ? "" : jpeg_.message();
    ImageU8* pixels = &decoded_;
    bool have_pixels = false;
    if (direct) {
      int k = 8;
      if (resizing()) {
        int tw, th;
        TargetSize(header.width, header.height, &tw, &th);
        k = ChooseDctScale(header.width, header.height, tw, th);
      }
      PixelRect roi;
      if (jpeg_.Decode(k, PixelRect{0, 0, header.width, header.height}, &decoded_, &roi)) {
        have_pixels = true;
        source_width_ = header.width;
        source_height_ = header.height;
        if (!resizing() && jpeg_.warnings() == 0 && (header.components == 1 ? 1 : 3) == channels) {
          // A clean JPEG with the records' channel count: stored byte for byte.
          fields->channels = channels;
          fields->width = header.width;
          fields->height = header.height;
          *payload = &file_;
          *reencoded = false;
          return true;
        }
      } else {
        jpeg_error = jpeg_.message();
      }
    }
    if (!have_pixels) {
      // CMYK/YCCK JPEG, PNG named .JPEG, other formats: whatever OpenCV decodes.
      std::string why;
      if (!DecodeWithOpenCV(data, file_.size(), /*keep_gray=*/o_.gray, &decoded_, &why)) {
        *reason = LooksLikeJpeg(data, file_.size()) && !jpeg_error.empty()
                      ? StrCat("corrupt JPEG: ", jpeg_error)
                      : StrCat("not a decodable image: ", why);
        return false;
      }
      source_width_ = decoded_.width;
      source_height_ = decoded_.height;
    }
    if (resizing()) {
      // The target from the full-size dimensions (DCT scaling may have shrunk decoded_).
      int tw, th;
      TargetSize(source_width_, source_height_, &tw, &th);
      ResizeImage(decoded_, tw, th, &resized_);
      pixels = &resized_;
    }
    if (pixels->channels != channels) {
      ConvertChannels(*pixels, channels, &converted_);
      pixels = &converted_;
    }
    encoder_.Encode(*pixels, o_.quality, /*progressive=*/false, &encoded_);
    fields->channels = pixels->channels;
    fields->width = pixels->width;
    fields->height = pixels->height;
    *payload = &encoded_;
    *reencoded = true;
    return true;
  }

  const ConvertOptions& o_;
  JpegDecoder jpeg_;
  JpegEncoder encoder_;
  std::string file_;
  std::string encoded_;
  ImageU8 decoded_;
  ImageU8 resized_;
  ImageU8 converted_;
  // The image's size as read, before any resize (DCT scaling may have shrunk decoded_).
  int source_width_ = 0, source_height_ = 0;
  std::vector<BoxAnnotation> boxes_;  // detection: the record's objects
};

}  // namespace

namespace {

// Whether the input is a detection set: a COCO file, or a root laid out as Pascal VOC's.
bool IsDetection(const ConvertOptions& o) { return !o.coco.empty() || IsVocRoot(o.root); }

void CheckOptions(const ConvertOptions& o) {
  CORTADO_CHECK(!o.root.empty(), "--root: no image folder given");
  CORTADO_CHECK(o.quality >= 1 && o.quality <= 100, "--quality must be in 1..100, got ", o.quality);
  CORTADO_CHECK(o.resize_shorter >= 0 && o.resize_width >= 0 && o.resize_height >= 0,
                "resize sizes must be positive");
  CORTADO_CHECK((o.resize_width > 0) == (o.resize_height > 0),
                "--resize takes WxH with both sides positive");
  CORTADO_CHECK(!(o.resize_shorter > 0 && o.resize_width > 0),
                "give --resize-shorter or --resize, not both");
  CORTADO_CHECK(o.threads >= 0, "--threads must be >= 0, got ", o.threads);
  if (IsDetection(o)) {
    CORTADO_CHECK(o.list.empty(), "--list is for classification; a detection set is listed by ",
                  o.coco.empty() ? "--split (ImageSets/Main/<split>.txt)" : "its --coco file");
    CORTADO_CHECK(o.classes.empty(), "--classes is for classification; number a detection set ",
                  "with --label-map (another set's DB/labelmap.prototxt)");
    CORTADO_CHECK(o.coco.empty() || (o.extra_roots.empty() && o.split.empty()),
                  "--coco takes one --root (its image folder) and no --split");
  } else {
    CORTADO_CHECK(o.extra_roots.empty(), "several --root folders join Pascal VOC roots only, and '",
                  o.root, "' is not one (no JPEGImages/ and Annotations/)");
    CORTADO_CHECK(
        o.split.empty() && o.label_map.empty(), "--split and --label-map are for ",
        "detection sets, and '", o.root,
        "' is not a Pascal VOC root (no JPEGImages/ and Annotations/; COCO: give --coco)");
  }
}

// Workers decode items in any order into a window of results; the calling thread writes them
// in list order. The window bounds memory to a few hundred encoded images.
class OrderedWindow {
 public:
  OrderedWindow(const ConvertOptions& o, const std::vector<Item>& items, int64_t window)
      : o_(o),
        items_(items),
        ring_(static_cast<size_t>(window)),
        ready_(static_cast<size_t>(window), 0) {}

  // A worker: takes the next item while it fits in the window, until none is left.
  void Work() {
    ItemEncoder encoder(o_);
    const int64_t n = static_cast<int64_t>(items_.size());
    const int64_t window = static_cast<int64_t>(ring_.size());
    for (;;) {
      int64_t i;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (next_ >= n || abort_) return;
        i = next_++;
        room_cv_.wait(lock, [&] { return i < written_ + window || abort_; });
        if (abort_) return;
      }
      Result r;
      try {
        r = encoder.Process(items_[static_cast<size_t>(i)], i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        Abort();
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      ring_[static_cast<size_t>(i % window)] = std::move(r);
      ready_[static_cast<size_t>(i % window)] = 1;
      result_cv_.notify_all();
    }
  }

  // Item i's result, once a worker has it; rethrows a worker's exception.
  Result Take(int64_t i) {
    const size_t slot = static_cast<size_t>(i % static_cast<int64_t>(ring_.size()));
    Result r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      result_cv_.wait(lock, [&] { return ready_[slot] || abort_; });
      if (error_) std::rethrow_exception(error_);
      r = std::move(ring_[slot]);
      ready_[slot] = 0;
      written_ = i + 1;
    }
    room_cv_.notify_all();
    return r;
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    Abort();
  }

 private:
  void Abort() {  // with mu_ held
    abort_ = true;
    result_cv_.notify_all();
    room_cv_.notify_all();
  }

  const ConvertOptions& o_;
  const std::vector<Item>& items_;
  std::vector<Result> ring_;
  std::vector<char> ready_;
  std::mutex mu_;
  std::condition_variable result_cv_, room_cv_;
  int64_t next_ = 0, written_ = 0;
  bool abort_ = false;
  std::exception_ptr error_;
};

// Decodes every item on `threads` workers and writes the records in list order; the items that
// do not decode go to `skipped_out` with their reason.
void WriteRecords(const ConvertOptions& o, const std::vector<Item>& items, LmdbWriter& writer,
                  std::ofstream& skipped_out, ConvertSummary& summary,
                  const std::function<double()>& elapsed) {
  const int threads = o.threads > 0 ? o.threads : NumThreads();
  const int64_t n = static_cast<int64_t>(items.size());
  OrderedWindow window(o, items, std::max<int64_t>(64, 16 * threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back([&window] { window.Work(); });
  double last_progress = 0;
  try {
    for (int64_t i = 0; i < n; ++i) {
      if (StopRequested(o)) FailStopped(o, StrCat("converting item ", i + 1, " of ", n));
      Result r = window.Take(i);
      summary.bytes_read += r.bytes_read;
      if (r.ok) {
        summary.bytes_written += static_cast<int64_t>(r.key.size() + r.record.size());
        ++summary.converted;
        if (r.reencoded) ++summary.reencoded;
        summary.boxes += r.boxes;
        summary.clipped_boxes += r.clipped_boxes;
        writer.Put(std::move(r.key), std::move(r.record));
      } else {
        ++summary.skipped;
        skipped_out << items[static_cast<size_t>(i)].path << '\t' << r.reason << '\n';
      }
      if (o.progress && (elapsed() - last_progress > 0.2)) {
        last_progress = elapsed();
        o.progress(i + 1, n, last_progress);
      }
      if (o.on_record) o.on_record(i + 1);
    }
    writer.Close();  // synced to disk
  } catch (...) {
    window.Stop();
    for (std::thread& t : workers) t.join();
    throw;
  }
  for (std::thread& t : workers) t.join();
}

// The completion record, then the rename into place.
void Finish(const ConvertOptions& o, const OutputPlan& plan, const ConvertSummary& summary) {
  if (StopRequested(o)) FailStopped(o, "syncing the database");
  LmdbCompletion completion;
  completion.records = summary.converted;
  completion.skipped = summary.skipped;
  completion.classes = summary.classes;
  completion.channels = o.gray ? 1 : 3;
  completion.task = summary.detection ? "detection" : "classification";
  std::error_code ec;
  const fs::path root = fs::absolute(o.root, ec);
  completion.root = ec ? o.root : root.lexically_normal().string();
  WriteLmdbCompletion(plan.staging, completion);
  Publish(plan);
}

}  // namespace

ConvertSummary ConvertImages(const ConvertOptions& o) {
  CheckOptions(o);
  const OutputPlan plan = PlanOutput(o);  // refuses an existing --out before any work
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  ConvertSummary summary;
  summary.db = plan.out;
  summary.detection = IsDetection(o);
  std::vector<std::string> classes;
  DetectionSet detection_set;  // the items point into it
  std::vector<LabelMapEntry> label_map;
  std::vector<Item> items;
  if (summary.detection) {
    items = ListDetection(o, &detection_set, &label_map);
    for (const LabelMapEntry& e : label_map) classes.push_back(e.display_name);
  } else {
    items =
        o.list.empty() ? ListFolder(o, &classes, &summary.ignored_files) : ListFile(o, &classes);
  }
  summary.ignored = static_cast<int64_t>(summary.ignored_files.size());
  CORTADO_CHECK(!items.empty(), "no images found under '", o.root, "'");
  if (o.shuffle) {
    Rng rng(HashCombine(o.seed, 0x434f4e56ull));
    for (size_t i = items.size() - 1; i > 0; --i) std::swap(items[i], items[rng.Below(i + 1)]);
  }
  summary.items = static_cast<int64_t>(items.size());
  summary.classes = static_cast<int64_t>(classes.size());
  if (StopRequested(o)) FailStopped(o, StrCat("listing ", o.root));

  // Everything is written into the staging folder; --out is untouched until Publish.
  CreateStaging(plan);
  StagingGuard guard(plan.staging);  // declared before the writer: destroyed after it
  const fs::path staging(plan.staging);
  {
    std::ofstream out(staging / "classes.txt");
    for (const std::string& name : classes) out << name << '\n';
    CORTADO_CHECK(out, "cannot write ", plan.staging, "/classes.txt");
  }
  if (summary.detection) {
    std::ofstream out(staging / kLabelMapFile);
    out << LabelMapText(label_map);
    CORTADO_CHECK(out, "cannot write ", plan.staging, "/", kLabelMapFile);
  }
  LmdbWriter writer(plan.staging, o.initial_map_size);
  std::ofstream skipped_out(staging / "skipped.txt");
  // Files the folder walk passed over are named first, so a user sees what was not converted.
  for (const std::string& path : summary.ignored_files) {
    skipped_out << path << "\tignored: " << kIgnoredReason << '\n';
  }
  WriteRecords(o, items, writer, skipped_out, summary, elapsed);
  skipped_out.close();
  CORTADO_CHECK(skipped_out, "cannot write ", plan.staging, "/skipped.txt");
  Finish(o, plan, summary);
  guard.Release();
  summary.map_growths = writer.map_growths();
  summary.seconds = elapsed();
  if (o.progress) o.progress(summary.items, summary.items, summary.seconds);
  return summary;
}

std::string SummaryJson(const ConvertSummary& s) {
  nlohmann::ordered_json j;
  j["db"] = s.db;
  j["items"] = s.items;
  j["converted"] = s.converted;
  j["reencoded"] = s.reencoded;
  j["skipped"] = s.skipped;
  j["ignored"] = s.ignored;
  j["classes"] = s.classes;
  j["bytes_read"] = s.bytes_read;
  j["bytes_written"] = s.bytes_written;
  j["map_growths"] = s.map_growths;
  j["seconds"] = s.seconds;
  j["images_per_s"] = s.seconds > 0 ? static_cast<double>(s.items) / s.seconds : 0.0;
  if (s.detection) {
    j["task"] = "detection";
    j["boxes"] = s.boxes;
    j["clipped_boxes"] = s.clipped_boxes;
    j["label_map"] = (fs::path(s.db) / kLabelMapFile).string();
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string SummaryText(const ConvertSummary& s) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "converted %lld of %lld images (%lld re-encoded), skipped %lld%s, %lld classes\n"
                "read %.1f MB, wrote %.1f MB in %.1f s (%.0f images/s) to %s",
                static_cast<long long>(s.converted), static_cast<long long>(s.items),
                static_cast<long long>(s.reencoded), static_cast<long long>(s.skipped),
                s.skipped > 0 ? " (listed in skipped.txt)" : "", static_cast<long long>(s.classes),
                s.bytes_read / 1e6, s.bytes_written / 1e6, s.seconds,
                s.seconds > 0 ? s.items / s.seconds : 0.0, s.db.c_str());
  std::string text = line;
  if (s.detection) {
    text +=
        StrCat("\n", s.boxes, " objects (", s.clipped_boxes, " clipped to their image); classes ",
               "numbered in ", (fs::path(s.db) / kLabelMapFile).string(), " (0 is the background)");
  }
  if (s.ignored > 0) {
    std::string some;
    for (size_t i = 0; i < s.ignored_files.size() && i < 3; ++i) {
      some += (i ? ", " : "") + s.ignored_files[i];
    }
    text += StrCat("\nignored ", s.ignored, " file(s) without an image extension: ", some,
                   s.ignored > 3 ? ", ..." : "", " (listed in skipped.txt)");
  }
  return text;
}

}  // namespace cortado
