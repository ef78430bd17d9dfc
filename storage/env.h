// The file-system operations the journal and snapshots need, behind one interface
// (LevelDB's Env): storage code never calls the OS itself, so tests can put a
// fault-injecting Env in its place (tests/client/fault_injection_env.h).
//
// Errors carry errno's code (absl::ErrnoToStatus) and a message naming the
// operation, the path and the OS error ("cannot fsync /d/journal-1: Input/output
// error"). Thread safety: an Env is shared by all threads; a WritableFile may take
// Append and Sync from different threads at once (the journal appends under its
// lock while another thread fsyncs).

#ifndef QPARAMS_STORAGE_ENV_H_
#define QPARAMS_STORAGE_ENV_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `data` at the end of the file, or fails (having written any part).
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes what was appended durable (fdatasync).
  virtual absl::Status Sync() = 0;
};

class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to `n` bytes into `scratch`: the number read, 0 at the end of the file.
  virtual absl::StatusOr<size_t> Read(char* scratch, size_t n) = 0;
};

// Held while the lock on a file is; released when destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Env {
 public:
  virtual ~Env() = default;

  // The process's POSIX Env; never destroyed.
  static Env* Posix();

  // Creates the directory `dir` if it does not exist.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // An exclusive lock on `path` (created if needed); FAILED_PRECONDITION if another
  // holder has it.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) = 0;
  // The names in `dir`, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Opens `path` for reading from its start (recovery streams files this way, so
  // that it never holds a whole file).
  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) = 0;
  // Creates `path`, empty (truncating a file of that name), for appending.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Makes the directory's entries (creations, renames, removals) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
};

}  // namespace qparams

#endif  // QPARAMS_STORAGE_ENV_H_
