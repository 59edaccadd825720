#include "tools/file_kind.h"

#include <fstream>

#include "tools/command_line.h"

namespace cortado::tools {

FileKind SniffFileKind(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[9] = {};
  if (!in.read(head, sizeof head)) return FileKind::kOther;
  if (std::string(head, 8) == "CRTDCKPT") return FileKind::kCheckpoint;
  return head[8] == '{' ? FileKind::kSafetensors : FileKind::kOther;
}

void ExpectCheckpoint(const std::string& flag, const std::string& path, const std::string& use) {
  if (SniffFileKind(path) != FileKind::kSafetensors) return;
  UsageFail(flag, ": '", path, "' is a safetensors weights file, not a checkpoint: ", use);
}

void ExpectSafetensors(const std::string& flag, const std::string& path) {
  if (SniffFileKind(path) != FileKind::kCheckpoint) return;
  UsageFail(flag, ": '", path, "' is a Cortado checkpoint, not a safetensors file: continue its ",
            "run with --resume ", path, ", or write its weights with `cortado export --checkpoint ",
            path, " --out F.safetensors`");
}

}  // namespace cortado::tools
