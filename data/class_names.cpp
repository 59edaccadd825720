#include "data/class_names.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/base/error.h"

namespace cortado {
namespace {

std::string Hint(const DataOptions& o) {
  return StrCat("; convert the validation images with `cortado convert --classes ", o.train,
                "/classes.txt` so both use one list");
}

// "class 2 is 'owl' in data.train (...) but 'cat' in data.val (...)"; empty when they agree.
std::string FirstDifference(const std::vector<std::string>& train,
                            const std::vector<std::string>& val, const DataOptions& o) {
  const size_t n = std::max(train.size(), val.size());
  for (size_t i = 0; i < n; ++i) {
    auto name = [&](const std::vector<std::string>& v) {
      return i < v.size() ? "'" + v[i] + "'" : std::string("missing");
    };
    if (i < train.size() && i < val.size() && train[i] == val[i]) continue;
    return StrCat("class ", i, " is ", name(train), " in data.train (", o.train, ") but ",
                  name(val), " in data.val (", o.val, ")");
  }
  return "";
}

}  // namespace

std::optional<std::vector<std::string>> ReadClassNames(const std::string& db) {
  std::ifstream in(db + "/classes.txt");
  if (!in) return std::nullopt;
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) names.push_back(line);
  return names;
}

std::string CheckClassNames(const DataOptions& o) {
  // Evaluation may run where the training data is not (a checkpoint's config names it).
  std::error_code ec;
  if (o.type != "lmdb" || o.val.empty() || o.train.empty() ||
      !std::filesystem::exists(o.train, ec)) {
    return "";
  }
  const auto train = ReadClassNames(o.train), val = ReadClassNames(o.val);
  if (!train || !val) {
    return StrCat("data: ", !train ? "data.train (" + o.train + ")" : "data.val (" + o.val + ")",
                  " has no classes.txt (not written by cortado convert): its labels cannot be ",
                  "checked against the other database's class names");
  }
  const std::string diff = FirstDifference(*train, *val, o);
  CORTADO_CHECK(diff.empty(), "data.train and data.val name different classes (", train->size(),
                " and ", val->size(), "): ", diff, Hint(o));
  return "";
}

}  // namespace cortado
