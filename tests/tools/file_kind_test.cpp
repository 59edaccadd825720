// A checkpoint given where a weights file belongs, or the reverse, is named for what it is with
// the flag that takes it, and inspect reads either (issue 30, item 9).
#include <regex>
#include <string>

#include "engine/base/error.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

// A one-step LeNet run's config, its checkpoint and that checkpoint exported as safetensors.
class FileKinds : public UserRun {
 protected:
  void TrainAndExport() {
    config = Write(
        "run.yaml",
        StrCat("model: {builder: lenet}\n", "data:\n  type: synthetic\n  batch_size: 2\n",
               "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 4}\n",
               "solver: {max_iter: 1}\n", "checkpoint: {dir: ", (dir_ / "a").string(), "}\n"));
    std::string out, err;
    ASSERT_EQ(Cortado("train --config " + config, &out, &err), 0) << err;
    ckpt = (dir_ / "a" / "ckpt-00000001.cortado").string();
    weights = (dir_ / "w.safetensors").string();
    ASSERT_EQ(Cortado("export --checkpoint " + ckpt + " --out " + weights, &out, &err), 0) << err;
  }
  std::string config, ckpt, weights;
};

TEST_F(FileKinds, CheckpointsAndWeightsFilesGivenToTheOtherFlagSayWhatToUse) {
  ASSERT_NO_FATAL_FAILURE(TrainAndExport());
  std::string out, err;
  EXPECT_EQ(Cortado("train --config " + config + " --weights " + ckpt, &out, &err), 2);
  EXPECT_NE(err.find("--weights: '" + ckpt + "' is a Cortado checkpoint, not a safetensors file: " +
                     "continue its run with --resume " + ckpt),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("cortado export --checkpoint " + ckpt), std::string::npos) << err;
  EXPECT_EQ(Cortado("eval --weights " + ckpt + " --config " + config, &out, &err), 2);
  EXPECT_NE(err.find("is a Cortado checkpoint"), std::string::npos) << err;
  EXPECT_EQ(Cortado("train --config " + config + " --resume " + weights, &out, &err), 2);
  EXPECT_NE(err.find("--resume: '" + weights + "' is a safetensors weights file, not a " +
                     "checkpoint: start a run from its weights with --weights " + weights),
            std::string::npos)
      << err;
  EXPECT_EQ(Cortado("eval --checkpoint " + weights, &out, &err), 2);
  EXPECT_NE(err.find("evaluate it with --weights " + weights + " --config F"), std::string::npos)
      << err;
}

TEST_F(FileKinds, InspectShowsASafetensorsFilesMetadataAndTensors) {
  ASSERT_NO_FATAL_FAILURE(TrainAndExport());
  std::string out, err;
  for (const std::string flag : {"--weights", "--checkpoint"}) {
    ASSERT_EQ(Cortado("inspect " + flag + " " + weights, &out, &err), 0) << err;
    EXPECT_NE(out.find("safetensors " + weights + "\n"), std::string::npos) << out;
    EXPECT_TRUE(std::regex_search(out, std::regex("\n  cortado_builder +lenet\n"))) << out;
    EXPECT_TRUE(std::regex_search(out, std::regex("name +shape +dtype +values\n"))) << out;
    EXPECT_TRUE(
        std::regex_search(out, std::regex("\nconv1\\.weight +\\[32, 1, 5, 5\\] +F32 +800\n")))
        << out;
    EXPECT_EQ(out.find("bad magic"), std::string::npos) << out;
  }
  // A checkpoint given to --weights is shown as the checkpoint it is.
  ASSERT_EQ(Cortado("inspect --weights " + ckpt, &out, &err), 0) << err;
  EXPECT_NE(out.find("checkpoint " + ckpt + "\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace cortado::tooltest
