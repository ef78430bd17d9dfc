#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qparams {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  auto error = [&path](int code) {
    return absl::ErrnoToStatus(code, absl::StrCat("cannot read ", path));
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return error(errno);
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int code = errno;
      close(fd);
      return error(code);
    }
    if (n == 0) break;
    out.append(buffer, n);
  }
  close(fd);
  return out;
}

}  // namespace qparams
