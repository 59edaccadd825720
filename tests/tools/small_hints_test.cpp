// Small things a new user met (issue 30, item 14), through the binary: convert names the files
// it ignored, the devkit's validation ground truth is recognized and pointed at the guide's
// CSV, and a relative data path that does not exist names the folder it was resolved against.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "engine/base/error.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using SmallHints = UserRun;

TEST_F(SmallHints, ConvertNamesTheFilesItIgnoredAndListsThemInSkippedTxt) {
  WriteImages("images", {"cat", "dog"});
  Write("images/cat/README.txt", "not an image");
  Write("images/dog/labels.csv", "a,b");
  std::string out, err;
  const std::string db = (dir_ / "db").string();
  ASSERT_EQ(Cortado("convert --root " + (dir_ / "images").string() + " --out " + db, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("ignored 2 file(s) without an image extension: cat/README.txt, "
                     "dog/labels.csv (listed in skipped.txt)"),
            std::string::npos)
      << out;
  const std::string skipped = testing::ReadFileBytes(db + "/skipped.txt");
  EXPECT_EQ(skipped,
            "cat/README.txt\tignored: no image extension\n"
            "dog/labels.csv\tignored: no image extension\n");
}

TEST_F(SmallHints, TheDevkitsValidationGroundTruthPointsAtTheGuidesCsv) {
  WriteImages("val", {"n01"});
  // ILSVRC2012_validation_ground_truth.txt: one class number per line, no file names.
  const std::string truth = Write("ILSVRC2012_validation_ground_truth.txt", "490\n361\n");
  std::string out, err;
  EXPECT_EQ(Cortado("convert --root " + (dir_ / "val").string() + " --list " + truth + " --out " +
                        (dir_ / "db").string(),
                    &out, &err),
            1);
  EXPECT_NE(err.find(truth + ":1: '490' is a bare class number, as in the devkit's "
                             "ILSVRC2012_validation_ground_truth.txt"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("scripts/imagenet_val_list.py --labels LOC_val_solution.csv"),
            std::string::npos)
      << err;
  const std::string script = std::string(CORTADO_SOURCE_DIR) + "/scripts/imagenet_val_list.py";
  const std::string classes = Write("classes.txt", "n01\n");
  EXPECT_NE(RunShell("timeout 60 python3 " + script + " --labels " + truth + " --classes " +
                         classes + " --out " + (dir_ / "list.txt").string(),
                     &out, &err),
            0);
  EXPECT_NE(err.find("ILSVRC2012_validation_ground_truth.txt:1: this looks like the devkit's "
                     "ILSVRC2012_validation_ground_truth.txt"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("give --labels LOC_val_solution.csv"), std::string::npos) << err;
}

TEST_F(SmallHints, AMissingRelativeDataPathNamesTheWorkingDirectory) {
  const std::string config = Write("run.yaml",
                                   "model: {builder: lenet}\n"
                                   "data: {type: lmdb, train: imagenet/train_lmdb}\n"
                                   "solver: {max_iter: 1}\n");
  std::string out, err;
  EXPECT_EQ(Cortado("train --dry-run --config " + config, &out, &err), 1);
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_NE(err.find("data.train: 'imagenet/train_lmdb' does not exist (a relative path is "
                     "resolved against the working directory, " +
                     cwd + ", not the config's folder)"),
            std::string::npos)
      << err;
  // An absolute path needs no such note.
  EXPECT_EQ(Cortado("train --dry-run --config " + config +
                        " --set data.train=" + (dir_ / "gone").string(),
                    &out, &err),
            1);
  EXPECT_NE(err.find("data.train: '" + (dir_ / "gone").string() + "' does not exist"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("working directory"), std::string::npos) << err;
}

}  // namespace
}  // namespace cortado::tooltest
