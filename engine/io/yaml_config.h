// Strict YAML reading for configuration files.
//
// Every getter also records the value it returns, the default where the key is absent, so
// Resolved() is the whole configuration as it was used: every key read, with its effective
// value (checkpoints store it, so a default that changes later cannot change an old run).
//
// A YamlConfig holds one parsed file plus command-line overrides (`--set a.b=v`). Sections are
// read with typed getters that record which keys were read; Finish() then rejects any key
// nobody read. A section that Declare()s its keys is checked against them before any value is
// read, so a misspelled required key is named as unknown, not as missing. Every error is one
// line naming the key path and where it came from:
//   configs/x.yaml:12:5: solver.base_lr: expected a number, got 'fast'
//   --set solver.base_lrr=0.05: unknown key 'solver.base_lrr' (did you mean 'base_lr'?)
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cortado {

class YamlConfig;

// One mapping in the document, e.g. `solver:`.
class YamlSection {
 public:
  YamlSection(const YamlConfig* config, YAML::Node node, std::string path);

  bool Has(const std::string& key) const;
  int64_t Int(const std::string& key, int64_t fallback) const;
  double Float(const std::string& key, double fallback) const;
  bool Bool(const std::string& key, bool fallback) const;
  std::string String(const std::string& key, const std::string& fallback) const;
  std::vector<double> Floats(const std::string& key, const std::vector<double>& fallback) const;
  std::vector<int64_t> Ints(const std::string& key, const std::vector<int64_t>& fallback) const;
  // A nested mapping; an absent key gives an empty section.
  YamlSection Section(const std::string& key) const;
  // The raw node (marks the key as read); for structures such as a layer list. Resolved() gets
  // the node as written, and nothing when the key is absent: a caller that has a default, or a
  // canonical form, records the effective value with Resolve.
  YAML::Node Node(const std::string& key) const;
  // Records `value` as the effective value of `key` (YamlConfig::Resolved), replacing what Node
  // recorded: for structures read through Has and Node, whose defaults no getter sees.
  void Resolve(const std::string& key, const YAML::Node& value) const;

  // "file.yaml:line:col" or "--set k=v" for the key (or the section when key is empty).
  std::string Where(const std::string& key = "") const;
  std::string Path(const std::string& key) const;  // "solver.base_lr"
  // The keys this section accepts, checked at once: the first key of the section not among them
  // is refused with its place and the closest declared key ("did you mean 'max_iter'?"), or the
  // declared list when none is close. From then on a getter (or Has) on an undeclared key, and
  // a declared key that nothing asked about by Finish(), are internal errors: the list and the
  // code that reads the section cannot drift apart unnoticed. `not_offered`: declared keys that
  // this document cannot use (warmup_epochs in an iteration-based run, which the reader refuses
  // naming the right key), never suggested for a misspelled key nor listed.
  void Declare(std::span<const std::string_view> keys,
               std::span<const std::string_view> not_offered = {});
  // Throws on the first key that no getter asked for.
  void Finish() const;
  [[noreturn]] void Error(const std::string& key, const std::string& message) const;

 private:
  YAML::Node Get(const std::string& key) const;
  // Records that `key` was asked about; an undeclared key of a declared section is an internal
  // error.
  void Ask(const std::string& key) const;
  [[noreturn]] void UnknownKey(const YAML::Node& key, const std::vector<std::string>& known) const;
  // Records `value` as the effective value of `key` (YamlConfig::Resolved) and returns it.
  template <typename T>
  T Effective(const std::string& key, const T& value) const;
  [[noreturn]] void TypeError(const std::string& key, const std::string& want) const;

  const YamlConfig* config_;
  YAML::Node node_;
  std::string path_;
  mutable std::set<std::string> asked_;
  bool declared_ = false;
  std::vector<std::string> keys_;  // the declared keys, in declaration order
};

class YamlConfig {
 public:
  // Parses a file; throws naming the file and, for syntax errors, line:column.
  static YamlConfig FromFile(const std::string& path);
  static YamlConfig FromString(const std::string& text, const std::string& name);

  // Applies "a.b.c=value" (value parsed as YAML, so lists work: data.mean=[0.5]).
  void Set(const std::string& assignment);

  YamlSection Root() const { return YamlSection(this, root_, ""); }
  const std::string& file() const { return file_; }
  // The document with overrides applied, as YAML text (saved in checkpoints).
  std::string Dump() const;
  // Where a node came from: its mark in the file, or the --set argument that made it.
  std::string WhereOf(const YAML::Node& node, const std::string& path) const;
  // Every key a getter read, with the value it returned (defaults included), in reading order,
  // as YAML text.
  std::string Resolved() const;
  // Records the value of key `key` in section `section` ("" or "a.b") for Resolved().
  void Record(const std::string& section, const std::string& key, const YAML::Node& value) const;

 private:
  std::string file_;
  YAML::Node root_;
  std::map<std::string, std::string> overrides_;  // key path -> the --set argument
  mutable YAML::Node resolved_{YAML::NodeType::Map};
};

// Every leaf of a YAML document by its key path ("solver.base_lr", "model.layers[2].type"), as
// YAML text; throws on a syntax error, naming `name`.
std::map<std::string, std::string> FlattenYaml(const std::string& text, const std::string& name);
// The leaves that differ between two documents, each as "key: before -> after" ("(unset)"
// for a key only one of them has), in key order.
std::vector<std::string> YamlDifferences(const std::string& before, const std::string& after);

}  // namespace cortado
