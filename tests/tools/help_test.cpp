// Every command's help is something a new user can start from (issue 30, item 13): one example
// line, no default that contradicts the flag's own range, and unknown-option lists that name
// each option once.
#include <regex>
#include <sstream>
#include <string>

#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using Help = UserRun;

int CountLines(const std::string& text, const std::string& prefix) {
  std::istringstream lines(text);
  int n = 0;
  for (std::string line; std::getline(lines, line);) n += line.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

TEST_F(Help, EveryCommandsHelpHasOneExampleLine) {
  for (const std::string command :
       {"train", "eval", "convert", "launch", "inspect", "export", "bench", "bench train",
        "bench data", "bench comm", "bench codec"}) {
    std::string out, err;
    ASSERT_EQ(Cortado("help " + command, &out, &err), 0) << command << "\n" << err;
    EXPECT_EQ(CountLines(out, "Example: cortado "), 1) << command << "\n" << out;
  }
}

TEST_F(Help, StopAtIterShowsNoDefaultOutsideItsRange) {
  std::string out, err;
  ASSERT_EQ(Cortado("help train", &out, &err), 0) << err;
  EXPECT_TRUE(std::regex_search(out, std::regex("--stop-at-iter INT .*\\(>= 1\\) \\[default: "
                                                "none: run to the end\\]")))
      << out;
  EXPECT_EQ(out.find("(>= 1) [default: 0]"), std::string::npos) << out;
}

TEST_F(Help, UnknownOptionListsNameEachOptionOnceAndBenchNamesCodec) {
  std::string out, err;
  EXPECT_EQ(Cortado("train --bogus", &out, &err), 2);
  EXPECT_NE(err.find("unknown option '--bogus' (known: --help, --config, --set,"),
            std::string::npos)
      << err;
  EXPECT_EQ(Cortado("bench --bogus", &out, &err), 2);
  EXPECT_NE(err.find("(known: --help)"), std::string::npos) << err;
  ASSERT_EQ(Cortado("help", &out, &err), 0) << err;
  EXPECT_TRUE(std::regex_search(out, std::regex("\n  bench +Benchmarks: .*codec"))) << out;
}

}  // namespace
}  // namespace cortado::tooltest
