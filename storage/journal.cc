#include "storage/journal.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "core/status_macros.h"
#include "storage/journal_format.h"

namespace qparams {

using journal_format::kJournalPrefix;
using journal_format::kSnapshotPrefix;

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

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const JournalOptions& options) {
  std::unique_ptr<Journal> journal(new Journal(options));
  Env* env = journal->env_;
  const std::string& dir = options.data_dir;
  if (absl::Status s = env->CreateDir(dir); !s.ok()) {
    return AtStart("the data directory", s);
  }
  absl::StatusOr<std::unique_ptr<FileLock>> lock = env->LockFile(journal->PathOf("LOCK"));
  if (!lock.ok()) {
    if (absl::IsFailedPrecondition(lock.status())) {
      return absl::FailedPreconditionError(absl::StrCat("the data directory ", dir,
                                                        " is in use by another server (",
                                                        lock.status().message(), ")"));
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
  if (!snapshots.empty()) {
    first = snapshots.rbegin()->first;
    journal->snapshot_file_ = snapshots.rbegin()->second;
  }
  uint64_t last = first;
  for (const auto& [number, name] : journals) {
    if (number >= first) {
      journal->journal_files_.push_back(name);
      last = std::max(last, number);
    }
  }
  absl::MutexLock lock_mu(&journal->mu_);
  journal->file_number_ = last + 1;
  return journal;
}

absl::StatusOr<Recovery> Journal::ReadFiles(RecordPipe& pipe) {
  std::vector<std::string> to_read = journal_files_;
  if (!snapshot_file_.empty()) to_read.insert(to_read.begin(), snapshot_file_);
  Recovery recovery;
  bool intact = true;
  for (const std::string& name : to_read) {
    const std::string path = PathOf(name);
    if (!intact) {
      recovery.problems.push_back(
          absl::StrCat(path, ": not replayed, as it follows a corrupt record"));
      corrupt_files_.push_back(name);
      continue;
    }
    absl::StatusOr<FileReplay> file = ParseFile(path, pipe);
    if (!file.ok()) return AtStart("the data directory", file.status());
    ++recovery.files_read;
    recovery.records += file->records;
    const bool is_snapshot = name == snapshot_file_;
    (is_snapshot ? recovered_snapshot_bytes_ : recovered_journal_bytes_) += file->bytes;
    if (!file->problem.empty()) {
      intact = false;
      recovery.problems.push_back(
          absl::StrCat(path, ": ", file->problem, "; restored everything before it"));
      corrupt_files_.push_back(name);
    } else if (!is_snapshot && file->records == 0) {
      empty_files_.push_back(name);
    }
  }
  return recovery;
}

std::string Journal::PathOf(absl::string_view name) const {
  return absl::StrCat(options_.data_dir, "/", name);
}

absl::Status Journal::Start(Collector collect, bool snapshot) {
  collect_ = std::move(collect);
  // Journals that outgrew their snapshot (the background would compact them at
  // once) are compacted before serving, so that a server restarted over and over
  // keeps its directory bounded too.
  if (snapshot || !corrupt_files_.empty() ||
      Outgrown(recovered_journal_bytes_, recovered_snapshot_bytes_)) {
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
  } else {
    // The recovered files stay valid as they are: appends go to a new file after
    // them, and compaction starts when the journals outgrow the snapshot, as ever.
    if (absl::Status s = Rotate(); !s.ok()) return AtStart("a new journal file", s);
    {
      absl::MutexLock lock(&mu_);
      snapshot_bytes_ = recovered_snapshot_bytes_;
      journal_bytes_ = recovered_journal_bytes_;
    }
    // Harmless if left (they hold nothing), so failures are logged only.
    for (const std::string& name : empty_files_) {
      if (absl::Status s = env_->RemoveFile(PathOf(name)); !s.ok()) LogError(s.message());
    }
  }
  background_ = std::thread([this] { Background(); });
  return absl::OkStatus();
}

bool Journal::Outgrown(int64_t journal_bytes, int64_t snapshot_bytes) const {
  return journal_bytes > options_.compact_min_bytes && journal_bytes > 2 * snapshot_bytes;
}

absl::Status Journal::Break(absl::string_view what, const absl::Status& cause, bool* report) {
  if (broken_.ok()) {
    broken_ =
        absl::UnavailableError(absl::StrCat("the journal cannot be ", what, " (", cause.message(),
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

absl::Status Journal::Compact() {
  // Rotate first: later appends go to the new file, which the snapshot precedes.
  QPARAMS_RETURN_IF_ERROR(Rotate());
  uint64_t number;
  {
    absl::MutexLock lock(&mu_);
    number = file_number_;
  }
  QPARAMS_RETURN_IF_ERROR(WriteSnapshot(number));
  RemoveFilesBefore(number);
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
      compact = broken_.ok() && Outgrown(journal_bytes_, snapshot_bytes_);
    }
    if (!compact) continue;
    if (absl::Status s = Compact(); !s.ok() && health().ok()) {
      LogError(absl::StrCat("compaction failed (the journal keeps growing): ", s.message()));
    }
  }
}

absl::StatusOr<uint64_t> Journal::AppendPut(const SessionKey& key, const CalculatorState& state,
                                            absl::Time create_time, absl::Time update_time,
                                            const DedupeWindow& dedupe,
                                            const std::optional<StepState>& steps) {
  storage::v1::Record record;
  *record.mutable_put() = EncodeSession(key, state, create_time, update_time, dedupe, steps);
  return Append(record);
}

absl::StatusOr<uint64_t> Journal::AppendErase(const SessionKey& key) {
  storage::v1::Record record;
  *record.mutable_erase() = EncodeKey(key);
  return Append(record);
}

absl::StatusOr<uint64_t> Journal::AppendEviction(const SessionKey& key, absl::Time evict_time) {
  return Append(EncodeEviction(key, evict_time));
}

absl::StatusOr<uint64_t> Journal::AppendContribution(const SessionKey& key,
                                                     const StepContribution& contribution,
                                                     absl::Time update_time) {
  return Append(EncodeContribution(key, contribution, update_time));
}

absl::StatusOr<uint64_t> Journal::AppendGroupCreate(absl::string_view tenant,
                                                    const ScaleGroupInfo& group) {
  return Append(EncodeGroupCreate(tenant, group));
}

absl::StatusOr<uint64_t> Journal::AppendGroupDelete(absl::string_view tenant,
                                                    absl::string_view name) {
  return Append(EncodeGroupDelete(tenant, name));
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
