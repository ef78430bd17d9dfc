#include "storage/journal.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "core/status_macros.h"
#include "google/protobuf/arena.h"

namespace qparams {
namespace {

constexpr char kMagic[8] = {'Q', 'P', 'J', 'R', 'N', 'L', '1', '\n'};
constexpr char kSnapshotPrefix[] = "snapshot-";
constexpr char kJournalPrefix[] = "journal-";
constexpr uint32_t kMaxRecordBytes = 1u << 30;
constexpr size_t kWriteChunk = size_t{1} << 20;

// Seconds since `start`, into `histogram` (if any).
void ObserveSince(BucketHistogram* histogram, absl::Time start) {
  if (histogram != nullptr) histogram->Observe(absl::ToDoubleSeconds(absl::Now() - start));
}

std::string FileName(absl::string_view prefix, uint64_t number) {
  return absl::StrFormat("%s%020u", prefix, number);
}

uint32_t Checksum(absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Appends `record`'s frame to `out`, serializing in place.
void AppendFrame(const storage::v1::Record& record, std::string& out) {
  const size_t length = record.ByteSizeLong();
  const size_t start = out.size();
  out.resize(start + 8 + length);
  char* payload = out.data() + start + 8;
  record.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(payload));
  char* header = out.data() + start;
  PutU32(header, static_cast<uint32_t>(length));
  PutU32(header + 4, Checksum(absl::string_view(payload, length)));
}

// Frames of a file read in order through a bounded buffer: recovery holds one
// record at a time, however large the file.
class FrameReader {
 public:
  explicit FrameReader(SequentialFile* file) : file_(file) {}

  // Makes `n` bytes available at data(); false if the file ends first (what is left
  // stays available). Errors: a failed read.
  absl::StatusOr<bool> Ensure(size_t n) {
    if (end_ - begin_ >= n) return true;
    if (capacity_ - begin_ < n) Reserve(n);
    while (end_ - begin_ < n) {
      QPARAMS_ASSIGN_OR_RETURN(const size_t got,
                               file_->Read(buffer_.get() + end_, capacity_ - end_));
      if (got == 0) return false;
      end_ += got;
    }
    return true;
  }

  const char* data() const { return buffer_.get() + begin_; }
  size_t available() const { return end_ - begin_; }
  void Skip(size_t n) { begin_ += n; }

 private:
  // Moves the unread bytes to the front of a buffer that holds at least `n`.
  void Reserve(size_t n) {
    const size_t left = end_ - begin_;
    if (capacity_ < n) {
      const size_t capacity = std::max(n, kChunk);
      std::unique_ptr<char[]> bigger(new char[capacity]);  // not zeroed: read into
      if (left > 0) std::memcpy(bigger.get(), buffer_.get() + begin_, left);
      buffer_ = std::move(bigger);
      capacity_ = capacity;
    } else if (left > 0) {
      std::memmove(buffer_.get(), buffer_.get() + begin_, left);
    }
    begin_ = 0;
    end_ = left;
  }

  static constexpr size_t kChunk = size_t{1} << 20;
  SequentialFile* const file_;
  std::unique_ptr<char[]> buffer_;
  size_t capacity_ = 0, begin_ = 0, end_ = 0;
};

}  // namespace

// Hands parsed records from recovery's reading thread to the replaying one, in
// batches (one hand-off per batch, not per record), from a fixed pool of batches that
// the replaying thread gives back. A batch's records live on its own protobuf arena,
// whose first block the batch owns and reuses: parsing allocates nothing once the
// pool is made (malloc from both threads would contend for glibc's arenas, which
// TuneProcessForServing limits to the number of cores).
class RecordPipe {
 public:
  struct Batch {
    static constexpr size_t kBlockBytes = size_t{2} << 20;
    Batch() : block(new char[kBlockBytes]), arena(Options(block.get())) {}
    static google::protobuf::ArenaOptions Options(char* block) {
      google::protobuf::ArenaOptions options;
      options.initial_block = block;
      options.initial_block_size = kBlockBytes;
      return options;
    }
    std::unique_ptr<char[]> block;
    google::protobuf::Arena arena;
    std::vector<storage::v1::Record*> records;  // on `arena`
  };
  static constexpr size_t kBatchRecords = 32;
  static constexpr size_t kPoolBatches = 4;

  // Reading thread: the record to parse into next.
  storage::v1::Record& Next() {
    if (filling_ == nullptr) filling_ = TakeEmpty();
    filling_->records.push_back(
        google::protobuf::Arena::CreateMessage<storage::v1::Record>(&filling_->arena));
    return *filling_->records.back();
  }

  // Reading thread: the last record from Next() is not to be replayed.
  void DropLast() { filling_->records.pop_back(); }

  // Reading thread: hands over the records filled so far once they make a batch (or
  // `now`).
  void Flush(bool now) {
    if (filling_ == nullptr || filling_->records.empty() ||
        (!now && filling_->records.size() < kBatchRecords)) {
      return;
    }
    absl::MutexLock lock(&mu_);
    ready_.push_back(std::move(filling_));
    ready_cv_.Signal();
  }

