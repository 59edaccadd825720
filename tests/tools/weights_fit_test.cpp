// `train --weights` from another architecture (issue 30, item 2; issue 40, item 3): only the
// final classifier may differ (fine-tuning to another class count); anything else, a smaller
// architecture's file or a larger one's, is refused unless --weights-partial says so, and a file
// exported from another builder is warned about.
#include <filesystem>
#include <string>

#include "engine/base/error.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using WeightsFit = UserRun;

std::string SyntheticConfig(const std::string& builder, int classes, const std::string& ckpt) {
  return StrCat("model: {builder: ", builder, ", base_width: 8}\n",
                "data:\n  type: synthetic\n  batch_size: 2\n",
                "  synthetic: {shape: [3, 32, 32], classes: ", classes, ", samples: 4}\n",
                "solver: {max_iter: 1}\n", "checkpoint: {dir: ", ckpt, "}\n");
}

TEST_F(WeightsFit, AnotherArchitecturesWeightsAreRefusedUnlessPartialIsAsked) {
  std::string out, err;
  const std::string r18 = Write("r18.yaml", SyntheticConfig("resnet18", 10, (dir_ / "a").string()));
  ASSERT_EQ(Cortado("train --config " + r18, &out, &err), 0) << err;
  const std::string weights = (dir_ / "r18.safetensors").string();
  ASSERT_EQ(Cortado("export --checkpoint " + (dir_ / "a" / "ckpt-00000001.cortado").string() +
                        " --out " + weights,
                    &out, &err),
            0)
      << err;
  // Another class count: the classifier stays at its initialization, the rest loads.
  const std::string five =
      Write("r18_5.yaml", SyntheticConfig("resnet18", 5, (dir_ / "b").string()));
  ASSERT_EQ(Cortado("train --config " + five + " --weights " + weights, &out, &err), 0) << err;
  EXPECT_NE(err.find("2 left at initialization (shape differs): fc.weight"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("exported from"), std::string::npos) << err;
  // Another architecture: refused, naming what differs, and the builder warned about.
  const std::string r34 = Write("r34.yaml", SyntheticConfig("resnet34", 10, (dir_ / "c").string()));
  EXPECT_EQ(Cortado("train --config " + r34 + " --weights " + weights, &out, &err), 1);
  EXPECT_NE(err.find("weights file '" + weights +
                     "' was exported from a 'resnet18' model; this "
                     "run builds 'resnet34'"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("does not fit the model outside its final classifier ("), std::string::npos)
      << err;
  EXPECT_NE(err.find("layer1.2.conv1.weight (not in the file)"), std::string::npos) << err;
  EXPECT_NE(err.find("--weights-partial"), std::string::npos) << err;
  // Asked for: it loads what fits.
  ASSERT_EQ(
      Cortado("train --config " + r34 + " --weights " + weights + " --weights-partial", &out, &err),
      0)
      << err;
  EXPECT_NE(err.find("not in the file (left at initialization)"), std::string::npos) << err;

  // The other direction (issue 40, item 3): the larger architecture's file fills every tensor of
  // the smaller net, so only its extra blocks, unused, tell that it is another architecture's.
  const std::string weights34 = (dir_ / "r34.safetensors").string();
  ASSERT_EQ(Cortado("export --checkpoint " + (dir_ / "c" / "ckpt-00000001.cortado").string() +
                        " --out " + weights34,
                    &out, &err),
            0)
      << err;
  const std::string r18_d =
      Write("r18_d.yaml", SyntheticConfig("resnet18", 10, (dir_ / "d").string()));
  EXPECT_EQ(Cortado("train --config " + r18_d + " --weights " + weights34, &out, &err), 1);
  EXPECT_NE(
      err.find(
          "weights file '" + weights34 +
          "' does not fit the model outside its final classifier (80 tensor(s): "
          "layer1.2.conv1.weight (not in the model), layer1.2.bn1.weight (not in the model), "),
      std::string::npos)
      << err;
  EXPECT_NE(err.find("--weights-partial"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "d" / "ckpt-00000001.cortado"));
  ASSERT_EQ(Cortado("train --config " + r18_d + " --weights " + weights34 + " --weights-partial",
                    &out, &err),
            0)
      << err;
  EXPECT_NE(
      err.find("102 tensor(s) loaded from '" + weights34 + "'; 80 unused: layer1.2.conv1.weight"),
      std::string::npos)
      << err;
}

}  // namespace
}  // namespace cortado::tooltest
