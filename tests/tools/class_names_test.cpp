// Training and validation databases must name the same classes in the same order (issue 30,
// item 1): a validation set converted from a folder lacking a class numbers the rest otherwise
// and would evaluate to a silently wrong top-1.
#include <filesystem>
#include <string>

#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using ClassNames = UserRun;

TEST_F(ClassNames, TrainDryRunAndEvalRefuseAValidationSetWithOtherClasses) {
  WriteImages("train", {"n01", "n02", "n03"});
  WriteImages("val_two", {"n01", "n03"});
  const std::string train = Convert("train", "train_db");
  const std::string good = Convert("val_two", "val_good", "--classes " + train + "/classes.txt");
  const std::string bad = Convert("val_two", "val_bad");  // classes.txt: n01, n03
  std::string out, err;
  const std::string config = Write("bad.yaml", LmdbConfig(train, bad));
  for (const std::string& args :
       {"train --config " + config + " --dry-run", "train --config " + config}) {
    SCOPED_TRACE(args);
    EXPECT_EQ(Cortado(args, &out, &err), 1);
    EXPECT_NE(err.find("data.train and data.val name different classes (3 and 2): class 1 is "
                       "'n02' in data.train (" +
                       train + ") but 'n03' in data.val (" + bad + ")"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("--classes " + train + "/classes.txt"), std::string::npos) << err;
  }
  // The same validation images converted with the training list train and evaluate.
  const std::string ok = Write("good.yaml", LmdbConfig(train, good));
  ASSERT_EQ(Cortado("train --config " + ok, &out, &err), 0) << err;
  EXPECT_EQ(err.find("classes.txt"), std::string::npos) << err;
  const std::string ckpt = (dir_ / "ckpt" / "ckpt-00000002.cortado").string();
  ASSERT_TRUE(std::filesystem::exists(ckpt)) << err;
  EXPECT_EQ(Cortado("eval --checkpoint " + ckpt, &out, &err), 0) << err;
  EXPECT_EQ(Cortado("eval --checkpoint " + ckpt + " --set data.val=" + bad, &out, &err), 1);
  EXPECT_NE(err.find("class 1 is 'n02' in data.train"), std::string::npos) << err;
  // A database without names (another tool's) can only be warned about.
  std::filesystem::remove(good + "/classes.txt");
  EXPECT_EQ(Cortado("eval --checkpoint " + ckpt + " --set model.num_classes=3", &out, &err), 0)
      << err;
  EXPECT_NE(err.find("data.val (" + good + ") has no classes.txt"), std::string::npos) << err;
}

}  // namespace
}  // namespace cortado::tooltest
