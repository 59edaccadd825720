#include "engine/base/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/base/error.h"

namespace cortado {

void WriteFully(int fd, const char* data, size_t size, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    CORTADO_CHECK(n > 0, "writing '", path, "' failed: ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  CORTADO_CHECK(!ec, "cannot create folder '", dir.string(), "': ", ec.message());
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp")).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CORTADO_CHECK(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
  try {
    WriteFully(fd, bytes.data(), bytes.size(), tmp);
    CORTADO_CHECK(::fsync(fd) == 0, "writing '", tmp, "' failed: fsync: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    Fail("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
}

}  // namespace cortado
