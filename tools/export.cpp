// `cortado export --checkpoint PATH --out MODEL.safetensors [--overwrite]`: writes a
// checkpoint's weights and batch-norm statistics as a safetensors file under torchvision's
// names where the model is a torchvision architecture (tools/weights.h), for PyTorch
// (`model.load_state_dict(safetensors.torch.load_file(...))`), `cortado train --weights` and
// `cortado eval --weights`. An existing file is replaced only with --overwrite; the file is
// written under a temporary name and renamed when complete.
#include <cstdio>
#include <filesystem>

#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/yaml_config.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/run_config.h"
#include "tools/weights.h"

namespace cortado::tools {

void AddExportCommand(CLI::App& app) {
  struct Args {
    std::string checkpoint, out;
    bool overwrite = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Write a checkpoint's weights as safetensors, with torchvision's names");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint file (ckpt-*.cortado)")->required();
  cmd->add_option("--out", args->out, "Safetensors file to write")->required();
  cmd->add_flag("--overwrite", args->overwrite, "Replace --out if it exists");
  cmd->callback([args] {
    CheckInputFile("--checkpoint", args->checkpoint, "a checkpoint file (ckpt-*.cortado)");
    std::error_code ec;
    if (std::filesystem::exists(args->out, ec) && !args->overwrite) {
      UsageFail("--out '" + args->out + "' exists; give --overwrite to replace it");
    }
    const Checkpoint ckpt = LoadCheckpoint(args->checkpoint);
    // The builder decides the names; a YAML graph keeps Cortado's. The stored config's data
    // paths are the training machine's: a checkpoint copied elsewhere exports all the same.
    std::string builder;
    if (auto stored = ckpt.meta.find("config"); stored != ckpt.meta.end()) {
      YamlConfig yaml =
          YamlConfig::FromString(stored->second, args->checkpoint + " (stored config)");
      builder = ParseRunConfig(yaml, /*need_train=*/false, /*check_data=*/false).model.builder;
    }
    const Safetensors file = ExportWeights(ckpt, builder);
    SaveSafetensors(file, args->out);
    size_t bytes = 0;
    for (const SafetensorsEntry& e : file.entries) bytes += e.bytes.size();
    std::printf("wrote %zu tensors (%.1f MB) of %s (model %s) to %s\n", file.entries.size(),
                bytes / 1e6, args->checkpoint.c_str(), builder.empty() ? "graph" : builder.c_str(),
                args->out.c_str());
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
