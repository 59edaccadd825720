// Writing files so that a crash or a full disk never leaves half of one: the pieces that
// weights files, traces and the converter's completion records share. (Checkpoints keep their
// own loop, which can inject faults between pieces for tests.)
#pragma once

#include <cstddef>
#include <string>

namespace cortado {

// Writes all `size` bytes to fd, through short writes and EINTR; throws naming `path`.
void WriteFully(int fd, const char* data, size_t size, const std::string& path);

// Replaces `path` with `bytes` or leaves it as it was: the bytes go to a temporary sibling
// (".<name>.tmp"), are fsync'd, and the temporary is renamed over `path` (and the folder
// fsync'd). Creates missing parent folders. Throws naming the file; the temporary is removed.
void WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace cortado
