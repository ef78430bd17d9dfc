#include "server/journal.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/status_macros.h"
#include "server/log.h"

namespace qparams {
namespace {

constexpr char kMagic[8] = {'Q', 'P', 'J', 'R', 'N', 'L', '1', '\n'};
constexpr char kSnapshotPrefix[] = "snapshot-";
constexpr char kJournalPrefix[] = "journal-";
constexpr uint32_t kMaxRecordBytes = 1u << 30;

std::string FileName(absl::string_view prefix, uint64_t number) {
  return absl::StrFormat("%s%020u", prefix, number);
}

uint32_t Checksum(absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string Frame(const storage::v1::Record& record) {
  const std::string payload = record.SerializeAsString();
  std::string out;
  out.reserve(8 + payload.size());
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU32(out, Checksum(payload));
  out += payload;
  return out;
}

// Appends the records of `bytes` (a whole file) to `records`; returns "" if every
// frame was whole and intact, else what was wrong and where.
std::string ParseFile(absl::string_view bytes, std::vector<storage::v1::Record>& records) {
  // A rotation cut short by a crash: the new file's magic never reached the disk.
  if (bytes.empty()) return "";
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return "the file does not start with the journal magic";
  }
  size_t offset = sizeof kMagic;
  while (offset < bytes.size()) {
    if (bytes.size() - offset < 8) {
      return absl::StrCat("a torn frame header at byte ", offset);
    }
    const uint32_t length = GetU32(bytes.data() + offset);
    const uint32_t checksum = GetU32(bytes.data() + offset + 4);
    if (length > kMaxRecordBytes || bytes.size() - offset - 8 < length) {
      return absl::StrCat("a torn record at byte ", offset, " (", bytes.size() - offset,
                          " bytes left of a ", length, "-byte record)");
    }
    const absl::string_view payload = bytes.substr(offset + 8, length);
    storage::v1::Record record;
    if (Checksum(payload) != checksum || !record.ParseFromArray(payload.data(), length)) {
      return absl::StrCat("a corrupt record at byte ", offset, " (checksum mismatch)");
    }
    records.push_back(std::move(record));
    offset += 8 + length;
  }
  return "";
}

}  // namespace

absl::StatusOr<Durability> ParseDurability(absl::string_view text) {
  if (text == "always") return Durability::kAlways;
  if (text == "batched") return Durability::kBatched;
  if (text == "none") return Durability::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("durability \"", text, "\" is not always, batched or none"));
}

absl::string_view DurabilityName(Durability durability) {
  switch (durability) {
    case Durability::kAlways:
      return "always";
    case Durability::kBatched:
      return "batched";
    case Durability::kNone:
      return "none";
  }
  return "";
}

// At start-up a storage error means the server cannot serve: FAILED_PRECONDITION.
absl::Status AtStart(absl::string_view what, const absl::Status& cause) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", cause.message()));
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const JournalOptions& options,
                                                       Recovery* recovery) {
  std::unique_ptr<Journal> journal(new Journal(options));
  Env* env = journal->env_;
  const std::string& dir = options.data_dir;
  if (absl::Status s = env->CreateDir(dir); !s.ok()) {
    return AtStart("the data directory", s);
  }
  absl::StatusOr<std::unique_ptr<FileLock>> lock = env->LockFile(journal->PathOf("LOCK"));
  if (!lock.ok()) {
    if (absl::IsFailedPrecondition(lock.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the data directory ", dir, " is in use by another server (", lock.status().message(),
          ")"));
    }
    return AtStart("the data directory's lock", lock.status());
  }
  journal->lock_ = *std::move(lock);

  // The files by kind and number.
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) return AtStart("the data directory", names.status());
  std::map<uint64_t, std::string> snapshots, journals;
  for (const std::string& name : *names) {
    uint64_t number = 0;
    for (auto [prefix, files] : {std::pair{absl::string_view(kSnapshotPrefix), &snapshots},
                                 std::pair{absl::string_view(kJournalPrefix), &journals}}) {
      absl::string_view rest = name;
      if (absl::ConsumePrefix(&rest, prefix) && rest.size() == 20 &&
          absl::SimpleAtoi(rest, &number)) {
        (*files)[number] = name;
      }
    }
  }

  // The newest snapshot, then every journal from its number on.
  uint64_t first = 0;
  if (!snapshots.empty()) first = snapshots.rbegin()->first;
  std::vector<std::string> to_read;
  if (!snapshots.empty()) to_read.push_back(snapshots.rbegin()->second);
  uint64_t last = first;
  for (const auto& [number, name] : journals) {
    if (number >= first) {
      to_read.push_back(name);
      last = std::max(last, number);
    }
  }

  bool intact = true;
  for (const std::string& name : to_read) {
    const std::string path = journal->PathOf(name);
    if (!intact) {
      recovery->problems.push_back(
          absl::StrCat(path, ": not replayed, as it follows a corrupt record"));
      journal->corrupt_files_.push_back(name);
      continue;
    }
    absl::StatusOr<std::string> bytes = env->ReadFile(path);
    if (!bytes.ok()) return AtStart("the data directory", bytes.status());
    ++recovery->files_read;
    const std::string problem = ParseFile(*bytes, recovery->records);
    if (!problem.empty()) {
      intact = false;
      recovery->problems.push_back(
          absl::StrCat(path, ": ", problem, "; restored everything before it"));
      journal->corrupt_files_.push_back(name);
    }
  }
  {
    absl::MutexLock lock(&journal->mu_);
    journal->file_number_ = last + 1;
  }
  return journal;
}

std::string Journal::PathOf(absl::string_view name) const {
  return absl::StrCat(options_.data_dir, "/", name);
}

