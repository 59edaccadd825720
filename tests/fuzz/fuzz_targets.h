// Fuzz targets: each takes arbitrary bytes and must either accept them or reject them with a
// cortado::Error. Anything else (another exception, a crash, a sanitizer report) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cortado::fuzz {

struct Target {
  const char* name;
  const char* what;  // the code under test, for --list
  void (*run)(const uint8_t* data, size_t size);
};

// All targets, ending with {nullptr, nullptr, nullptr}.
const Target* Targets();

}  // namespace cortado::fuzz
