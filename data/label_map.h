// The label map of a detection database: Caffe SSD's labelmap.prototxt (LabelMap in
// data/datum.proto, protobuf text format), which names each class label:
//
//   item { name: "none_of_the_above" label: 0 display_name: "background" }
//   item { name: "aeroplane" label: 1 display_name: "aeroplane" }
//   ...
//
// Label 0 is the background; the classes are 1..K, contiguous. `name` is what annotations call
// the class (a VOC XML <name>; for COCO, the category id as text, as Caffe SSD's
// labelmap_coco.prototxt has it); `display_name` is what reports print. `cortado convert` writes
// DB/labelmap.prototxt beside a detection database, and takes one (--label-map) to number a
// second set (the test set) as the first.
#pragma once

#include <string>
#include <vector>

namespace cortado {

// The label map's file name inside a detection database folder.
inline constexpr const char* kLabelMapFile = "labelmap.prototxt";

struct LabelMapEntry {
  std::string name;
  int label = 0;
  std::string display_name;
};

// Parses a label map and checks it: names and labels unique, labels 1..K contiguous (label 0,
// the background, optional). Sorted by label, with a background entry added when absent.
// Throws cortado::Error naming `where` (a path) and the problem.
std::vector<LabelMapEntry> ParseLabelMap(const std::string& text, const std::string& where);
std::vector<LabelMapEntry> ReadLabelMap(const std::string& path);

// The text of a label map (protobuf text format, as Caffe SSD's files are written).
std::string LabelMapText(const std::vector<LabelMapEntry>& entries);

// A label map for classes named `names` (labels 1..K in that order) with the background as 0.
std::vector<LabelMapEntry> MakeLabelMap(const std::vector<std::string>& names,
                                        const std::vector<std::string>& display_names = {});

}  // namespace cortado
