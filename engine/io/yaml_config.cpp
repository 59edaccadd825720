#include "engine/io/yaml_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/base/closest_name.h"
#include "engine/base/error.h"
#include "engine/base/numbers.h"

namespace cortado {
namespace {

std::string Join(const std::set<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string Shown(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

bool ParseInt(const std::string& s, int64_t* out) { return ParseInt64(s, out); }

// The YAML of an effective value: numbers in their shortest round-trip form.
YAML::Node AsYaml(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return YAML::Node(std::string(buf, r.ptr));
}
YAML::Node AsYaml(int64_t v) { return YAML::Node(std::to_string(v)); }
YAML::Node AsYaml(bool v) { return YAML::Node(v ? "true" : "false"); }
YAML::Node AsYaml(const std::string& v) { return YAML::Node(v); }
template <typename T>
YAML::Node AsYaml(const std::vector<T>& v) {
  YAML::Node list(YAML::NodeType::Sequence);
  for (const T& x : v) list.push_back(AsYaml(x));
  list.SetStyle(YAML::EmitterStyle::Flow);
  return list;
}
bool ParseFloat(const std::string& s, double* out) { return ParseFiniteDouble(s, out); }

// A list or mapping where a key belongs (`[a, b]: 1`) names nothing.
void RequireNameKey(const YamlConfig& config, const YAML::Node& key, const std::string& path) {
  if (key.IsScalar()) return;
  const std::string where = config.WhereOf(key, path);
  Fail(where.empty() ? "" : where + ": ", "a key ", path.empty() ? "" : "in " + path + " ",
       "is not a name (a list or mapping where a key belongs)");
}

}  // namespace

YamlSection::YamlSection(const YamlConfig* config, YAML::Node node, std::string path)
    : config_(config), node_(node), path_(std::move(path)) {}

std::string YamlSection::Path(const std::string& key) const {
  if (key.empty()) return path_;
  return path_.empty() ? key : path_ + "." + key;
}

std::string YamlSection::Where(const std::string& key) const {
  if (key.empty() || !node_.IsMap() || !node_[key]) return config_->WhereOf(node_, path_);
  return config_->WhereOf(node_[key], Path(key));
}

void YamlSection::Error(const std::string& key, const std::string& message) const {
  std::string where = Where(key);
  Fail(where.empty() ? "" : where + ": ", Path(key), ": ", message);
}

void YamlSection::TypeError(const std::string& key, const std::string& want) const {
  Error(key, StrCat("expected ", want, ", got '", Shown(node_[key]), "'"));
}

void YamlSection::Ask(const std::string& key) const {
  if (declared_ && std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
    Fail("internal error: ", Path(key), " is read but not declared among the keys of ",
         path_.empty() ? "the top level" : path_);
  }
  asked_.insert(key);
}

bool YamlSection::Has(const std::string& key) const {
  Ask(key);
  return node_.IsMap() && node_[key] && !node_[key].IsNull();
}

YAML::Node YamlSection::Get(const std::string& key) const {
  Ask(key);
  return node_[key];
}

template <typename T>
T YamlSection::Effective(const std::string& key, const T& value) const {
  config_->Record(path_, key, AsYaml(value));
  return value;
}

int64_t YamlSection::Int(const std::string& key, int64_t fallback) const {
  if (!Has(key)) return Effective(key, fallback);
  YAML::Node n = Get(key);
  int64_t v = 0;
  if (!n.IsScalar() || !ParseInt(n.Scalar(), &v)) TypeError(key, "an integer");
  return Effective(key, v);
}

double YamlSection::Float(const std::string& key, double fallback) const {
  if (!Has(key)) return Effective(key, fallback);
  YAML::Node n = Get(key);
  double v = 0;
  if (!n.IsScalar() || !ParseFloat(n.Scalar(), &v)) TypeError(key, "a number");
  return Effective(key, v);
}

bool YamlSection::Bool(const std::string& key, bool fallback) const {
  if (!Has(key)) return Effective(key, fallback);
  YAML::Node n = Get(key);
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "yes" || s == "on") return Effective(key, true);
    if (s == "false" || s == "False" || s == "no" || s == "off") return Effective(key, false);
  }
  TypeError(key, "true or false");
}

std::string YamlSection::String(const std::string& key, const std::string& fallback) const {
  if (!Has(key)) return Effective(key, fallback);
  YAML::Node n = Get(key);
  if (!n.IsScalar()) TypeError(key, "a string");
  return Effective(key, n.Scalar());
}

std::vector<double> YamlSection::Floats(const std::string& key,
                                        const std::vector<double>& fallback) const {
  if (!Has(key)) return Effective(key, fallback);
  YAML::Node n = Get(key);
  std::vector<double> out;
  double v = 0;
  if (n.IsScalar() && ParseFloat(n.Scalar(), &v)) return Effective(key, std::vector<double>{v});
  if (!n.IsSequence()) TypeError(key, "a list of numbers");
  for (const YAML::Node& item : n) {
    if (!item.IsScalar() || !ParseFloat(item.Scalar(), &v)) TypeError(key, "a list of numbers");
    out.push_back(v);
  }
  return Effective(key, out);
}

std::vector<int64_t> YamlSection::Ints(const std::string& key,
                                       const std::vector<int64_t>& fallback) const {
  if (!Has(key)) return Effective(key, fallback);
  YAML::Node n = Get(key);
  std::vector<int64_t> out;
  int64_t v = 0;
  if (n.IsScalar() && ParseInt(n.Scalar(), &v)) return Effective(key, std::vector<int64_t>{v});
  if (!n.IsSequence()) TypeError(key, "a list of integers");
  for (const YAML::Node& item : n) {
    if (!item.IsScalar() || !ParseInt(item.Scalar(), &v)) TypeError(key, "a list of integers");
    out.push_back(v);
  }
  return Effective(key, out);
}

YamlSection YamlSection::Section(const std::string& key) const {
  if (!Has(key)) return YamlSection(config_, YAML::Node(YAML::NodeType::Map), Path(key));
  YAML::Node n = Get(key);
  if (!n.IsMap()) TypeError(key, "a mapping of keys");
  return YamlSection(config_, n, Path(key));
}

YAML::Node YamlSection::Node(const std::string& key) const {
  YAML::Node n = Get(key);
  if (n) config_->Record(path_, key, n);
  return n;
}

void YamlSection::Resolve(const std::string& key, const YAML::Node& value) const {
  Ask(key);
  config_->Record(path_, key, value);
}

void YamlSection::Declare(std::span<const std::string_view> keys,
                          std::span<const std::string_view> not_offered) {
  declared_ = true;
  keys_.assign(keys.begin(), keys.end());
  if (!node_.IsMap()) return;
  std::vector<std::string> offered;
  for (const std::string& k : keys_) {
    if (std::find(not_offered.begin(), not_offered.end(), k) == not_offered.end()) {
      offered.push_back(k);
    }
  }
  for (const auto& item : node_) {
    RequireNameKey(*config_, item.first, path_);
    if (std::find(keys_.begin(), keys_.end(), item.first.Scalar()) == keys_.end()) {
      UnknownKey(item.first, offered);
    }
  }
}

void YamlSection::UnknownKey(const YAML::Node& key, const std::vector<std::string>& known) const {
  const std::string name = key.Scalar();
  const std::string where = config_->WhereOf(key, Path(name));
  const std::string best = ClosestName(name, known);
  const std::string hint = !best.empty()
                               ? "did you mean '" + best + "'?"
                               : StrCat("known", path_.empty() ? "" : " in " + path_, ": ",
                                        Join(std::set<std::string>(known.begin(), known.end())));
  Fail(where.empty() ? "" : where + ": ", "unknown key '", Path(name), "' (", hint, ")");
}

void YamlSection::Finish() const {
  for (const std::string& key : keys_) {
    CORTADO_CHECK(asked_.count(key), "internal error: ", Path(key),
                  " is declared but nothing read it");
  }
  if (!node_.IsMap()) return;
  for (const auto& item : node_) {
    RequireNameKey(*config_, item.first, path_);
    if (!asked_.count(item.first.Scalar())) {
      UnknownKey(item.first, std::vector<std::string>(asked_.begin(), asked_.end()));
    }
  }
}

YamlConfig YamlConfig::FromFile(const std::string& path) {
  std::ifstream in(path);
  CORTADO_CHECK(in.good(), "cannot open config file '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  return FromString(text.str(), path);
}

namespace {

// yaml-cpp keeps every entry of a mapping that repeats a key, and lookups find the first: a
// config's later `batch_size: 8` would be ignored. Refused, naming both lines.
void RefuseDuplicateKeys(const YAML::Node& node, const std::string& path, const std::string& name) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      RefuseDuplicateKeys(node[i], StrCat(path, "[", i, "]"), name);
    }
  }
  if (!node.IsMap()) return;
  std::map<std::string, int> lines;
  for (const auto& item : node) {
    if (!item.first.IsScalar()) continue;  // Finish() names a key that is not a name
    const std::string key = item.first.Scalar();
    const std::string key_path = path.empty() ? key : path + "." + key;
    const int line = item.first.Mark().line + 1;
    const auto [first, fresh] = lines.emplace(key, line);
    CORTADO_CHECK(fresh, name, ":", line, ": duplicate key '", key_path, "' (first at line ",
                  first->second, "); give each key once");
    RefuseDuplicateKeys(item.second, key_path, name);
  }
}

