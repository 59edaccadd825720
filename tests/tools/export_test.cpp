// `cortado export` of a checkpoint taken to another machine (issue 40, item 9): the stored
// config's data paths name the machine that trained, and export reads the model from that
// config only, so data that is not here must not stop it.
#include <filesystem>
#include <string>

#include "engine/io/safetensors.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

namespace fs = std::filesystem;

using Export = UserRun;

TEST_F(Export, ACheckpointWhoseDataIsNotOnThisMachineExports) {
  WriteImages("train", {"a", "b", "c"});
  WriteImages("val", {"a", "b", "c"}, 1);
  const std::string config =
      Write("run.yaml", LmdbConfig(Convert("train", "train_db"), Convert("val", "val_db")));
  std::string out, err;
  ASSERT_EQ(Cortado("train --no-progress --config " + config, &out, &err), 0) << err;
  // "Another machine": the checkpoint alone, in another folder, and the data gone.
  const fs::path copy = dir_ / "elsewhere" / "ckpt-00000002.cortado";
  fs::create_directories(copy.parent_path());
  fs::copy_file(dir_ / "ckpt" / "ckpt-00000002.cortado", copy);
  fs::remove_all(dir_ / "train_db");
  fs::remove_all(dir_ / "val_db");
  const std::string weights = (dir_ / "w.safetensors").string();
  ASSERT_EQ(Cortado("export --checkpoint " + copy.string() + " --out " + weights, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("wrote 4 tensors"), std::string::npos) << out;
  EXPECT_NE(LoadSafetensors(weights).Find("conv.weight"), nullptr);
}

}  // namespace
}  // namespace cortado::tooltest
