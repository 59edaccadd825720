// What detection evaluation writes (tools/detection_eval.h): the metrics as the JSON of
// `cortado eval --json`, and detections as a COCO results file.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/error.h"
#include "engine/base/file_io.h"
#include "tools/detection_eval.h"

namespace cortado::detection {

nlohmann::ordered_json MetricsJson(const DetectionMetrics& m, bool voc07,
                                   const std::vector<std::string>& names) {
  // JSON has no NaN: a metric without a value is null.
  auto value = [](double v) {
    return std::isnan(v) ? nlohmann::ordered_json() : nlohmann::ordered_json(v);
  };
  nlohmann::ordered_json j;
  j["map50"] = value(voc07 ? m.voc07_map : m.voc_map);
  j["map"] = value(m.coco_map);
  j["map50_11point"] = value(m.voc07_map);
  j["map50_area"] = value(m.voc_map);
  j["coco_map50"] = value(m.coco_map50);
  j["coco_map75"] = value(m.coco_map75);
  j["coco_map_small"] = value(m.coco_map_area[0]);
  j["coco_map_medium"] = value(m.coco_map_area[1]);
  j["coco_map_large"] = value(m.coco_map_area[2]);
  j["images"] = m.images;
  nlohmann::ordered_json classes = nlohmann::ordered_json::object();
  for (int c = 1; c <= m.num_classes; ++c) {
    const size_t i = static_cast<size_t>(c - 1);
    const std::string name = i < names.size() ? names[i] : std::to_string(c);
    classes[name] = {{"ap50", value(voc07 ? m.voc07_ap[i] : m.voc_ap[i])},
                     {"ap", value(m.coco_ap[i])},
                     {"boxes", m.positives[i]},
                     {"detections", m.detections[i]}};
  }
  j["classes"] = classes;
  return j;
}

CocoResults::CocoResults(std::vector<int64_t> category_ids)
    : category_ids_(std::move(category_ids)) {}

void CocoResults::Add(std::span<const Detection> detections, std::span<const ImageInfo> images) {
  for (const Detection& d : detections) {
    CORTADO_CHECK(d.item >= 0 && d.item < static_cast<int64_t>(images.size()),
                  "COCO results: a detection of item ", d.item, " in a batch of ", images.size(),
                  " image(s)");
    const ImageInfo& im = images[static_cast<size_t>(d.item)];
    CORTADO_CHECK(im.width > 0 && im.height > 0, "COCO results: image ", im.id,
                  " has no size; its boxes cannot be written in pixels");
    int64_t category = d.label;
    if (!category_ids_.empty()) {
      CORTADO_CHECK(d.label >= 1 && static_cast<size_t>(d.label) <= category_ids_.size(),
                    "COCO results: class ", d.label, " has no category id (", category_ids_.size(),
                    " known)");
      category = category_ids_[static_cast<size_t>(d.label - 1)];
    }
    const double x = d.box.xmin * im.width, y = d.box.ymin * im.height;
    entries_.push_back({{"image_id", im.id},
                        {"category_id", category},
                        {"bbox", {x, y, d.box.xmax * im.width - x, d.box.ymax * im.height - y}},
                        {"score", d.score}});
  }
}

std::string CocoResults::Json() const { return entries_.dump(); }

void CocoResults::Write(const std::string& path) const { WriteFileAtomically(path, Json() + "\n"); }

}  // namespace cortado::detection
