// A long evaluation as a user meets it (issue 30, items 5, 6, 12 and 14): the end-of-training
// checkpoint is written before the final evaluation, the evaluation shows its progress, Ctrl-C
// during it stops at the next batch with the training saved and says that only the evaluation
// is abandoned; an evaluation in the middle of training stops the same way and the run
// resumes; a resume past --stop-at-iter warns; the one-rank log states the global batch and
// the learning rate; `cortado eval` shows its progress too, unless --no-progress (issue 40,
// item 7).
#include <signal.h>

#include <string>

#include "engine/base/error.h"
#include "engine/io/checkpoint.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using EvalInterrupt = UserRun;

// LeNet on synthetic data: two training steps, then an evaluation of 2,000,000 images that
// takes minutes; `solver` is added to the solver section.
std::string LongEvalConfig(const std::string& ckpt, const std::string& solver) {
  return StrCat(
      "model: {builder: lenet}\n",
      "data:\n  type: synthetic\n  batch_size: 2\n  val_batch_size: 16\n",
      "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 8, val_samples: 2000000}\n",
      "solver: {max_iter: 4", solver, "}\n", "checkpoint: {dir: ", ckpt, "}\n");
}

TEST_F(EvalInterrupt, CtrlCDuringTheFinalEvaluationAbandonsItWithTheTrainingSaved) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string config = Write("run.yaml", LongEvalConfig(ckpt, ""));
  const pid_t pid = StartCortado("train --no-progress --threads 1 --config " + config, "err.txt");
  // Every evaluation longer than a few seconds shows where it is.
  const bool progress = WaitForText("err.txt", "eval  batch", 60);
  kill(pid, SIGINT);
  const int code = WaitExit(pid, 30);
  const std::string err = Read("err.txt");
  ASSERT_TRUE(progress) << "no progress line within 60 s of evaluation\n" << err;
  EXPECT_EQ(code, 130) << err;
  EXPECT_NE(err.find(" img/s"), std::string::npos) << err;
  EXPECT_NE(err.find("/2000000 images)"), std::string::npos) << err;
  // The end-of-training checkpoint came before the evaluation: nothing of the training is lost.
  const size_t saved = err.find("checkpoint saved to '" + ckpt + "/ckpt-00000004.cortado'");
  ASSERT_NE(saved, std::string::npos) << err;
  EXPECT_LT(saved, err.find("eval  batch")) << err;
  EXPECT_EQ(LoadCheckpoint(ckpt + "/ckpt-00000004.cortado").MetaInt("iteration"), 4);
  EXPECT_NE(err.find("interrupted during the final evaluation at iteration 4"), std::string::npos)
      << err;
  EXPECT_NE(err.find("the evaluation is abandoned, not the training"), std::string::npos) << err;
  EXPECT_NE(err.find("Evaluate it with: cortado eval --checkpoint"), std::string::npos) << err;
  EXPECT_EQ(err.find("eval  iter"), std::string::npos) << "an abandoned evaluation has no result\n"
                                                       << err;
  // One rank states the batch and learning rate as several do (a recipe's rate is for its
  // global batch).
  EXPECT_NE(err.find("one rank: global batch 2 (1 x 2), learning rate 0.1 (solver.base_lr"),
            std::string::npos)
      << err;

  // `cortado eval` of the saved checkpoint shows its progress the same way, and with
  // --no-progress it does not (issue 40, item 7): started first, that one has evaluated at least
  // as long as the other when the other's line appears, and two seconds more when stopped.
  const pid_t quiet =
      StartCortado("eval --threads 1 --no-progress --checkpoint " + ckpt + "/ckpt-00000004.cortado",
                   "quiet_err.txt");
  const pid_t eval = StartCortado(
      "eval --threads 1 --checkpoint " + ckpt + "/ckpt-00000004.cortado", "eval_err.txt");
  const bool eval_progress = WaitForText("eval_err.txt", "eval  batch", 60);
  const bool quiet_progress = WaitForText("quiet_err.txt", "eval  batch", 2);
  kill(eval, SIGKILL);
  kill(quiet, SIGKILL);
  WaitExit(eval, 10);
  EXPECT_TRUE(eval_progress) << Read("eval_err.txt");
  EXPECT_EQ(WaitExit(quiet, 10), 128 + SIGKILL) << "still evaluating when stopped\n"
                                                << Read("quiet_err.txt");
  EXPECT_FALSE(quiet_progress) << Read("quiet_err.txt");
}

TEST_F(EvalInterrupt, CtrlCDuringAnEvaluationMidTrainingCheckpointsAndTheRunResumes) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string config = Write("run.yaml", LongEvalConfig(ckpt, ", eval_interval: 1"));
  const pid_t pid = StartCortado("train --no-progress --threads 1 --config " + config, "err.txt");
  const bool progress = WaitForText("err.txt", "eval  batch", 60);
  kill(pid, SIGINT);
  const int code = WaitExit(pid, 30);
  const std::string err = Read("err.txt");
  ASSERT_TRUE(progress) << err;
  EXPECT_EQ(code, 130) << err;
  EXPECT_NE(err.find("interrupted during the evaluation at iteration 1 (after "), std::string::npos)
      << err;
  EXPECT_NE(err.find("the evaluation is abandoned, not the training; checkpoint saved to '" + ckpt +
                     "/ckpt-00000001.cortado'. Resume with: "),
            std::string::npos)
      << err;
  EXPECT_EQ(LoadCheckpoint(ckpt + "/ckpt-00000001.cortado").MetaInt("iteration"), 1);

  // Resuming at or past --stop-at-iter trains nothing, and says so.
  std::string out, resumed;
  EXPECT_EQ(Cortado("train --no-progress --threads 1 --config " + config +
                        " --resume auto --stop-at-iter 1",
                    &out, &resumed),
            130);
  EXPECT_NE(resumed.find("--stop-at-iter 1: this run resumed at iteration 1, already past it"),
            std::string::npos)
      << resumed;
}

}  // namespace
}  // namespace cortado::tooltest
