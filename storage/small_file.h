// Small whole files in the data directory beside the journal (the slot map a
// replica was last given, domain/engine.h), written so that a crash leaves the old
// content or the new one, never a mix: a temporary file, fsynced, renamed over the
// name and the directory fsynced, as snapshots are. Every call goes through the Env.

#ifndef QPARAMS_STORAGE_SMALL_FILE_H_
#define QPARAMS_STORAGE_SMALL_FILE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/env.h"

namespace qparams {

// Replaces DIR/NAME with `content` atomically (through DIR/NAME.tmp). The Env's
// error (errno's code, naming the operation and the path) if a step fails; the old
// content is then still in place. Thread-compatible per name: callers serialize
// writes of one name.
absl::Status WriteSmallFile(Env& env, const std::string& dir, absl::string_view name,
                            absl::string_view content);

// DIR/NAME's content, or nullopt if no such file exists; the Env's error if it
// cannot be read. Thread-safe.
absl::StatusOr<std::optional<std::string>> ReadSmallFile(Env& env, const std::string& dir,
                                                        absl::string_view name);

}  // namespace qparams

#endif  // QPARAMS_STORAGE_SMALL_FILE_H_
