#include "tools/partial_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace qparams {

PartialFile::PartialFile(std::string path)
    : path_(std::move(path)), partial_(absl::StrCat(path_, ".partial")) {}

PartialFile::~PartialFile() {
  if (committed_) return;
  if (file_.is_open()) file_.close();
  std::remove(partial_.c_str());
}

absl::Status PartialFile::Open() {
  file_.open(partial_, std::ios::binary | std::ios::trunc);
  if (!file_) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", partial_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status PartialFile::Write(absl::string_view data) {
  file_.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!file_) {
    return absl::DataLossError(
        absl::StrCat("writing ", partial_, " failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status PartialFile::Commit() {
  // A failed write may have been reported to a writer that only sets the stream's
  // state (an std::ostream user): the state is checked here too.
  const bool written = static_cast<bool>(file_);
  file_.close();
  if (!written || !file_) {
    std::remove(partial_.c_str());
    return absl::DataLossError(absl::StrCat("writing ", partial_, " failed"));
  }
  if (std::rename(partial_.c_str(), path_.c_str()) != 0) {
    const absl::Status status = absl::FailedPreconditionError(
        absl::StrCat("cannot rename ", partial_, " to ", path_, ": ", std::strerror(errno)));
    std::remove(partial_.c_str());
    return status;
  }
  committed_ = true;
  return absl::OkStatus();
}

}  // namespace qparams
