#include "storage/write_probe.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace qparams {

absl::Status WriteProbe::Check() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - probed_ < max_age_) return result_;
  result_ = Probe();
  probed_ = now;
  return result_;
}

absl::Status WriteProbe::Probe() {
  const std::string path = absl::StrCat(dir_, "/", kFileName);
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(path);
  if (!file.ok()) return file.status();
  // The fsync is the point: a failing device accepts writes into the page cache and
  // reports EIO only there.
  absl::Status written = (*file)->Append("probe\n");
  if (written.ok()) written = (*file)->Sync();
  file->reset();
  absl::Status removed = env_->RemoveFile(path);
  return written.ok() ? removed : written;
}

}  // namespace qparams
