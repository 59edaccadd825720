// docs/IMAGENET.md's PyTorch snippet, run as written (issue 30, item 14): it loads the file
// `cortado export` wrote into torchvision's ResNet-50 and saves that model as a safetensors
// file that `cortado train --weights` takes whole. Skipped where /usr/bin/python3 has no torch.
#include <string>

#include "engine/base/error.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

using PytorchSnippet = UserRun;

// The ```python block after the marker in docs/IMAGENET.md.
std::string Snippet() {
  const std::string doc =
      testing::ReadFileBytes(std::string(CORTADO_SOURCE_DIR) + "/docs/IMAGENET.md");
  const std::string open = "<!-- pytorch-snippet -->\n```python\n";
  const size_t begin = doc.find(open);
  if (begin == std::string::npos) return "";
  const size_t end = doc.find("```\n", begin + open.size());
  return end == std::string::npos ? "" : doc.substr(begin + open.size(), end - begin - open.size());
}

TEST_F(PytorchSnippet, LoadsAnExportAndSavesATorchvisionModelThatWeightsTakes) {
  const std::string python = "timeout 300 /usr/bin/python3";
  if (RunShell(python + " -c 'import torch, torchvision'", nullptr, nullptr) != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no torch and torchvision";
  }
  const std::string code = Snippet();
  ASSERT_NE(code.find("load_safetensors(\"resnet50.safetensors\")"), std::string::npos) << code;
  Write("snippet.py", code);
  auto config = [&](const std::string& run) {
    return Write(
        run + ".yaml",
        StrCat("model: {builder: resnet50}\n", "data:\n  type: synthetic\n", "  batch_size: 2\n",
               "  synthetic: {shape: [3, 32, 32], classes: 1000, samples: 2}\n",
               "solver: {max_iter: 1}\n", "checkpoint: {dir: ", (dir_ / run).string(), "}\n"));
  };
  std::string out, err;
  ASSERT_EQ(Cortado("train --threads 2 --config " + config("a"), &out, &err), 0) << err;
  ASSERT_EQ(Cortado("export --checkpoint " + (dir_ / "a" / "ckpt-00000001.cortado").string() +
                        " --out " + (dir_ / "resnet50.safetensors").string(),
                    &out, &err),
            0)
      << err;
  ASSERT_EQ(RunShell("cd " + dir_.string() + " && " + python + " snippet.py", &out, &err), 0)
      << out << err;
  const std::string from_torch = (dir_ / "from_torch.safetensors").string();
  ASSERT_EQ(
      Cortado("train --threads 2 --config " + config("b") + " --weights " + from_torch, &out, &err),
      0)
      << err;
  // Every tensor of the net came from the file: nothing resized, missing or left over.
  EXPECT_NE((out + err).find(" tensor(s) loaded from '" + from_torch + "'"), std::string::npos)
      << out << err;
  EXPECT_EQ((out + err).find("left at initialization"), std::string::npos) << out << err;
}

}  // namespace
}  // namespace cortado::tooltest
