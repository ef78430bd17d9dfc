// The journal's writing half (journal.h): appends, fsyncs, rotation to a new
// journal file, and snapshots, in the frames of journal_format.h.

#include "storage/journal.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "storage/journal_format.h"

namespace qparams {
namespace {

using journal_format::AppendFrame;
using journal_format::FileName;
using journal_format::kJournalPrefix;
using journal_format::kMagic;
using journal_format::kSnapshotPrefix;

constexpr size_t kWriteChunk = size_t{1} << 20;

// Seconds since `start`, into `histogram` (if any).
void ObserveSince(BucketHistogram* histogram, absl::Time start) {
  if (histogram != nullptr) histogram->Observe(absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace

absl::StatusOr<uint64_t> Journal::Append(const storage::v1::Record& record) {
  std::string frame;
  AppendFrame(record, frame);
  bool report = false;
  absl::StatusOr<uint64_t> sequence;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    if (file_ == nullptr) return absl::FailedPreconditionError("the journal is not open");
    if (absl::Status s = file_->Append(frame); !s.ok()) {
      sequence = Break("written", s, &report);
    } else {
      journal_bytes_ += frame.size();
      sequence = ++appended_;
    }
  }
  Report(report);
  if (sequence.ok()) {
    if (options_.metrics.appends != nullptr) options_.metrics.appends->Increment();
    if (options_.metrics.appended_bytes != nullptr) {
      options_.metrics.appended_bytes->Increment(frame.size());
    }
  }
  return sequence;
}

absl::Status Journal::Sync(uint64_t sequence) {
  if (options_.durability != Durability::kAlways) return health();
  {
    absl::MutexLock lock(&sync_mu_);
    if (synced_ >= sequence) return absl::OkStatus();
  }
  return SyncAll();
}

absl::Status Journal::SyncAll() {
  bool report = false;
  absl::Status status;
  {
    absl::MutexLock sync_lock(&sync_mu_);
    WritableFile* file;
    uint64_t target;
    {
      absl::MutexLock lock(&mu_);
      if (!broken_.ok()) return broken_;
      if (synced_ >= appended_ || file_ == nullptr) return absl::OkStatus();
      file = file_.get();
      target = appended_;
    }
    // Appends continue meanwhile; the file cannot change under us, as rotation also
    // holds sync_mu_.
    const absl::Time start = absl::Now();
    status = file->Sync();
    ObserveSince(options_.metrics.fsync_seconds, start);
    if (status.ok()) {
      synced_ = target;
    } else {
      absl::MutexLock lock(&mu_);
      status = Break("synced", status, &report);
    }
  }
  Report(report);
  return status;
}

absl::Status Journal::Rotate() {
  bool report = false;
  absl::Status rotated;
  {
    absl::MutexLock sync_lock(&sync_mu_);
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    const uint64_t number = file_number_ + (file_ == nullptr ? 0 : 1);
    absl::StatusOr<std::unique_ptr<WritableFile>> next =
        env_->NewWritableFile(PathOf(FileName(kJournalPrefix, number)));
    if (next.ok()) rotated = (*next)->Append(absl::string_view(kMagic, sizeof kMagic));
    else rotated = next.status();
    // The old file's records must be durable before later ones land in the new file.
    if (rotated.ok() && file_ != nullptr) {
      const absl::Time start = absl::Now();
      absl::Status s = file_->Sync();
      ObserveSince(options_.metrics.fsync_seconds, start);
      if (!s.ok()) rotated = Break("synced", s, &report);
    }
    if (rotated.ok()) {
      file_ = *std::move(next);
      file_number_ = number;
      journal_bytes_ = 0;
      synced_ = appended_;
    }
  }
  if (!rotated.ok()) {
    Report(report);
    return rotated;
  }
  // The new file's entry must be durable before anything is acknowledged from it.
  if (absl::Status s = env_->SyncDir(options_.data_dir); !s.ok()) {
    absl::Status broken;
    {
      absl::MutexLock lock(&mu_);
      broken = Break("rotated", s, &report);
    }
    Report(report);
    return broken;
  }
  return absl::OkStatus();
}

absl::Status Journal::WriteSnapshot(uint64_t number) {
  const std::string path = PathOf(FileName(kSnapshotPrefix, number));
  const std::string temp = path + ".tmp";
  const absl::Time start = absl::Now();
  int64_t size = 0;
  absl::Status written;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(temp);
    written = file.status();
    if (written.ok()) {
      // Frames gather in a buffer that is written out once it passes kWriteChunk,
      // so the snapshot never holds more than that (and one record) in memory.
      std::string buffer(kMagic, sizeof kMagic);
      auto write_out = [&] {
        absl::Status s = (*file)->Append(buffer);
        size += buffer.size();
        buffer.clear();
        return s;
      };
      // Every state collected now is at least as new as the rotation.
      written = collect_([&](const storage::v1::Record& record) -> absl::Status {
        AppendFrame(record, buffer);
        return buffer.size() >= kWriteChunk ? write_out() : absl::OkStatus();
      });
      if (written.ok()) written = write_out();
      if (written.ok()) written = (*file)->Sync();
    }
  }
  if (written.ok()) written = env_->RenameFile(temp, path);
  if (written.ok()) written = env_->SyncDir(options_.data_dir);
  if (!written.ok()) {
    // The older snapshot and journals stay and still hold everything; a leftover
    // temporary file is removed by the next compaction.
    if (absl::Status s = env_->RemoveFile(temp); !s.ok() && !absl::IsNotFound(s)) {
      LogError(s.message());
    }
    if (options_.metrics.snapshot_failures != nullptr) {
      options_.metrics.snapshot_failures->Increment();
    }
    return absl::UnavailableError(
        absl::StrCat("snapshot ", path, " not written: ", written.message()));
  }
  ObserveSince(options_.metrics.snapshot_seconds, start);
  absl::MutexLock lock(&mu_);
  snapshot_bytes_ = size;
  return absl::OkStatus();
}

}  // namespace qparams
