// Environment variables and number parsing: one way to read them, bad values refused naming
// the variable.
#include "engine/base/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "engine/base/error.h"
#include "engine/base/numbers.h"
#include "tests/support/errors.h"

namespace cortado {
namespace {

using testing::ErrorOf;

TEST(Numbers, TheWholeTextMustBeTheNumber) {
  int64_t i = 0;
  EXPECT_TRUE(ParseInt64("42", &i));
  EXPECT_EQ(i, 42);
  EXPECT_TRUE(ParseInt64("-7", &i));
  EXPECT_EQ(i, -7);
  EXPECT_TRUE(ParseInt64("+7", &i));
  EXPECT_EQ(i, 7);
  EXPECT_TRUE(ParseInt64("9223372036854775807", &i));
  for (const char* bad : {"", " 8", "8 ", "8x", "0x10", "1.5", "9223372036854775808", "+", "--1"}) {
    EXPECT_FALSE(ParseInt64(bad, &i)) << bad;
  }
  double d = 0;
  EXPECT_TRUE(ParseFiniteDouble("2.5e-3", &d));
  EXPECT_DOUBLE_EQ(d, 2.5e-3);
  EXPECT_TRUE(ParseFiniteDouble("-1", &d));
  for (const char* bad : {"", " 1", "1 ", "1e999", "inf", "nan", "1,5", "fast"}) {
    EXPECT_FALSE(ParseFiniteDouble(bad, &d)) << bad;
  }
}

TEST(Env, UnsetOrEmptyIsTheDefaultAndBadValuesAreNamed) {
  ::unsetenv("CORTADO_TEST_VAR");
  EXPECT_EQ(EnvInt("CORTADO_TEST_VAR", 5, 1, 10), 5);
  ::setenv("CORTADO_TEST_VAR", "", 1);
  EXPECT_EQ(EnvInt("CORTADO_TEST_VAR", 5, 1, 10), 5);
  EXPECT_FALSE(EnvString("CORTADO_TEST_VAR").has_value());
  ::setenv("CORTADO_TEST_VAR", "7", 1);
  EXPECT_EQ(EnvInt("CORTADO_TEST_VAR", 5, 1, 10), 7);
  EXPECT_DOUBLE_EQ(EnvDouble("CORTADO_TEST_VAR", 0.5, 0, 10), 7.0);
  for (const char* bad : {"11", "0", "7x", "seven"}) {
    ::setenv("CORTADO_TEST_VAR", bad, 1);
    const std::string m = ErrorOf([] { EnvInt("CORTADO_TEST_VAR", 5, 1, 10); });
    EXPECT_NE(
        m.find(std::string("CORTADO_TEST_VAR='") + bad + "': must be an integer from 1 to 10"),
        std::string::npos)
        << m;
  }
  ::setenv("CORTADO_TEST_VAR", "20", 1);
  const std::string range = ErrorOf([] { EnvDouble("CORTADO_TEST_VAR", 0.5, 0, 10); });
  EXPECT_NE(range.find("CORTADO_TEST_VAR='20': must be a number from 0 to 10"), std::string::npos)
      << range;
  ::setenv("CORTADO_TEST_VAR", "loud", 1);
  const std::string m = ErrorOf([] { EnvChoice("CORTADO_TEST_VAR", "info", {"info", "debug"}); });
  EXPECT_NE(m.find("CORTADO_TEST_VAR='loud': must be one of info, debug"), std::string::npos) << m;
  ::setenv("CORTADO_TEST_VAR", "debug", 1);
  EXPECT_EQ(EnvChoice("CORTADO_TEST_VAR", "info", {"info", "debug"}), "debug");
  ::unsetenv("CORTADO_TEST_VAR");
}

}  // namespace
}  // namespace cortado
