// Command-line mistakes get a message that points at the fix (issue 30, item 10).
#include <string>

#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using UsageHints = UserRun;

TEST_F(UsageHints, ABareKeyValueSuggestsSetAndResumeSaysWhatItTakes) {
  const std::string config = Write("run.yaml", "model: {builder: lenet}\n");
  std::string out, err;
  EXPECT_EQ(Cortado("train --config " + config + " solver.max_iter=2", &out, &err), 2);
  EXPECT_NE(err.find("unexpected argument 'solver.max_iter=2'; a config key is overridden with "
                     "--set (--set solver.max_iter=2)"),
            std::string::npos)
      << err;
  EXPECT_EQ(Cortado("train --config " + config + " --resume", &out, &err), 2);
  EXPECT_NE(err.find("--resume needs a value: auto (the newest valid checkpoint in "
                     "checkpoint.dir) or a checkpoint file"),
            std::string::npos)
      << err;
}

TEST_F(UsageHints, AnUnknownBuilderIsNamedWithTheKnownOnes) {
  const std::string config = Write("run.yaml",
                                   "model: {builder: resnet50, base_width: 8}\ndata: {type: "
                                   "synthetic}\nsolver: {max_iter: 1}\n");
  std::string out, err;
  EXPECT_EQ(
      Cortado("train --dry-run --config " + config + " --set model.builder=resnet5", &out, &err),
      1);
  EXPECT_NE(err.find("--set model.builder=resnet5: model.builder: unknown builder 'resnet5' "
                     "(known: "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("resnet50"), std::string::npos) << err;
}

}  // namespace
}  // namespace cortado::tooltest
