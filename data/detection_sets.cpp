#include "data/detection_sets.h"

#include <tinyxml2.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/base/error.h"

namespace cortado {
namespace fs = std::filesystem;

namespace {

std::string Trim(std::string s) {
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && space(s.back())) s.pop_back();
  size_t first = 0;
  while (first < s.size() && space(s[first])) ++first;
  return s.substr(first);
}

// The trimmed text of child `name` of `parent`; "" when absent or empty.
std::string ChildText(const tinyxml2::XMLElement* parent, const char* name) {
  const tinyxml2::XMLElement* e = parent->FirstChildElement(name);
  return e != nullptr && e->GetText() != nullptr ? Trim(e->GetText()) : std::string();
}

// A number, the whole of `text` (VOC files hold integers; some VOC-style sets hold decimals).
bool ParseNumber(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(*out);
}

bool ReadText(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return static_cast<bool>(in) || in.eof();
}

}  // namespace

bool IsVocRoot(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(fs::path(dir) / "JPEGImages", ec) &&
         fs::is_directory(fs::path(dir) / "Annotations", ec);
}

bool ParseVocAnnotation(const std::string& xml, DetectionItem* item, std::string* why) {
  tinyxml2::XMLDocument doc;
  if (doc.Parse(xml.data(), xml.size()) != tinyxml2::XML_SUCCESS) {
    *why = StrCat("malformed XML (line ", doc.ErrorLineNum(), ": ", doc.ErrorStr(), ")");
    return false;
  }
  const tinyxml2::XMLElement* root = doc.FirstChildElement("annotation");
  if (root == nullptr) {
    *why = "no <annotation> element";
    return false;
  }
  item->width = item->height = 0;
  if (const tinyxml2::XMLElement* size = root->FirstChildElement("size")) {
    double w = 0, h = 0;
    const std::string wt = ChildText(size, "width"), ht = ChildText(size, "height");
    if (!ParseNumber(wt, &w) || !ParseNumber(ht, &h) || w < 0 || h < 0) {
      *why = StrCat("<size> is not a width and height ('", wt, "' x '", ht, "')");
      return false;
    }
    item->width = static_cast<int>(w);
    item->height = static_cast<int>(h);
  }
  item->boxes.clear();
  int index = 0;
  for (const tinyxml2::XMLElement* obj = root->FirstChildElement("object"); obj != nullptr;
       obj = obj->NextSiblingElement("object")) {
    ++index;
    PixelBox box;
    box.name = ChildText(obj, "name");
    const std::string which =
        StrCat("object ", index, box.name.empty() ? "" : " (" + box.name + ")");
    if (box.name.empty()) {
      *why = StrCat(which, ": no <name>");
      return false;
    }
    const std::string difficult = ChildText(obj, "difficult");
    if (!difficult.empty() && difficult != "0" && difficult != "1") {
      *why = StrCat(which, ": <difficult> is '", difficult, "', not 0 or 1");
      return false;
    }
    box.difficult = difficult == "1";
    const tinyxml2::XMLElement* bndbox = obj->FirstChildElement("bndbox");
    if (bndbox == nullptr) {
      *why = StrCat(which, ": no <bndbox>");
      return false;
    }
    double v[4];
    const char* const kCorners[4] = {"xmin", "ymin", "xmax", "ymax"};
    for (int k = 0; k < 4; ++k) {
      const std::string text = ChildText(bndbox, kCorners[k]);
      if (!ParseNumber(text, &v[k])) {
        *why = StrCat(which, ": <", kCorners[k], "> is '", text, "', not a number");
        return false;
      }
    }
    if (v[2] < v[0] || v[3] < v[1]) {
      *why = StrCat(which, ": box (", v[0], ", ", v[1], ") - (", v[2], ", ", v[3],
                    ") has xmax < xmin or ymax < ymin");
      return false;
    }
    // 1-based, inclusive pixel indices to continuous coordinates.
    box.xmin = v[0] - 1;
    box.ymin = v[1] - 1;
    box.xmax = v[2];
    box.ymax = v[3];
    item->boxes.push_back(std::move(box));
  }
  return true;
}