absl::Status Journal::Start(Collector collect) {
  collect_ = std::move(collect);
  // The new snapshot holds everything recovered, so corrupt files can be set aside
  // (kept for inspection, no longer read) and the rest removed (by Compact).
  if (absl::Status s = Compact(); !s.ok()) return AtStart("the first snapshot", s);
  for (const std::string& name : corrupt_files_) {
    const std::string path = PathOf(name);
    if (absl::Status s = env_->RenameFile(path, path + ".corrupt"); !s.ok()) {
      return AtStart("setting a corrupt file aside", s);
    }
  }
  if (absl::Status s = env_->SyncDir(options_.data_dir); !s.ok()) {
    return AtStart("the data directory", s);
  }
  background_ = std::thread([this] { Background(); });
  return absl::OkStatus();
}

absl::Status Journal::Break(absl::string_view what, const absl::Status& cause, bool* report) {
  if (broken_.ok()) {
    broken_ = absl::UnavailableError(absl::StrCat(
        "the journal cannot be ", what, " (", cause.message(),
        "); the server refuses mutations until it restarts"));
    *report = true;
  }
  return broken_;
}

void Journal::Report(bool report) {
  if (!report) return;
  const absl::Status failure = health();
  LogError(failure.message());
  if (options_.on_failure) options_.on_failure(failure);
}

absl::Status Journal::health() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

absl::StatusOr<uint64_t> Journal::Append(const storage::v1::Record& record) {
  const std::string frame = Frame(record);
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
    status = file->Sync();
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

absl::Status Journal::Compact() {
  uint64_t number;
  bool report = false;
  absl::Status rotated;
  {
    // Rotate: later appends go to the new file, which the snapshot precedes.
    absl::MutexLock sync_lock(&sync_mu_);
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    number = file_number_ + (file_ == nullptr ? 0 : 1);
    absl::StatusOr<std::unique_ptr<WritableFile>> next =
        env_->NewWritableFile(PathOf(FileName(kJournalPrefix, number)));
    if (next.ok()) rotated = (*next)->Append(absl::string_view(kMagic, sizeof kMagic));
    else rotated = next.status();
    // The old file's records must be durable before later ones land in the new file.
    if (rotated.ok() && file_ != nullptr) {
      if (absl::Status s = file_->Sync(); !s.ok()) rotated = Break("synced", s, &report);
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
  QPARAMS_RETURN_IF_ERROR(WriteSnapshot(number));
  RemoveFilesBefore(number);
  return absl::OkStatus();
}

absl::Status Journal::WriteSnapshot(uint64_t number) {
  // Every state collected now is at least as new as the rotation.
  std::string snapshot(kMagic, sizeof kMagic);
  for (const storage::v1::Record& record : collect_()) snapshot += Frame(record);
  const std::string path = PathOf(FileName(kSnapshotPrefix, number));
  const std::string temp = path + ".tmp";
  absl::Status written;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(temp);
    written = file.status();
    if (written.ok()) written = (*file)->Append(snapshot);
    if (written.ok()) written = (*file)->Sync();
  }
  if (written.ok()) written = env_->RenameFile(temp, path);
  if (written.ok()) written = env_->SyncDir(options_.data_dir);
  if (!written.ok()) {
    // The older snapshot and journals stay and still hold everything; a leftover
    // temporary file is removed by the next compaction.
    if (absl::Status s = env_->RemoveFile(temp); !s.ok() && !absl::IsNotFound(s)) {
      LogError(s.message());
    }
    return absl::UnavailableError(
        absl::StrCat("snapshot ", path, " not written: ", written.message()));
  }
  absl::MutexLock lock(&mu_);
  snapshot_bytes_ = snapshot.size();
  return absl::OkStatus();
}

void Journal::RemoveFilesBefore(uint64_t number) {
  // Leftovers are harmless (recovery reads the newest snapshot and the journals from
  // its number on), so failures here are logged, not raised.
  absl::StatusOr<std::vector<std::string>> names = env_->ListDir(options_.data_dir);
  if (!names.ok()) {
    LogError(absl::StrCat("old journal files not removed: ", names.status().message()));
    return;
  }
  for (const std::string& name : *names) {
    absl::string_view rest = name;
    uint64_t n = 0;
    const bool ours =
        absl::ConsumePrefix(&rest, kSnapshotPrefix) || absl::ConsumePrefix(&rest, kJournalPrefix);
    absl::ConsumeSuffix(&rest, ".tmp");  // an unfinished snapshot
    if (ours && absl::SimpleAtoi(rest, &n) && n < number &&
        std::find(corrupt_files_.begin(), corrupt_files_.end(), name) == corrupt_files_.end()) {
      if (absl::Status s = env_->RemoveFile(PathOf(name)); !s.ok()) LogError(s.message());
    }
  }
  if (absl::Status s = env_->SyncDir(options_.data_dir); !s.ok()) LogError(s.message());
}

void Journal::Background() {
  while (!stop_.WaitForNotificationWithTimeout(options_.flush_interval)) {
    // A failure is logged and reported by SyncAll itself.
    if (!SyncAll().ok()) continue;
    bool compact;
    {
      absl::MutexLock lock(&mu_);
      compact = broken_.ok() && journal_bytes_ > options_.compact_min_bytes &&
                journal_bytes_ > 2 * snapshot_bytes_;
    }
    if (!compact) continue;
    if (absl::Status s = Compact(); !s.ok() && health().ok()) {
      LogError(absl::StrCat("compaction failed (the journal keeps growing): ", s.message()));
    }
  }
}

absl::Status Journal::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  stop_.Notify();
  if (background_.joinable()) background_.join();
  absl::Status status = SyncAll();
  absl::MutexLock lock(&mu_);
  file_.reset();
  return status;
}

Journal::~Journal() { Close().IgnoreError(); }

}  // namespace qparams
