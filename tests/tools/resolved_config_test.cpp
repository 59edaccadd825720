// The config a run used, every key with its effective value (issue 30, item 3): dry-run prints
// it, checkpoints store it, and a resume compares against it, so a default that changes in a
// later version cannot silently change an old run.
#include <filesystem>
#include <map>
#include <string>

#include "engine/base/error.h"
#include "engine/io/checkpoint.h"
#include "engine/io/yaml_config.h"
#include "tests/tools/user_run.h"
#include "tools/run_config.h"

namespace cortado::tooltest {
namespace {

using ResolvedConfig = UserRun;

std::string Config(const std::string& ckpt) {
  return StrCat("model: {builder: lenet}\n", "data:\n  type: synthetic\n  batch_size: 2\n",
                "  synthetic: {shape: [1, 28, 28], classes: 10, samples: 8}\n",
                "solver: {max_iter: 2}\n", "checkpoint: {dir: ", ckpt, "}\n");
}

TEST_F(ResolvedConfig, DryRunAndCheckpointsHoldEveryDefaultAndResumeComparesThem) {
  const std::string ckpt_dir = (dir_ / "ckpt").string();
  const std::string config = Write("run.yaml", Config(ckpt_dir));
  std::string out, err;
  ASSERT_EQ(Cortado("train --config " + config + " --dry-run", &out, &err), 0) << err;
  for (const char* line :
       {"  base_lr: 0.1\n", "  lr_policy: cosine\n", "  momentum: 0.9\n", "  weight_decay: 5e-04\n",
        "  max_iter: 2\n", "  keep: 3\n", "  compute: fp32\n", "  interval: 50\n"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  ASSERT_EQ(Cortado("train --config " + config + " --stop-at-iter 1", &out, &err), 130) << err;
  const std::string ckpt = ckpt_dir + "/ckpt-00000001.cortado";
  ASSERT_EQ(Cortado("inspect --checkpoint " + ckpt, &out, &err), 0) << err;
  EXPECT_NE(out.find("  momentum: 0.9\n"), std::string::npos) << out;
  // A value that differs from the stored default is named with both values.
  ASSERT_EQ(
      Cortado("train --config " + config + " --resume auto --set solver.momentum=0.8", &out, &err),
      0)
      << err;
  EXPECT_NE(err.find("solver.momentum: 0.9 -> 0.8"), std::string::npos) << err;
  // A checkpoint of an earlier version stored the config as written: the keys it lacks had
  // unknown defaults and are not reported as changes.
  Checkpoint old = LoadCheckpoint(ckpt);
  old.meta.erase("config_form");
  old.meta["config"] = Config(ckpt_dir);
  const std::string old_path = (dir_ / "old.cortado").string();
  SaveCheckpoint(old, old_path);
  ASSERT_EQ(Cortado("train --config " + config + " --resume " + old_path, &out, &err), 0) << err;
  EXPECT_EQ(err.find("differs from the one"), std::string::npos) << err;
}

// The keys read as structures (through Has and Node, not a typed getter) are resolved too, with
// their defaults (issue 40): checkpoints said `config_form: resolved` without codec_keep_f32,
// codec_overrides and codec_candidates, so a default changed in a later version would have changed
// a resumed run without a word. The resolved config also resolves to itself: a run that reads it
// back (a resume, `eval` from a checkpoint) reads exactly what the first run read.
TEST(ResolvedConfigKeys, StructuredKeysAreResolvedWithTheirDefaults) {
  for (const std::string codec : {"f32", "epgc8", "auto"}) {
    SCOPED_TRACE(codec);
    YamlConfig yaml = YamlConfig::FromString(
        Config("ckpt") + "distributed: {codec: " + codec + "}\n", "run.yaml");
    const RunConfig c = ParseRunConfig(yaml, /*need_train=*/false);
    const std::map<std::string, std::string> flat = FlattenYaml(c.resolved_yaml, "resolved");
    const auto value = [&](const std::string& key) {
      auto it = flat.find(key);
      return it == flat.end() ? std::string("(absent)") : it->second;
    };
    EXPECT_EQ(value("distributed.codec_keep_f32[0]"), "batch_norm") << c.resolved_yaml;
    EXPECT_EQ(value("distributed.codec_keep_f32[1]"), "bias") << c.resolved_yaml;
    EXPECT_EQ(value("distributed.codec_overrides"), "{}") << c.resolved_yaml;
    if (codec == "auto") {
      EXPECT_EQ(value("distributed.codec_candidates[0]"), "f32") << c.resolved_yaml;
      EXPECT_EQ(value("distributed.codec_candidates[3]"), "epgc8") << c.resolved_yaml;
    } else {
      EXPECT_EQ(value("distributed.codec_candidates[0]"), "(absent)") << c.resolved_yaml;
    }
    YamlConfig again = YamlConfig::FromString(c.resolved_yaml, "stored");
    EXPECT_EQ(ParseRunConfig(again, /*need_train=*/false).resolved_yaml, c.resolved_yaml);
  }
  // Given values are resolved in their canonical form, and so compare as such.
  YamlConfig yaml = YamlConfig::FromString(
      Config("ckpt") +
          "distributed: {codec: auto, codec_keep_f32: [bias], codec_candidates: [f32, epgc8], "
          "codec_overrides: {\"fc*\": f32}}\n",
      "run.yaml");
  const RunConfig c = ParseRunConfig(yaml, /*need_train=*/false);
  const std::map<std::string, std::string> flat = FlattenYaml(c.resolved_yaml, "resolved");
  EXPECT_EQ(flat.at("distributed.codec_keep_f32[0]"), "bias");
  EXPECT_EQ(flat.count("distributed.codec_keep_f32[1]"), 0u);
  EXPECT_EQ(flat.at("distributed.codec_overrides.fc*"), "f32");
  EXPECT_EQ(flat.at("distributed.codec_candidates[1]"), "epgc8");
  YamlConfig again = YamlConfig::FromString(c.resolved_yaml, "stored");
  EXPECT_EQ(ParseRunConfig(again, /*need_train=*/false).resolved_yaml, c.resolved_yaml);
}

}  // namespace
}  // namespace cortado::tooltest