// YAML forbids tabs in indentation; yaml-cpp's own word for it is "illegal map value".
void RefuseTabIndentation(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const size_t indent = line.find_first_not_of(" \t");
    const size_t tab = line.find('\t');
    if (indent == std::string::npos) continue;  // a blank line
    CORTADO_CHECK(tab == std::string::npos || tab >= indent, name, ":", number, ":", tab + 1,
                  ": tabs are not allowed in YAML indentation; indent with spaces");
  }
}

}  // namespace

YamlConfig YamlConfig::FromString(const std::string& text, const std::string& name) {
  RefuseTabIndentation(text, name);
  YamlConfig config;
  config.file_ = name;
  try {
    config.root_ = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    Fail(name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg);
  }
  if (config.root_.IsNull()) config.root_ = YAML::Node(YAML::NodeType::Map);
  CORTADO_CHECK(config.root_.IsMap(), name, ": the top level must be a mapping of keys");
  RefuseDuplicateKeys(config.root_, "", name);
  return config;
}

void YamlConfig::Set(const std::string& assignment) {
  size_t eq = assignment.find('=');
  CORTADO_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment,
                "': expected key.path=value");
  std::string path = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    Fail("--set ", assignment, ": value is not valid YAML: ", e.msg);
  }
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    CORTADO_CHECK(!part.empty(), "--set ", assignment, ": empty component in key '", path, "'");
    parts.push_back(part);
  }
  // yaml-cpp nodes are references: `a = b` would overwrite a's content, so the walk re-seats
  // its handle with reset().
  YAML::Node node;
  node.reset(root_);
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + parts[i];
    YAML::Node child = node[parts[i]];
    if (!child || child.IsNull()) {
      node[parts[i]] = YAML::Node(YAML::NodeType::Map);
      child.reset(node[parts[i]]);
      overrides_[walked] = assignment;  // a mapping this --set created
    }
    CORTADO_CHECK(child.IsMap(), "--set ", assignment, ": '", walked, "' is not a mapping");
    node.reset(child);
  }
  node[parts.back()] = value;
  overrides_[path] = assignment;
}