DetectionSet ListVoc(const std::vector<std::string>& roots, const std::string& split,
                     const std::atomic<bool>* stop) {
  CORTADO_CHECK(!roots.empty(), "no VOC root given");
  CORTADO_CHECK(!split.empty(), "a VOC root needs --split (the list ImageSets/Main/<split>.txt)");
  DetectionSet set;
  std::set<std::string> names;
  for (const std::string& root : roots) {
    CORTADO_CHECK(IsVocRoot(root), "--root '", root,
                  "' is not a Pascal VOC root (no JPEGImages/ and Annotations/ folders)");
    const fs::path main = fs::path(root) / "ImageSets" / "Main";
    const fs::path list = main / (split + ".txt");
    std::ifstream in(list);
    if (!in) {
      std::vector<std::string> splits;
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(main, ec)) {
        const std::string name = e.path().filename().string();
        // Main/ also holds one list per class (aeroplane_trainval.txt): name the plain splits.
        if (e.path().extension() == ".txt" && name.find('_') == std::string::npos) {
          splits.push_back(e.path().stem().string());
        }
      }
      std::sort(splits.begin(), splits.end());
      std::string known;
      for (const std::string& s : splits) known += (known.empty() ? "" : ", ") + s;
      Fail("--split ", split, ": cannot read ", list.string(),
           known.empty() ? std::string() : " (splits there: " + known + ")");
    }
    // The key names the root by its folder name, as Caffe SSD's lists name VOC2007/...
    std::string root_name = fs::path(root).lexically_normal().filename().string();
    if (root_name.empty()) {
      root_name = fs::path(root).lexically_normal().parent_path().filename().string();
    }
    std::string line;
    while (std::getline(in, line)) {
      if (stop != nullptr && stop->load()) Fail("interrupted while reading ", list.string());
      std::istringstream tokens(line);
      std::string id;
      if (!(tokens >> id)) continue;  // blank line
      DetectionItem item;
      item.file = (fs::path(root) / "JPEGImages" / (id + ".jpg")).string();
      item.key = root_name + "/JPEGImages/" + id + ".jpg";
      item.source = (fs::path(root) / "Annotations" / (id + ".xml")).string();
      std::string xml, why;
      if (!ReadText(item.source, &xml)) {
        item.error = StrCat("cannot read its annotation ", item.source);
      } else if (!ParseVocAnnotation(xml, &item, &why)) {
        item.error = StrCat("malformed annotation ", item.source, ": ", why);
      }
      // A skipped item names no class: a broken file must not add one.
      if (item.error.empty()) {
        for (const PixelBox& b : item.boxes) names.insert(b.name);
      } else {
        item.boxes.clear();
      }
      set.items.push_back(std::move(item));
    }
  }
  set.names.assign(names.begin(), names.end());
  set.display_names = set.names;
  return set;
}

