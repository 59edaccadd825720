// Test helper: what a failing call says.
#pragma once

#include <string>
#include <utility>

#include "engine/base/error.h"

namespace cortado::testing {

// The message of the cortado::Error that fn throws, "" when it throws none.
template <typename Fn>
std::string ErrorOf(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace cortado::testing
