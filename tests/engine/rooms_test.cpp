// scripts/check_rooms.sh, the check that keeps engine/'s rooms including one way
// (docs/ARCHITECTURE.md): it passes on this repository and on a small tree that includes
// downward only, and fails, naming the file and line, where a room includes one above it or
// the CUDA backend, where a file lies outside the rooms, and where distributed/ includes engine/.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "tests/support/files.h"

namespace cortado {
namespace {

using testing::ReadFileBytes;
using testing::TempDir;
using testing::WriteFile;

struct CheckResult {
  int status = -1;
  std::string errors;  // what the check wrote to stderr
};

CheckResult CheckRooms(const std::string& tree) {
  TempDir out;
  const std::string errors = out / "errors.txt";
  const std::string command = std::string("bash '") + CORTADO_SOURCE_DIR +
                              "/scripts/check_rooms.sh' '" + tree + "' >/dev/null 2>'" + errors +
                              "'";
  const int raw = std::system(command.c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, ReadFileBytes(errors)};
}

// A tree whose every room includes itself and the rooms below it, and nothing more.
void WriteDownwardTree(const TempDir& tree) {
  WriteFile(tree / "engine/base/error.h", "#pragma once\n#include <string>\n");
  WriteFile(tree / "engine/base/log.cpp", "#include \"engine/base/error.h\"\n");
  WriteFile(tree / "engine/tensor/tensor.h", "#pragma once\n#include \"engine/base/error.h\"\n");
  WriteFile(tree / "engine/cuda/runtime.cpp",
            "#include \"engine/cuda/check.h\"\n#include \"engine/tensor/tensor.h\"\n");
  WriteFile(tree / "engine/cuda/check.h", "#pragma once\n");
  WriteFile(tree / "engine/io/checkpoint.h", "#pragma once\n#include \"engine/tensor/tensor.h\"\n");
  WriteFile(
      tree / "engine/graph/net.h",
      "#pragma once\n#include \"engine/io/checkpoint.h\"\n#include \"engine/base/error.h\"\n");
  WriteFile(tree / "engine/parallel/data_parallel.cpp",
            "#include \"engine/graph/net.h\"\n#include \"cortado/dist/communicator.h\"\n");
  WriteFile(tree / "engine/CMakeLists.txt", "add_library(x)\n");
  WriteFile(tree / "distributed/src/ring.cpp", "#include \"cortado/dist/communicator.h\"\n");
}

TEST(Rooms, ThisRepositoryIncludesOneWay) {
  const CheckResult r = CheckRooms(CORTADO_SOURCE_DIR);
  EXPECT_EQ(r.status, 0) << r.errors;
}

TEST(Rooms, ATreeThatIncludesDownwardPasses) {
  TempDir tree;
  WriteDownwardTree(tree);
  const CheckResult r = CheckRooms(tree.path());
  EXPECT_EQ(r.status, 0) << r.errors;
}

// Checks the downward tree with `file` added (holding `text`): the check must fail, and its
// errors must contain `expected`.
void ExpectRefused(const std::string& file, const std::string& text, const std::string& expected) {
  TempDir tree;
  WriteDownwardTree(tree);
  WriteFile(tree / file, text);
  const CheckResult r = CheckRooms(tree.path());
  EXPECT_EQ(r.status, 1) << file;
  EXPECT_NE(r.errors.find(expected), std::string::npos) << "expected: " << expected << "\n"
                                                        << r.errors;
}

TEST(Rooms, ALowerRoomIncludingAHigherOneIsNamedWithItsLine) {
  ExpectRefused("engine/tensor/tensor.cpp",
                "#include \"engine/tensor/tensor.h\"\n\n#include \"engine/graph/net.h\"\n",
                "engine/tensor/tensor.cpp:3: includes engine/graph/net.h: room tensor may include "
                "only: tensor base");
}

TEST(Rooms, OnlyTheCudaRoomIncludesTheCudaBackend) {
  ExpectRefused("engine/parallel/sync.cpp", "#include <engine/cuda/check.h>\n",
                "engine/parallel/sync.cpp:1: includes engine/cuda/check.h");
}

TEST(Rooms, FilesOutsideTheRoomsAreRefused) {
  ExpectRefused("engine/loose.cpp", "int x;\n", "engine/loose.cpp: not in a room");
  ExpectRefused("engine/attic/old.h", "#pragma once\n",
                "engine/attic/old.h: engine/attic/ is not a room");
  ExpectRefused("engine/graph/layer.cpp", "#include \"engine/error.h\"\n",
                "engine/graph/layer.cpp:1: includes engine/error.h, which is in no room");
}

TEST(Rooms, DistributedIncludesNothingOfTheEngine) {
  ExpectRefused("distributed/src/codec.cpp", "#include \"engine/base/error.h\"\n",
                "distributed/src/codec.cpp:1: includes engine/base/error.h");
}

TEST(Rooms, ATreeWithoutAnEngineIsAnErrorNotAPass) {
  TempDir tree;
  const CheckResult r = CheckRooms(tree.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.errors.find("no engine/"), std::string::npos) << r.errors;
}

}  // namespace
}  // namespace cortado
