// Synthetic data evaluates only when asked (issue 30, item 6): a benchmark run without
// data.synthetic.val_samples ends without a validation pass nobody asked for.
#include <string>

#include "engine/base/error.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using SyntheticEval = UserRun;

std::string Config(const std::string& ckpt, const std::string& synthetic_extra) {
  return StrCat("model: {builder: lenet}\n", "data:\n  type: synthetic\n  batch_size: 2\n",
                "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 4", synthetic_extra, "}\n",
                "solver: {max_iter: 2}\n", "checkpoint: {dir: ", ckpt, "}\n");
}

TEST_F(SyntheticEval, SyntheticDataEvaluatesOnlyWithValSamples) {
  std::string out, err;
  const std::string none = Write("none.yaml", Config((dir_ / "a").string(), ""));
  ASSERT_EQ(Cortado("train --config " + none + " --dry-run", &out, &err), 0) << err;
  EXPECT_NE(out.find("no evaluation (data.synthetic.val_samples: 0)"), std::string::npos) << out;
  ASSERT_EQ(Cortado("train --config " + none, &out, &err), 0) << err;
  EXPECT_EQ(err.find("eval  iter"), std::string::npos) << err;
  EXPECT_EQ(
      Cortado("eval --checkpoint " + (dir_ / "a" / "ckpt-00000002.cortado").string(), &out, &err),
      1);
  EXPECT_NE(err.find("data.synthetic.val_samples is 0"), std::string::npos) << err;
  const std::string six = Write("six.yaml", Config((dir_ / "b").string(), ", val_samples: 6"));
  ASSERT_EQ(Cortado("train --config " + six, &out, &err), 0) << err;
  EXPECT_NE(err.find("(6 images"), std::string::npos) << err;
}

}  // namespace
}  // namespace cortado::tooltest
