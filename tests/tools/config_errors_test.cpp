// Config mistakes a new user makes, as `cortado train` reports them (issue 30): each error is
// one line that names the real mistake and where it is.
#include <filesystem>
#include <string>

#include "engine/base/error.h"
#include "tests/support/files.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

const char* kBase =
    "model: {builder: lenet}\n"
    "data:\n"
    "  type: synthetic\n"
    "  batch_size: 4\n"
    "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 8}\n"
    "solver: {max_iter: 1}\n";

class ConfigErrorsTest : public UserRun {
 protected:
  std::string ErrorOf(const std::string& text, const std::string& sets = "") {
    const std::string path = Write("run.yaml", text);
    std::string out, err;
    EXPECT_EQ(Cortado("train --dry-run --config " + path + " " + sets, &out, &err), 1)
        << out << err;
    return err;
  }
};

TEST_F(ConfigErrorsTest, ADuplicateKeyIsRefusedWithBothLines) {
  const std::string err = ErrorOf(std::string(kBase) + "data:\n  batch_size: 8\n");
  EXPECT_NE(err.find("run.yaml:7: duplicate key 'data' (first at line 2)"), std::string::npos)
      << err;
  const std::string nested = ErrorOf(
      "model: {builder: lenet}\ndata:\n  type: synthetic\n  batch_size: 4\n"
      "  batch_size: 8\nsolver: {max_iter: 1}\n");
  EXPECT_NE(nested.find("run.yaml:5: duplicate key 'data.batch_size' (first at line 4)"),
            std::string::npos)
      << nested;
}

TEST_F(ConfigErrorsTest, ATabInTheIndentationIsNamedAsSuch) {
  const std::string err = ErrorOf(std::string(kBase) + "log:\n\tinterval: 5\n");
  EXPECT_NE(err.find("run.yaml:8:1: tabs are not allowed in YAML indentation; indent with spaces"),
            std::string::npos)
      << err;
}

// Keys are checked against each section's list before any value is read (issue 30 item 7): a
// misspelled required key was reported as the missing key it was meant to be.
TEST_F(ConfigErrorsTest, AMisspelledKeyIsNamedWithTheClosestKnownOneBeforeAnyValueIsRead) {
  auto replaced = [](std::string text, const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  auto expect = [&](const std::string& text, const std::string& message,
                    const std::string& sets = "") {
    const std::string err = ErrorOf(text, sets);
    EXPECT_NE(err.find(message), std::string::npos) << text << "\n" << err;
    EXPECT_EQ(err.find("required"), std::string::npos) << err;
    EXPECT_EQ(err.find("give exactly one"), std::string::npos) << err;
  };
  expect(replaced(kBase, "max_iter", "max_iters"),
         "run.yaml:6:10: unknown key 'solver.max_iters' (did you mean 'max_iter'?)");
  expect(replaced(kBase, "solver:", "solvr:"),
         "run.yaml:6:1: unknown key 'solvr' (did you mean 'solver'?)");
  expect(replaced(kBase, "builder:", "buildr:"),
         "run.yaml:1:9: unknown key 'model.buildr' (did you mean 'builder'?)");
  expect(replaced(replaced(kBase, "type: synthetic", "type: lmdb\n  trian: /data/train"),
                  "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 8}\n", ""),
         "run.yaml:4:3: unknown key 'data.trian' (did you mean 'train'?)");
  expect(replaced(kBase, "samples:", "sample:"),
         "unknown key 'data.synthetic.sample' (did you mean 'samples'?)");
  // Before any value: the unknown builder of the model section comes first in the file.
  expect(replaced(replaced(kBase, "lenet", "nosuch"), "max_iter", "max_iters"),
         "unknown key 'solver.max_iters' (did you mean 'max_iter'?)");
  // From --set, the argument is named.
  expect(kBase, "--set solver.max_iters=3: unknown key 'solver.max_iters' (did you mean",
         "--set solver.max_iters=3");
  // Nothing close: the section's keys are listed.
  expect(std::string(kBase) + "log: {zzzzzz: 1}\n",
         "unknown key 'log.zzzzzz' (known in log: interval)");
}

// Issue 40, item 12: "did you mean" offers only a key this run accepts. warmup_epochs goes with
// max_epochs and warmup_iters with max_iter; `warmup:` was offered the first declared key it
// begins, warmup_epochs, which an iteration-based run then refuses.
TEST_F(ConfigErrorsTest, AMisspelledWarmupIsOfferedTheKeyOfTheRunsSchedule) {
  const std::string iters = ErrorOf(kBase, "--set solver.warmup=5");
  EXPECT_NE(iters.find("unknown key 'solver.warmup' (did you mean 'warmup_iters'?)"),
            std::string::npos)
      << iters;
  std::string epochs_base = kBase;
  epochs_base.replace(epochs_base.find("max_iter: 1"), 11, "max_epochs: 1, warmup: 1");
  const std::string epochs = ErrorOf(epochs_base);
  EXPECT_NE(epochs.find("run.yaml:6:25: unknown key 'solver.warmup' (did you mean "
                        "'warmup_epochs'?)"),
            std::string::npos)
      << epochs;
  // A key one edit from the other schedule's is not offered it, nor does the list name it.
  std::string iter_typo = kBase;
  iter_typo.replace(iter_typo.find("max_iter: 1"), 11, "max_epochs: 1, warmup_iter: 1");
  const std::string typo = ErrorOf(iter_typo);
  EXPECT_NE(typo.find("unknown key 'solver.warmup_iter' (known in solver: "), std::string::npos)
      << typo;
  EXPECT_NE(typo.find("warmup_epochs"), std::string::npos) << typo;
  EXPECT_EQ(typo.find("warmup_iters"), std::string::npos) << typo;
}

// Every getter's key must be in its section's list (an undeclared one is an internal error),
// and every listed key must be read: every shipped config, with either kind of loss scaling,
// parses to the end.
TEST_F(ConfigErrorsTest, EveryShippedConfigReadsExactlyItsSectionsDeclaredKeys) {
  int configs = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(CORTADO_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++configs;
    // Detection reads LMDBs only; inspect builds its net from the config where the data is
    // missing.
    const bool detection =
        testing::ReadFileBytes(entry.path()).find("task: detection") != std::string::npos;
    const std::string data = detection ? " --set data.batch_size=1"
                                       : " --set data.type=synthetic --set "
                                         "data.synthetic.shape=[3,32,32]"
                                         " --set data.synthetic.classes=10 --set data.batch_size=1";
    for (const std::string scale : {"1", "dynamic"}) {
      std::string out, err;
      EXPECT_EQ(Cortado("inspect --config " + entry.path().string() + data +
                            " --set precision.loss_scale=" + scale,
                        &out, &err),
                0)
          << entry.path() << "\n"
          << err;
      EXPECT_EQ(err.find("internal error"), std::string::npos) << err;
    }
  }
  EXPECT_GE(configs, 5);
}

}  // namespace
}  // namespace cortado::tooltest
