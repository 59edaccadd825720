// `cmake --install` puts the binary on a prefix's bin (so the guides' bare `cortado ...` work with
// it on PATH) and the shipped configs and user scripts under share/cortado (issue 30).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/tools/fashion_slice.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;
using tooltest::RunShell;

TEST(Install, CmakeInstallGivesTheBinaryConfigsAndScripts) {
  const fs::path dir = tooltest::FreshTestDir("cortado_install");
  const fs::path prefix = dir / "prefix";
  std::string out, err;
  ASSERT_EQ(RunShell("timeout 120 cmake --install " + std::string(CORTADO_BINARY_DIR) +
                         " --prefix " + prefix.string(),
                     &out, &err),
            0)
      << out << err;
  EXPECT_EQ(RunShell("PATH=" + (prefix / "bin").string() + ":/usr/bin:/bin cortado --version", &out,
                     &err),
            0)
      << err;
  EXPECT_EQ(out.rfind("cortado ", 0), 0u) << out;
  const fs::path share = prefix / "share" / "cortado";
  EXPECT_TRUE(fs::exists(share / "configs" / "resnet50.yaml"));
  EXPECT_TRUE(fs::exists(share / "scripts" / "imagenet_val_list.py"));
  EXPECT_TRUE(fs::exists(share / "scripts" / "plot_metrics.py"));
  // The installed recipe parses with the installed binary.
  EXPECT_EQ(RunShell("timeout 120 " + (prefix / "bin" / "cortado").string() + " inspect --config " +
                         (share / "configs" / "resnet50.yaml").string(),
                     &out, &err),
            0)
      << err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cortado
