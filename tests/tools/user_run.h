// A scratch folder for tests that use the cortado binary as a new user would (issue 30): write
// configs and image folders, convert them to LMDBs, run commands.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace cortado::tooltest {

class UserRun : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Writes `text` to dir_/name; returns the path.
  std::string Write(const std::string& name, const std::string& text);
  // Writes `per_class` small JPEG images into dir_/folder/<class>/ for each class.
  void WriteImages(const std::string& folder, const std::vector<std::string>& classes,
                   int per_class = 2);
  // `cortado convert --root dir_/folder --out dir_/db` (and `extra` flags); returns the db path.
  std::string Convert(const std::string& folder, const std::string& db,
                      const std::string& extra = "");
  // A conv net on an LMDB (8x8 crops, 3 classes, batch 2, max_iter 2) as YAML, then `extra`.
  std::string LmdbConfig(const std::string& train, const std::string& val,
                         const std::string& extra = "");
  // `cortado ARGS` under a time limit; returns its exit status.
  int Cortado(const std::string& args, std::string* out, std::string* err);
  // `cortado ARGS` started in the background, stdout to /dev/null and stderr to dir_/err_name;
  // returns its pid (signal tests).
  pid_t StartCortado(const std::string& args, const std::string& err_name);
  // Waits at most `seconds` for `text` to appear in the file dir_/name.
  bool WaitForText(const std::string& name, const std::string& text, double seconds);
  // The exit status of child `pid` (128 + signal when killed), waiting at most `seconds`; -1
  // on timeout, after killing it.
  int WaitExit(pid_t pid, double seconds);
  // The text of the file dir_/name ("" when absent).
  std::string Read(const std::string& name) const;

  std::filesystem::path dir_;
};

}  // namespace cortado::tooltest
