// A file written whole or not at all: qparams-cli's `export -o FILE` and
// `report --html FILE` write FILE.partial and rename it to FILE at the end, so that
// FILE is never half a document, and a failure leaves neither file behind.
//
// Part of target qparams_cli_lib (tools/README.md), for the CLI's output files.

#ifndef QPARAMS_TOOLS_PARTIAL_FILE_H_
#define QPARAMS_TOOLS_PARTIAL_FILE_H_

#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace qparams {

// Writes go to `path`.partial; Commit() renames it to `path`. Destroyed without a
// successful Commit() (an error on the way, an early return), it removes the
// .partial file. Errors name the .partial file and the OS error; callers add what
// the file is for. Thread safety: none (one writer).
class PartialFile {
 public:
  explicit PartialFile(std::string path);
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  ~PartialFile();

  // Creates (or truncates) `path`.partial. FailedPrecondition if it cannot be
  // written ("cannot write PATH.partial: No such file or directory").
  absl::Status Open();
  bool is_open() const { return file_.is_open(); }

  // The open stream, for writers that take an std::ostream; Commit() checks it.
  std::ostream& stream() { return file_; }

  // Appends `data`. DataLoss if the write fails.
  absl::Status Write(absl::string_view data);

  // Closes the file and renames it to `path`. DataLoss if a write or the close
  // failed; FailedPrecondition if the rename does. On error the .partial file is
  // removed and `path` is untouched.
  absl::Status Commit();

  const std::string& partial_path() const { return partial_; }

 private:
  const std::string path_;
  const std::string partial_;
  std::ofstream file_;
  bool committed_ = false;
};

}  // namespace qparams

#endif  // QPARAMS_TOOLS_PARTIAL_FILE_H_
