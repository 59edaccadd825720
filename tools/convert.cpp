// `cortado convert --root DIR --out DB [--list FILE] [--classes FILE]
//                  [--resize-shorter N | --resize WxH] [--quality Q] [--gray] [--shuffle]
//                  [--seed S] [--threads T] [--overwrite] [--json]`
// `cortado convert --root VOC_ROOT [--root VOC_ROOT]... --split NAME --out DB [--label-map F] ...`
// `cortado convert --coco instances.json --root IMAGES --out DB [--label-map F] ...`
// A folder of images (ImageNet layout) or a Caffe list file to an LMDB of Caffe Datum records;
// Pascal VOC or COCO to an LMDB of Caffe SSD AnnotatedDatum records (docs/DETECTION.md). See
// data/converter.h for what is stored and data/README.md for the flags. Exits 0 when at
// least one image was converted (broken images are skipped and listed in DB/skipped.txt).
// SIGINT/SIGTERM stop it with exit status 128 + the signal (130, 143): its temporary is removed
// and DB is left as it was (absent, or the old database).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "data/converter.h"
#include "engine/base/error.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/stop_signals.h"

namespace cortado::tools {
namespace {

// "W x H" as two positive integers.
void ParseSize(const std::string& text, int* w, int* h) {
  int a = 0, b = 0;
  char x = 0, extra = 0;
  const int got = std::sscanf(text.c_str(), "%d%c%d%c", &a, &x, &b, &extra);
  if (got != 3 || (x != 'x' && x != 'X') || a <= 0 || b <= 0) {
    UsageFail("--resize takes WxH with positive W and H (for example 256x256), got '", text, "'");
  }
  *w = a;
  *h = b;
}

// A one-line progress bar on stderr: done/total, rate, ETA.
void DrawProgress(int64_t done, int64_t total, double seconds) {
  const int kWidth = 30;
  const double frac = total > 0 ? static_cast<double>(done) / total : 1.0;
  const int fill = static_cast<int>(frac * kWidth);
  const double rate = seconds > 0 ? done / seconds : 0.0;
  const double eta = rate > 0 ? (total - done) / rate : 0.0;
  std::string bar(static_cast<size_t>(fill), '=');
  if (fill < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r[%s] %lld/%lld %3.0f%% %7.0f img/s ETA %d:%02d  ", bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total), 100 * frac, rate,
               static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace

void AddConvertCommand(CLI::App& app) {
  struct Args {
    ConvertOptions options;
    std::vector<std::string> roots;
    std::string resize;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  ConvertOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Convert a folder of images (or a list file) to an LMDB of Caffe Datum records, or Pascal "
      "VOC / COCO to Caffe SSD AnnotatedDatum records");
  cmd->add_option("--root", args->roots,
                  "Image folder: ROOT/<class>/<image>, or the base of --list; a Pascal VOC root "
                  "(JPEGImages/, Annotations/; repeat --root to join several, as VOC07+12); with "
                  "--coco, its image folder")
      ->required();
  cmd->add_option("--out", o.out, "Database folder to create")->required();
  cmd->add_option("--list", o.list, "Caffe list file of 'relative/path label' lines");
  cmd->add_option("--classes", o.classes,
                  "Class list to reuse (e.g. TRAIN_DB/classes.txt), one name per line");
  cmd->add_option("--split", o.split,
                  "Pascal VOC: the image list ROOT/ImageSets/Main/<split>.txt (trainval, test)");
  cmd->add_option("--coco", o.coco,
                  "COCO: an instances_*.json; --root is the folder of its images");
  cmd->add_option("--label-map", o.label_map,
                  "Detection: number the classes as this label map does (e.g. "
                  "TRAIN_DB/labelmap.prototxt); default: as found");
  auto* shorter = cmd->add_option("--resize-shorter", o.resize_shorter,
                                  "Resize so the shorter side is N pixels (re-encodes all; 0: keep "
                                  "the size)")
                      ->check(IntAtLeast(0, "0: no resize"));
  cmd->add_option("--resize", args->resize, "Resize to exactly WxH (re-encodes all)")
      ->excludes(shorter);
  cmd->add_option("--quality", o.quality, "JPEG quality of re-encoded images")
      ->check(IntBetween(1, 100));
  cmd->add_flag("--gray", o.gray,
                "Store 1-channel (grey) records; by default every record is 3-channel (RGB)");
  cmd->add_flag("--shuffle", o.shuffle, "Shuffle the list before numbering the records");
  cmd->add_option("--seed", o.seed, "Seed for --shuffle")->check(IntAtLeast(0));
  cmd->add_option("--threads", o.threads, "Decode threads (0: the core count)")
      ->check(IntAtLeast(0, "0: the core count"));
  cmd->add_flag("--overwrite", o.overwrite,
                "Replace an existing database (kept until the new one is complete)");
  cmd->add_flag("--json", args->json, "Print the summary as one JSON object");
  cmd->callback([args] {
    ConvertOptions options = args->options;
    for (const std::string& root : args->roots) {
      CheckInputDir("--root", root, "the image folder (ROOT/<class>/<image>, or a VOC root)");
    }
    options.root = args->roots.front();
    options.extra_roots.assign(args->roots.begin() + 1, args->roots.end());
    if (!options.coco.empty()) {
      CheckInputFile("--coco", options.coco, "a COCO instances_*.json");
    }
    if (!options.label_map.empty()) {
      CheckInputFile("--label-map", options.label_map, "a label map (labelmap.prototxt)");
    }
    if (!options.list.empty()) {
      CheckInputFile("--list", options.list, "a list file of 'relative/path label' lines");
    }
    if (!options.classes.empty()) {
      CheckInputFile("--classes", options.classes, "a class list, one name per line");
    }
    if (!args->resize.empty())
      ParseSize(args->resize, &options.resize_width, &options.resize_height);
    if (isatty(STDERR_FILENO)) options.progress = DrawProgress;
    // Before the converter starts its threads, which inherit the blocked signals.
    StopSignals signals;
    options.stop = signals.flag();
    ConvertSummary summary;
    try {
      summary = ConvertImages(options);
    } catch (const Error& e) {
      if (!signals.flag()->load()) throw;
      if (options.progress) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "cortado convert: %s\n", e.what());
      SetExitCode(128 + signals.signal());
      return;
    }
    std::printf("%s\n", args->json ? SummaryJson(summary).c_str() : SummaryText(summary).c_str());
    std::fflush(stdout);
    if (summary.converted == 0) {
      std::fprintf(stderr,
                   "cortado convert: error: no image could be converted (see %s/skipped.txt)\n",
                   summary.db.c_str());
      SetExitCode(1);
      return;
    }
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