DetectionSet ListCoco(const std::string& instances_json, const std::string& image_root) {
  using nlohmann::json;
  std::ifstream in(instances_json, std::ios::binary);
  CORTADO_CHECK(in, "--coco: cannot read '", instances_json, "'");
  // Segmentation polygons and RLE masks are most of the file: dropped while parsing, so a
  // train2017 file does not need gigabytes.
  const json::parser_callback_t drop_masks = [](int, json::parse_event_t event, json& parsed) {
    return !(event == json::parse_event_t::key && parsed == "segmentation");
  };
  json j;
  try {
    j = json::parse(in, drop_masks);
  } catch (const json::exception& e) {
    Fail("--coco ", instances_json, ": not JSON (", e.what(), ")");
  }
  const std::string where = "--coco " + instances_json;
  CORTADO_CHECK(j.is_object() && j.contains("images") && j["images"].is_array() &&
                    j.contains("annotations") && j["annotations"].is_array() &&
                    j.contains("categories") && j["categories"].is_array(),
                where, ": not a COCO instances file (want \"images\", \"annotations\" and ",
                "\"categories\" arrays)");
  DetectionSet set;
  // Categories in id order: labels 1..K.
  std::map<int64_t, std::string> categories;
  for (const json& c : j["categories"]) {
    CORTADO_CHECK(c.is_object() && c.contains("id") && c["id"].is_number_integer() &&
                      c.contains("name") && c["name"].is_string(),
                  where, ": a category without an integer \"id\" and a \"name\": ", c.dump());
    CORTADO_CHECK(categories.emplace(c["id"].get<int64_t>(), c["name"]).second, where,
                  ": category id ", c["id"].dump(), " is listed twice");
  }
  for (const auto& [id, name] : categories) {
    set.names.push_back(std::to_string(id));
    set.display_names.push_back(name);
  }
  std::map<int64_t, size_t> by_id;  // image id -> item
  std::vector<std::pair<int64_t, DetectionItem>> images;
  for (const json& im : j["images"]) {
    CORTADO_CHECK(im.is_object() && im.contains("id") && im["id"].is_number_integer() &&
                      im.contains("file_name") && im["file_name"].is_string(),
                  where, ": an image without an integer \"id\" and a \"file_name\": ", im.dump());
    DetectionItem item;
    item.key = im["file_name"].get<std::string>();
    item.file = (fs::path(image_root) / item.key).string();
    item.source =
        StrCat(fs::path(instances_json).filename().string(), " image id ", im["id"].get<int64_t>());
    if (im.contains("width") && im["width"].is_number_integer()) item.width = im["width"];
    if (im.contains("height") && im["height"].is_number_integer()) item.height = im["height"];
    images.emplace_back(im["id"].get<int64_t>(), std::move(item));
  }
  std::sort(images.begin(), images.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < images.size(); ++i) {
    CORTADO_CHECK(by_id.emplace(images[i].first, i).second, where, ": image id ", images[i].first,
                  " is listed twice");
  }
  for (const json& a : j["annotations"]) {
    CORTADO_CHECK(a.is_object() && a.contains("image_id") && a["image_id"].is_number_integer(),
                  where, ": an annotation without an integer \"image_id\": ", a.dump());
    const auto it = by_id.find(a["image_id"].get<int64_t>());
    CORTADO_CHECK(it != by_id.end(), where, ": an annotation refers to image id ",
                  a["image_id"].dump(), ", which is not in \"images\"");
    DetectionItem& item = images[it->second].second;
    if (!item.error.empty()) continue;
    const std::string which = StrCat("annotation ", a.contains("id") ? a["id"].dump() : "?");
    if (!a.contains("category_id") || !a["category_id"].is_number_integer() ||
        categories.count(a["category_id"].get<int64_t>()) == 0) {
      item.error = StrCat(item.source, ": ", which, " has category_id ",
                          a.contains("category_id") ? a["category_id"].dump() : "(none)",
                          ", not one of the categories");
      continue;
    }
    const json& bbox = a.contains("bbox") ? a["bbox"] : json();
    if (!bbox.is_array() || bbox.size() != 4 ||
        !std::all_of(bbox.begin(), bbox.end(), [](const json& v) { return v.is_number(); }) ||
        bbox[2].get<double>() < 0 || bbox[3].get<double>() < 0) {
      item.error = StrCat(item.source, ": ", which, " has bbox ", bbox.dump(),
                          ", not [x, y, width, height] with width, height >= 0");
      continue;
    }
    PixelBox box;
    box.name = std::to_string(a["category_id"].get<int64_t>());
    box.xmin = bbox[0].get<double>();
    box.ymin = bbox[1].get<double>();
    box.xmax = box.xmin + bbox[2].get<double>();
    box.ymax = box.ymin + bbox[3].get<double>();
    box.difficult = a.contains("iscrowd") && a["iscrowd"].is_number() && a["iscrowd"] != 0;
    item.boxes.push_back(std::move(box));
  }
  for (auto& [id, item] : images) set.items.push_back(std::move(item));
  return set;
}

}  // namespace cortado
