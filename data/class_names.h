// Class names of a database, and the check that training and validation name the same classes
// in the same order. A Cortado LMDB names its labels in classes.txt (line i names label i); a
// validation set converted without the training set's list (`cortado convert --classes`) may
// number the same classes differently, or lack some, and would evaluate silently wrong.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/data_options.h"

namespace cortado {

// The lines of `db`/classes.txt; nullopt without one (IDX data, another tool's LMDB).
std::optional<std::vector<std::string>> ReadClassNames(const std::string& db);

// Compares the class names of data.train and data.val (LMDB only; nothing to compare for other
// types, without data.val, or where data.train is not on this machine). Throws naming the first
// class that differs; returns a warning (empty when none) when either database names no classes, so
// nothing could be compared.
std::string CheckClassNames(const DataOptions& options);

}  // namespace cortado
