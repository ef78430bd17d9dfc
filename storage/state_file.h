// A small file of a data directory replaced whole, never seen half-written: the
// slot moves a replica takes part in (domain/slot_moves.h) live in one, beside the
// journal, which ignores it.

#ifndef QPARAMS_STORAGE_STATE_FILE_H_
#define QPARAMS_STORAGE_STATE_FILE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/env.h"

namespace qparams {

// Writes `contents` to `dir`/`name` through a temporary file (`name`.tmp): write,
// fsync, rename, directory fsync, so that a crash leaves the old contents or the new.
// The Env's error (naming the operation and the path) otherwise; the old file stays.
absl::Status WriteStateFile(Env& env, const std::string& dir, absl::string_view name,
                            absl::string_view contents);

// The contents of `dir`/`name`, or nullopt if there is no such file; the Env's
// error for a file that cannot be read.
absl::StatusOr<std::optional<std::string>> ReadStateFile(Env& env, const std::string& dir,
                                                         absl::string_view name);

}  // namespace qparams

#endif  // QPARAMS_STORAGE_STATE_FILE_H_
