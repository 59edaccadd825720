#include "engine/io/settings.h"

#include <charconv>
#include <cmath>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/numbers.h"

namespace cortado {
namespace {

bool ParseInt(const std::string& s, int64_t* out) { return ParseInt64(s, out); }
bool ParseDouble(const std::string& s, double* out) { return ParseFiniteDouble(s, out); }

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

}  // namespace

Settings& Settings::Set(const std::string& key, const std::string& value,
                        const std::string& where) {
  values_[key] = Value{{value}, false, where};
  return *this;
}
Settings& Settings::Set(const std::string& key, int64_t value) {
  return Set(key, std::to_string(value));
}
Settings& Settings::Set(const std::string& key, double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return Set(key, out.str());
}
Settings& Settings::Set(const std::string& key, bool value) {
  return Set(key, std::string(value ? "true" : "false"));
}
Settings& Settings::SetList(const std::string& key, const std::vector<std::string>& items,
                            const std::string& where) {
  values_[key] = Value{items, true, where};
  return *this;
}
Settings& Settings::SetInts(const std::string& key, const std::vector<int64_t>& items) {
  std::vector<std::string> text;
  for (int64_t v : items) text.push_back(std::to_string(v));
  return SetList(key, text);
}

const Settings::Value& Settings::Lookup(const std::string& key) const {
  used_.insert(key);
  return values_.at(key);
}

void Settings::BadValue(const std::string& key, const std::string& want) const {
  const Value& v = values_.at(key);
  std::string shown = v.is_list ? "[" + Join(v.items) + "]" : (v.items.empty() ? "" : v.items[0]);
  std::string where = v.where.empty() ? "" : " (" + v.where + ")";
  Fail(owner_, ": key '", key, "' expects ", want, ", got '", shown, "'", where);
}

int64_t Settings::GetInt(const std::string& key, int64_t fallback) const {
  used_.insert(key);  // a key asked for is a known key, present or not
  if (!Has(key)) return fallback;
  return GetInt(key);
}

int64_t Settings::GetInt(const std::string& key) const {
  if (!Has(key)) Fail(owner_, ": missing required key '", key, "'");
  const Value& v = Lookup(key);
  int64_t out = 0;
  if (v.is_list || v.items.size() != 1 || !ParseInt(v.items[0], &out)) BadValue(key, "an integer");
  return out;
}

double Settings::GetFloat(const std::string& key, double fallback) const {
  used_.insert(key);  // a key asked for is a known key, present or not
  if (!Has(key)) return fallback;
  const Value& v = Lookup(key);
  double out = 0;
  if (v.is_list || v.items.size() != 1 || !ParseDouble(v.items[0], &out)) BadValue(key, "a number");
  return out;
}

bool Settings::GetBool(const std::string& key, bool fallback) const {
  used_.insert(key);  // a key asked for is a known key, present or not
  if (!Has(key)) return fallback;
  const Value& v = Lookup(key);
  if (!v.is_list && v.items.size() == 1) {
    if (v.items[0] == "true") return true;
    if (v.items[0] == "false") return false;
  }
  BadValue(key, "true or false");
}

std::string Settings::GetString(const std::string& key, const std::string& fallback) const {
  used_.insert(key);  // a key asked for is a known key, present or not
  if (!Has(key)) return fallback;
  return GetString(key);
}

std::string Settings::GetString(const std::string& key) const {
  if (!Has(key)) Fail(owner_, ": missing required key '", key, "'");
  const Value& v = Lookup(key);
  if (v.is_list || v.items.size() != 1) BadValue(key, "a string");
  return v.items[0];
}

std::vector<int64_t> Settings::GetInts(const std::string& key,
                                       const std::vector<int64_t>& fallback) const {
  used_.insert(key);  // a key asked for is a known key, present or not
  if (!Has(key)) return fallback;
  const Value& v = Lookup(key);
  std::vector<int64_t> out;
  for (const std::string& item : v.items) {
    int64_t x = 0;
    if (!ParseInt(item, &x)) BadValue(key, "a list of integers");
    out.push_back(x);
  }
  return out;
}

std::vector<double> Settings::GetFloats(const std::string& key,
                                        const std::vector<double>& fallback) const {
  used_.insert(key);  // a key asked for is a known key, present or not
  if (!Has(key)) return fallback;
  const Value& v = Lookup(key);
  std::vector<double> out;
  for (const std::string& item : v.items) {
    double x = 0;
    if (!ParseDouble(item, &x)) BadValue(key, "a list of numbers");
    out.push_back(x);
  }
  return out;
}

std::vector<int64_t> Settings::GetPair(const std::string& key, int64_t fallback) const {
  std::vector<int64_t> v = GetInts(key, {fallback});
  if (v.size() == 1) v.push_back(v[0]);
  if (v.size() != 2) BadValue(key, "an integer or a pair [h, w]");
  return v;
}

void Settings::CheckAllUsed() const {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : values_) {
    if (!used_.count(key)) {
      std::string where = value.where.empty() ? "" : " (" + value.where + ")";
      std::vector<std::string> known(used_.begin(), used_.end());
      Fail(owner_, ": unknown key '", key, "'", where,
           known.empty() ? std::string() : "; known keys: " + Join(known));
    }
  }
}

std::vector<std::string> Settings::Keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, value] : values_) keys.push_back(key);
  return keys;
}

std::string Settings::Where(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? "" : it->second.where;
}

}  // namespace cortado
