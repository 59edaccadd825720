#include "data/label_map.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "data/datum.pb.h"
#include "engine/base/error.h"

namespace cortado {
namespace {

// Keeps protobuf's text-format errors (line:column: message) for the exception, instead of
// letting protobuf print them to stderr.
class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

constexpr const char* kBackgroundName = "none_of_the_above";  // Caffe SSD's name for label 0

}  // namespace

std::vector<LabelMapEntry> ParseLabelMap(const std::string& text, const std::string& where) {
  caffe::LabelMap map;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  CORTADO_CHECK(parser.ParseFromString(text, &map), where, ":", errors.first(),
                " (expected a label map: item { name: \"...\" label: N display_name: \"...\" })");
  std::vector<LabelMapEntry> entries;
  std::set<std::string> names;
  std::set<int> labels;
  for (const caffe::LabelMapItem& item : map.item()) {
    CORTADO_CHECK(item.has_label(), where, ": item '", item.name(), "' has no label");
    CORTADO_CHECK(!item.name().empty(), where, ": label ", item.label(), " has no name");
    CORTADO_CHECK(item.label() >= 0, where, ": item '", item.name(), "' has label ", item.label(),
                  " (labels are 0 for the background, 1..K for the classes)");
    CORTADO_CHECK(names.insert(item.name()).second, where, ": name '", item.name(),
                  "' is listed twice");
    CORTADO_CHECK(labels.insert(item.label()).second, where, ": label ", item.label(),
                  " is listed twice");
    entries.push_back(LabelMapEntry{item.name(), item.label(),
                                    item.has_display_name() ? item.display_name() : item.name()});
  }
  if (labels.count(0) == 0) entries.push_back(LabelMapEntry{kBackgroundName, 0, "background"});
  std::sort(entries.begin(), entries.end(),
            [](const LabelMapEntry& a, const LabelMapEntry& b) { return a.label < b.label; });
  CORTADO_CHECK(entries.size() >= 2, where, ": the label map names no classes");
  for (size_t i = 0; i < entries.size(); ++i) {
    CORTADO_CHECK(entries[i].label == static_cast<int>(i), where, ": labels must be 1..K without",
                  " gaps, but label ", i, " is missing");
  }
  return entries;
}

std::vector<LabelMapEntry> ReadLabelMap(const std::string& path) {
  std::ifstream in(path);
  CORTADO_CHECK(in, "cannot read the label map '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  return ParseLabelMap(text.str(), path);
}

std::string LabelMapText(const std::vector<LabelMapEntry>& entries) {
  caffe::LabelMap map;
  for (const LabelMapEntry& e : entries) {
    caffe::LabelMapItem* item = map.add_item();
    item->set_name(e.name);
    item->set_label(e.label);
    item->set_display_name(e.display_name);
  }
  std::string text;
  CORTADO_CHECK(google::protobuf::TextFormat::PrintToString(map, &text),
                "cannot print a label map");
  return text;
}

std::vector<LabelMapEntry> MakeLabelMap(const std::vector<std::string>& names,
                                        const std::vector<std::string>& display_names) {
  CORTADO_ASSERT(display_names.empty() || display_names.size() == names.size());
  std::vector<LabelMapEntry> entries = {LabelMapEntry{kBackgroundName, 0, "background"}};
  for (size_t i = 0; i < names.size(); ++i) {
    entries.push_back(LabelMapEntry{names[i], static_cast<int>(i) + 1,
                                    display_names.empty() ? names[i] : display_names[i]});
  }
  return entries;
}

}  // namespace cortado
