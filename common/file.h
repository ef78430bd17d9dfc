// Reading a whole file: the one way the project does it (TLS files, the tokens
// file). The journal streams its files instead (storage/env.h).

#ifndef QPARAMS_COMMON_FILE_H_
#define QPARAMS_COMMON_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace qparams {

// The whole content of the file `path`. Errors carry errno's code
// (absl::ErrnoToStatus: NOT_FOUND, PERMISSION_DENIED, ...) and a message naming the
// path and the OS error ("cannot read PATH: No such file or directory"); callers
// add what the file was for.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace qparams

#endif  // QPARAMS_COMMON_FILE_H_
