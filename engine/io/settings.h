// Settings: the key/value options of one layer (kernel: 5, stride: 2, ...), as read from a YAML
// graph or set by a C++ builder in models/.
//
// Each value remembers where it came from ("configs/x.yaml:12:7") so a bad value is reported
// at its line and column. Getters record which keys were read; after SetUp the net calls
// CheckAllUsed() so a misspelt key stops the run instead of being silently ignored.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace cortado {

class Settings {
 public:
  // owner: used in messages, e.g. "layer 'conv1' (Convolution)".
  void set_owner(std::string owner) { owner_ = std::move(owner); }
  const std::string& owner() const { return owner_; }

  // Scalars are stored as text; a list as several items.
  Settings& Set(const std::string& key, const std::string& value, const std::string& where = "");
  Settings& Set(const std::string& key, const char* value) { return Set(key, std::string(value)); }
  Settings& Set(const std::string& key, int64_t value);
  Settings& Set(const std::string& key, int value) { return Set(key, int64_t{value}); }
  Settings& Set(const std::string& key, double value);
  Settings& Set(const std::string& key, bool value);
  Settings& SetList(const std::string& key, const std::vector<std::string>& items,
                    const std::string& where = "");
  Settings& SetInts(const std::string& key, const std::vector<int64_t>& items);

  bool Has(const std::string& key) const { return values_.count(key) != 0; }
  int64_t GetInt(const std::string& key, int64_t fallback) const;
  int64_t GetInt(const std::string& key) const;  // required
  double GetFloat(const std::string& key, double fallback) const;
  bool GetBool(const std::string& key, bool fallback) const;
  std::string GetString(const std::string& key, const std::string& fallback) const;
  std::string GetString(const std::string& key) const;  // required
  // A scalar n reads as {n}; a list as its items.
  std::vector<int64_t> GetInts(const std::string& key, const std::vector<int64_t>& fallback) const;
  // A scalar x reads as {x}; a list as its items (e.g. Eltwise coeffs: [1, -0.5]).
  std::vector<double> GetFloats(const std::string& key, const std::vector<double>& fallback) const;
  // An integer setting given as one value or as a pair [h, w]: returns {h, w}.
  std::vector<int64_t> GetPair(const std::string& key, int64_t fallback) const;

  // Throws naming the first key that no getter read, with the keys that are known.
  void CheckAllUsed() const;
  std::vector<std::string> Keys() const;
  // Where a key was defined, or "" for settings made in code.
  std::string Where(const std::string& key) const;

 private:
  struct Value {
    std::vector<std::string> items;
    bool is_list = false;
    std::string where;
  };
  const Value& Lookup(const std::string& key) const;
  [[noreturn]] void BadValue(const std::string& key, const std::string& want) const;

  std::string owner_;
  std::map<std::string, Value> values_;
  mutable std::set<std::string> used_;
};

}  // namespace cortado
