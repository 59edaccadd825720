// Which of Cortado's two weight-carrying formats a file is, by its first bytes, so that a file
// given to the other format's flag is named for what it is, with the flag or command that takes
// it (instead of "bad magic", or a safetensors header length read from a checkpoint's magic).
#pragma once

#include <string>

namespace cortado::tools {

enum class FileKind { kCheckpoint, kSafetensors, kOther };

// kCheckpoint: Cortado's magic; kSafetensors: an 8-byte header length, then '{'.
FileKind SniffFileKind(const std::string& path);

// Usage errors (exit 2) when `path`, given to `flag`, is a safetensors file where a checkpoint
// is expected, or a checkpoint where a safetensors file is; `use` says what takes it instead.
void ExpectCheckpoint(const std::string& flag, const std::string& path, const std::string& use);
void ExpectSafetensors(const std::string& flag, const std::string& path);

}  // namespace cortado::tools