std::string YamlConfig::WhereOf(const YAML::Node& node, const std::string& path) const {
  auto it = overrides_.find(path);
  if (it != overrides_.end()) return "--set " + it->second;
  if (node && !node.Mark().is_null()) {
    return StrCat(file_, ":", node.Mark().line + 1, ":", node.Mark().column + 1);
  }
  return file_;
}

void YamlConfig::Record(const std::string& section, const std::string& key,
                        const YAML::Node& value) const {
  // As in Set: yaml-cpp nodes are references, so the walk re-seats its handle with reset().
  YAML::Node node;
  node.reset(resolved_);
  std::stringstream ss(section);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!node[part] || !node[part].IsMap()) node[part] = YAML::Node(YAML::NodeType::Map);
    YAML::Node child = node[part];
    node.reset(child);
  }
  node[key] = YAML::Clone(value);
}

std::string YamlConfig::Resolved() const {
  YAML::Emitter out;
  out << resolved_;
  return out.c_str();
}

std::string YamlConfig::Dump() const {
  YAML::Emitter out;
  out << root_;
  return out.c_str();
}

namespace {

void Flatten(const YAML::Node& node, const std::string& path,
             std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      Flatten(kv.second, path.empty() ? key : path + "." + key, out);
    }
    // An empty mapping is a value too (codec_overrides: {}), as an empty list is.
    if (node.size() == 0 && !path.empty()) out[path] = "{}";
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      Flatten(node[i], path + "[" + std::to_string(i) + "]", out);
    }
    if (node.size() == 0) out[path] = "[]";
  } else if (node.IsScalar()) {
    out[path] = node.Scalar();
  } else {
    out[path] = "null";
  }
}

}  // namespace

std::map<std::string, std::string> FlattenYaml(const std::string& text, const std::string& name) {
  std::map<std::string, std::string> out;
  try {
    Flatten(YAML::Load(text), "", out);
  } catch (const YAML::Exception& e) {
    Fail(name, ": not valid YAML: ", e.what());
  }
  return out;
}

std::vector<std::string> YamlDifferences(const std::string& before, const std::string& after) {
  const auto a = FlattenYaml(before, "the earlier config");
  const auto b = FlattenYaml(after, "the later config");
  std::vector<std::string> out;
  auto ia = a.begin();
  auto ib = b.begin();
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      out.push_back(ia->first + ": " + ia->second + " -> (unset)");
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      out.push_back(ib->first + ": (unset) -> " + ib->second);
      ++ib;
    } else {
      if (ia->second != ib->second) {
        out.push_back(ia->first + ": " + ia->second + " -> " + ib->second);
      }
      ++ia;
      ++ib;
    }
  }
  return out;
}

}  // namespace cortado
