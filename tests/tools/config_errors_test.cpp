// Config mistakes a new user makes, as `cortado train` reports them (issue 30): each error is
// one line that names the real mistake and where it is.
#include <string>

#include "engine/error.h"
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

}  // namespace
}  // namespace cortado::tooltest