  // Reading thread: no more batches (flushes what is left).
  void Close() {
    Flush(/*now=*/true);
    absl::MutexLock lock(&mu_);
    closed_ = true;
    ready_cv_.Signal();
  }

  // Replaying thread: the next batch, or null once closed and drained.
  std::unique_ptr<Batch> Pop() {
    absl::MutexLock lock(&mu_);
    // CondVar loops rather than Mutex::Await: the sanitizers' model of the
    // uninstrumented Abseil (sanitizers/tsan_absl_sync.cc) sees these conditions read
    // under the lock.
    while (!closed_ && ready_.empty()) ready_cv_.Wait(&mu_);
    if (ready_.empty()) return nullptr;
    std::unique_ptr<Batch> batch = std::move(ready_.front());
    ready_.pop_front();
    return batch;
  }

  // Replaying thread: gives a replayed batch back.
  void Recycle(std::unique_ptr<Batch> batch) {
    absl::MutexLock lock(&mu_);
    spares_.push_back(std::move(batch));
    spare_cv_.Signal();
  }

 private:
  // A batch to fill: a new one while the pool is not all made, else a given-back one.
  std::unique_ptr<Batch> TakeEmpty() {
    std::unique_ptr<Batch> batch;
    {
      absl::MutexLock lock(&mu_);
      if (made_ < kPoolBatches) {
        ++made_;
        return std::make_unique<Batch>();
      }
      while (spares_.empty()) spare_cv_.Wait(&mu_);
      batch = std::move(spares_.back());
      spares_.pop_back();
    }
    batch->records.clear();
    batch->arena.Reset();
    return batch;
  }

  std::unique_ptr<Batch> filling_;  // the reading thread's own
  absl::Mutex mu_;
  absl::CondVar ready_cv_;  // a batch was added, or the pipe closed
  absl::CondVar spare_cv_;  // a batch was given back
  size_t made_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::unique_ptr<Batch>> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Batch>> spares_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

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

absl::StatusOr<Journal::FileReplay> Journal::ParseFile(const std::string& path, RecordPipe& pipe) {
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, env_->NewSequentialFile(path));
  FrameReader reader(file.get());
  FileReplay result;
  // A rotation cut short by a crash: the new file's magic never reached the disk.
  QPARAMS_ASSIGN_OR_RETURN(const bool whole_magic, reader.Ensure(sizeof kMagic));
  if (!whole_magic && reader.available() == 0) return result;
  if (!whole_magic || std::memcmp(reader.data(), kMagic, sizeof kMagic) != 0) {
    result.problem = "the file does not start with the journal magic";
    return result;
  }
  reader.Skip(sizeof kMagic);
  result.bytes = sizeof kMagic;
  while (true) {
    QPARAMS_ASSIGN_OR_RETURN(const bool whole_header, reader.Ensure(8));
    if (!whole_header) {
      if (reader.available() != 0) {
        result.problem = absl::StrCat("a torn frame header at byte ", result.bytes);
      }
      return result;
    }
    const uint32_t length = GetU32(reader.data());
    const uint32_t checksum = GetU32(reader.data() + 4);
    if (length > kMaxRecordBytes) {
      result.problem = absl::StrCat("a torn record at byte ", result.bytes, " (a ", length,
                                    "-byte record is over the limit)");
      return result;
    }
    QPARAMS_ASSIGN_OR_RETURN(const bool whole_record, reader.Ensure(8 + size_t{length}));
    if (!whole_record) {
      result.problem =
          absl::StrCat("a torn record at byte ", result.bytes, " (", reader.available(),
                       " bytes left of a ", length, "-byte record)");
      return result;
    }
    const absl::string_view payload(reader.data() + 8, length);
    storage::v1::Record& record = pipe.Next();
    if (Checksum(payload) != checksum || !record.ParseFromArray(payload.data(), length)) {
      pipe.DropLast();
      result.problem =
          absl::StrCat("a corrupt record at byte ", result.bytes, " (checksum mismatch)");
      return result;
    }
    pipe.Flush(/*now=*/false);
    ++result.records;
    reader.Skip(8 + size_t{length});
    result.bytes += 8 + int64_t{length};
  }
}

absl::StatusOr<Recovery> Journal::Recover(const Replayer& replay) {
  // Reading, checksumming and parsing (on a thread of its own) overlap with
  // replaying (on the caller's): a restart takes about the longer of the two.
  RecordPipe pipe;
  absl::StatusOr<Recovery> recovery;
  std::thread reader([&] {
    recovery = ReadFiles(pipe);
    pipe.Close();
  });
  while (std::unique_ptr<RecordPipe::Batch> batch = pipe.Pop()) {
    for (const storage::v1::Record* record : batch->records) replay(*record);
    pipe.Recycle(std::move(batch));
  }
  reader.join();
  return recovery;
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
