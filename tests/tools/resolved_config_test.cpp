// The config a run used, every key with its effective value (issue 30, item 3): dry-run prints
// it, checkpoints store it, and a resume compares against it, so a default that changes in a
// later version cannot silently change an old run.
#include <filesystem>
#include <string>

#include "engine/base/error.h"
#include "engine/io/checkpoint.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using ResolvedConfig = UserRun;

std::string Config(const std::string& ckpt) {
  return StrCat("model: {builder: lenet}\n", "data:\n  type: synthetic\n  batch_size: 2\n",
                "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 8}\n",
                "solver: {max_iter: 2}\n", "checkpoint: {dir: ", ckpt, "}\n");
}

TEST_F(ResolvedConfig, DryRunAndCheckpointsHoldEveryDefaultAndResumeComparesThem) {
  const std::string ckpt_dir = (dir_ / "ckpt").string();
  const std::string config = Write("run.yaml", Config(ckpt_dir));
  std::string out, err;
  ASSERT_EQ(Cortado("train --config " + config + " --dry-run", &out, &err), 0) << err;
  for (const char* line :
       {"  base_lr: 0.1\n", "  lr_policy: cosine\n", "  momentum: 0.9\n", "  weight_decay: 5e-04\n",
        "  max_iter: 2\n", "  keep: 3\n", "  compute: fp32\n", "  interval: 50\n"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  ASSERT_EQ(Cortado("train --config " + config + " --stop-at-iter 1", &out, &err), 130) << err;
  const std::string ckpt = ckpt_dir + "/ckpt-00000001.cortado";
  ASSERT_EQ(Cortado("inspect --checkpoint " + ckpt, &out, &err), 0) << err;
  EXPECT_NE(out.find("  momentum: 0.9\n"), std::string::npos) << out;
  // A value that differs from the stored default is named with both values.
  ASSERT_EQ(
      Cortado("train --config " + config + " --resume auto --set solver.momentum=0.8", &out, &err),
      0)
      << err;
  EXPECT_NE(err.find("solver.momentum: 0.9 -> 0.8"), std::string::npos) << err;
  // A checkpoint of an earlier version stored the config as written: the keys it lacks had
  // unknown defaults and are not reported as changes.
  Checkpoint old = LoadCheckpoint(ckpt);
  old.meta.erase("config_form");
  old.meta["config"] = Config(ckpt_dir);
  const std::string old_path = (dir_ / "old.cortado").string();
  SaveCheckpoint(old, old_path);
  ASSERT_EQ(Cortado("train --config " + config + " --resume " + old_path, &out, &err), 0) << err;
  EXPECT_EQ(err.find("differs from the one"), std::string::npos) << err;
}

}  // namespace
}  // namespace cortado::tooltest
