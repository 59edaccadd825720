// The local launcher: environment for each rank, prefixed output, stopping the job when a rank
// fails (with that rank's exit code), forwarding SIGTERM, and a real multi-rank job.
#include "cortado/dist/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "cortado/dist/error.h"
#include "test_util.h"

namespace cortado::dist {
namespace {

using std::chrono::milliseconds;

struct TempFile {
  std::string path;
  int fd = -1;
  TempFile() {
    char p[] = "/tmp/cortado_launch_test_XXXXXX";
    fd = ::mkstemp(p);
    path = p;
  }
  ~TempFile() {
    ::close(fd);
    ::unlink(path.c_str());
  }
  std::string Read() const { return testing::ReadWholeFile(path); }
};

LauncherOptions Shell(int nproc, const std::string& script, const TempFile& out) {
  LauncherOptions o;
  o.nproc = nproc;
  o.command = {"/bin/sh", "-c", script};
  o.stdout_fd = out.fd;
  o.stderr_fd = out.fd;
  o.grace = milliseconds(2000);
  return o;
}

// Waits (up to 4 s) until both ranks of a 2-rank launcher have printed "ready".
void WaitUntilBothReady(const TempFile& out) {
  for (int i = 0; i < 200; ++i) {
    std::string t = out.Read();
    if (t.find("[0] ready") != std::string::npos && t.find("[1] ready") != std::string::npos) {
      return;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
}

// Waits up to 5 s for the launcher process to exit; kills it and returns false if it does not.
bool WaitExited(pid_t pid, int* status) {
  for (int i = 0; i < 250; ++i) {
    if (::waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, status, 0);
  return false;
}

TEST(Launcher, EveryRankGetsItsEnvironmentAndPrefixedOutput) {
  TempFile out;
  int code = RunLauncher(
      Shell(3,
            "echo rank=$CORTADO_RANK world=$CORTADO_WORLD_SIZE local=$CORTADO_LOCAL_RANK "
            "port=$CORTADO_MASTER_PORT token=${#CORTADO_JOB_TOKEN} fd=${CORTADO_STORE_FD:-none}; "
            "printf 'no newline'",
            out));
  EXPECT_EQ(code, 0);
  std::string text = out.Read();
  for (int r = 0; r < 3; ++r) {
    std::ostringstream line, tail;
    line << "[" << r << "] rank=" << r << " world=3 local=" << r << " port=";
    tail << "[" << r << "] no newline\n";
    EXPECT_NE(text.find(line.str()), std::string::npos) << text;
    EXPECT_NE(text.find(tail.str()), std::string::npos) << text;
  }
  EXPECT_NE(text.find("token=32"), std::string::npos) << text;  // a generated 128-bit token
  // Only rank 0 gets the store socket.
  size_t nones = 0;
  for (size_t p = text.find("fd=none"); p != std::string::npos; p = text.find("fd=none", p + 1))
    ++nones;
  EXPECT_EQ(nones, 2u) << text;
  EXPECT_EQ(text.find("[0] rank=0") < text.size(), true);
  EXPECT_EQ(
      text.find("fd=none", text.find("[0] rank=0")) > text.find('\n', text.find("[0] rank=0")),
      true)
      << text;
}

TEST(Launcher, OneFailingRankStopsTheOthersAndSetsTheExitCode) {
  TempFile out;
  auto t0 = std::chrono::steady_clock::now();
  int code = RunLauncher(
      Shell(3, "if [ $CORTADO_RANK = 1 ]; then sleep 0.2; exit 7; fi; exec sleep 30", out));
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(code, 7);
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_NE(out.Read().find("rank 1 exited with code 7; stopping the other ranks"),
            std::string::npos)
      << out.Read();
}

TEST(Launcher, RanksThatIgnoreSigtermAreKilledAfterTheGracePeriod) {
  TempFile out;
  auto o = Shell(
      2, "if [ $CORTADO_RANK = 0 ]; then exit 3; fi; trap '' TERM; sleep 30 & wait; sleep 30", out);
  o.grace = milliseconds(300);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(RunLauncher(o), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// Runs a 2-rank launcher of `script` in a child process, waits until both ranks have printed
// "ready", sends the launcher SIGTERM `signals` times (200 ms apart) and returns its exit code
// (-1, with a failure recorded, when it does not exit).
int TerminatedLauncherCode(const std::string& script, const TempFile& out, int signals,
                           milliseconds grace) {
  pid_t pid = ::fork();
  if (pid == 0) {
    auto o = Shell(2, script, out);
    o.grace = grace;
    ::_exit(RunLauncher(o));
  }
  // Wait until both ranks are up, then signal the launcher only.
  WaitUntilBothReady(out);
  for (int i = 0; i < signals; ++i) {
    if (i > 0) std::this_thread::sleep_for(milliseconds(200));
    ::kill(pid, SIGTERM);
  }
  int status = 0;
  if (!WaitExited(pid, &status)) {
    ADD_FAILURE() << "launcher did not exit after SIGTERM\n" << out.Read();
    return -1;
  }
  EXPECT_TRUE(WIFEXITED(status));
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Launcher, ForwardsSigtermToTheRanks) {
  TempFile out;
  EXPECT_EQ(TerminatedLauncherCode(
                "trap 'echo got-term; exit 0' TERM; echo ready; while true; do sleep 0.05; done",
                out, 1, milliseconds(2000)),
            128 + SIGTERM);
  std::string text = out.Read();
  EXPECT_NE(text.find("[0] got-term"), std::string::npos) << text;
  EXPECT_NE(text.find("[1] got-term"), std::string::npos) << text;
}

// A forwarded signal starts no kill timer: ranks may take longer than the grace period to
// finish (a trainer completes its step and writes a checkpoint); a second signal kills them.
TEST(Launcher, ForwardedSignalsWaitForTheRanksAndASecondOneKills) {
  for (int signals : {1, 2}) {
    TempFile out;
    EXPECT_EQ(TerminatedLauncherCode("trap 'sleep 1; echo cleaned-up; exit 0' TERM; echo ready; "
                                     "while true; do sleep 0.05; done",
                                     out, signals, milliseconds(100)),
              128 + SIGTERM);
    std::string text = out.Read();
    // The launcher says what the first signal does and what a second one costs.
    EXPECT_NE(text.find("SIGTERM forwarded to the ranks"), std::string::npos) << text;
    if (signals == 2) {
      EXPECT_EQ(text.find("cleaned-up"), std::string::npos) << text;
      EXPECT_NE(text.find("a second SIGTERM: killing the ranks now; what they did after their "
                          "last checkpoint is lost"),
                std::string::npos)
          << text;
    } else {
      EXPECT_EQ(text.find("a second SIGTERM:"), std::string::npos) << text;
      EXPECT_NE(text.find("[0] cleaned-up"), std::string::npos) << text;
      EXPECT_NE(text.find("[1] cleaned-up"), std::string::npos) << text;
    }
  }
}

TEST(Launcher, RunsARealJob) {
  TempFile out;
  LauncherOptions o;
  o.nproc = 3;
  o.command = {CORTADO_DIST_TEST_WORKER, "matrix", "0,1,17,5003"};
  o.stdout_fd = out.fd;
  o.stderr_fd = out.fd;
  EXPECT_EQ(RunLauncher(o), 0) << out.Read();
  EXPECT_NE(out.Read().find("[2] MATRIX OK rank 2 of 3 (tcp)"), std::string::npos) << out.Read();
}

TEST(Launcher, BadOptionsAreRefusedUpFront) {
  LauncherOptions o;
  EXPECT_THROW(RunLauncher(o), Error);  // no command
  o.command = {"true"};
  o.nnodes = 2;
  try {
    RunLauncher(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--master"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cortado::dist
