// Test data for the tool tests: small slices of Debian's Fashion-MNIST as IDX files, and a way
// to run the cortado binary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace cortado::tooltest {

inline const char* kFashionDir = "/usr/share/datasets/fashion-mnist/";

// Writes the first n images of a Fashion-MNIST split (prefix "train" or "t10k") as
// <dir>/<prefix>-images-idx3-ubyte.gz and its labels beside it.
void WriteFashionSlice(const std::filesystem::path& dir, const std::string& prefix, int64_t n);

// A fresh, empty folder for the running test: <tmp>/<prefix>_<pid>_<test name> (a leftover of
// an earlier run is removed first). The fixture removes it in TearDown.
std::filesystem::path FreshTestDir(const std::string& prefix);

// The cortado binary of this build.
std::string CortadoBinary();

// Runs a shell command line, capturing stdout and stderr to strings (either may be null);
// returns its exit status (128 + signal when killed).
int RunShell(const std::string& command, std::string* out, std::string* err);

}  // namespace cortado::tooltest
