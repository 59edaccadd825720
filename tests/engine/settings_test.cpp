#include "engine/io/settings.h"

#include <gtest/gtest.h>

#include "engine/base/error.h"

namespace cortado {
namespace {

TEST(Settings, TypedGettersAndDefaults) {
  Settings s;
  s.set_owner("layer 'c' (Convolution)");
  s.Set("kernel", int64_t{3}).Set("lr", 0.5).Set("bias", false).Set("mode", "max");
  s.SetInts("pad", {1, 2});
  EXPECT_EQ(s.GetInt("kernel"), 3);
  EXPECT_EQ(s.GetInt("stride", 1), 1);
  EXPECT_DOUBLE_EQ(s.GetFloat("lr", 0), 0.5);
  EXPECT_FALSE(s.GetBool("bias", true));
  EXPECT_EQ(s.GetString("mode"), "max");
  EXPECT_EQ(s.GetPair("kernel", 1), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(s.GetPair("pad", 0), (std::vector<int64_t>{1, 2}));
  EXPECT_NO_THROW(s.CheckAllUsed());
}

TEST(Settings, BadValueNamesOwnerKeyAndPlace) {
  Settings s;
  s.set_owner("layer 'conv1' (Convolution)");
  s.Set("kernel", "five", "net.yaml:3:11");
  try {
    s.GetInt("kernel");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("conv1"), std::string::npos) << m;
    EXPECT_NE(m.find("kernel"), std::string::npos) << m;
    EXPECT_NE(m.find("net.yaml:3:11"), std::string::npos) << m;
  }
}

TEST(Settings, UnknownKeyIsReportedWithKnownOnes) {
  Settings s;
  s.set_owner("layer 'x'");
  s.Set("kernal", int64_t{3});
  s.GetInt("kernel", 1);
  try {
    s.CheckAllUsed();
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("unknown key 'kernal'"), std::string::npos) << m;
    EXPECT_NE(m.find("kernel"), std::string::npos) << m;
  }
}

TEST(Settings, MissingRequiredKey) {
  Settings s;
  EXPECT_THROW(s.GetInt("num_output"), Error);
}

}  // namespace
}  // namespace cortado
