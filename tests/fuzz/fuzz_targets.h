// Fuzz targets: each takes arbitrary bytes and must either accept them or reject them with a
// cortado::Error. Anything else (another exception, a crash, a sanitizer report) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cortado::fuzz {

struct Target {
  const char* name;
  const char* what;  // the code under test, for --list
  void (*run)(const uint8_t* data, size_t size);
};

// All targets, ending with {nullptr, nullptr, nullptr}.
const Target* Targets();

// Seeds that code makes, by file name, for a target whose seeds depend on code (the checkpoint
// target's resumable state, which follows its net and DataParallel's layout); empty for the
// others. `fuzz_cortado TARGET --write-seeds DIR` writes them (into corpus/TARGET/).
std::vector<std::pair<std::string, std::string>> GeneratedSeeds(const std::string& target);

}  // namespace cortado::fuzz
