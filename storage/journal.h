// Durable sessions and scale groups: an append-only journal of full-state records
// plus snapshots, in one data directory.
//
// Files: `snapshot-N` holds the whole store as of the start of `journal-N`; the
// journal files numbered N and above hold every mutation since, in order. Each
// file starts with an 8-byte magic, then frames of [u32 length][u32 crc32][record],
// little-endian. Snapshots are written to a temporary file, fsynced, renamed and the
// directory fsynced, so a snapshot is whole or absent. A torn or corrupt frame ends
// recovery: everything before it is restored, the rest is reported and set aside.
//
// Compaction writes a new snapshot once the journal outgrows the last one, so the
// directory stays proportional to the live state.
//
// Every file-system call goes through an Env (storage/env.h) and every result is
// checked. A failed write or fsync of the journal, or a failed directory sync after
// rotating to a new journal file, breaks the journal: that append or sync and every
// later one fail with UNAVAILABLE naming the operation and the OS error, until the
// server restarts (after a failed fsync the page cache cannot be trusted, so
// nothing written since the last good fsync is assumed durable). A failed snapshot
// does not: the older snapshot and journals it would have replaced stay, and the
// next compaction tries again.
//
// The implementation, as LevelDB's log is: the frames and file names
// (journal_format.h), the writer (journal_writer.cc: appends, fsyncs, rotation,
// snapshots), the reader (journal_reader.cc: recovery's read-ahead) and the life
// cycle (journal.cc: opening, starting, compaction, closing).

#ifndef QPARAMS_STORAGE_JOURNAL_H_
#define QPARAMS_STORAGE_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "metrics/metrics.h"
#include "qparams/storage/v1/storage.pb.h"
#include "storage/env.h"
#include "storage/group_codec.h"
#include "storage/session_codec.h"
#include "storage/session_log.h"

namespace qparams {

class RecordPipe;  // journal_reader.cc

// When an acknowledged mutation reaches the disk.
enum class Durability {
  kAlways,   // fsynced before the response
  kBatched,  // written at once, fsynced within the flush interval and at shutdown
  kNone,     // memory only
};

// "always", "batched" or "none"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Durability> ParseDurability(absl::string_view text);
absl::string_view DurabilityName(Durability durability);

// Where the journal records what it does (server/server_metrics.h makes them). Each
// may be null: not recorded.
struct JournalMetrics {
  Counter* appends = nullptr;             // records appended
  Counter* appended_bytes = nullptr;      // their frames' bytes
  BucketHistogram* fsync_seconds = nullptr;     // each fsync of a journal file
  BucketHistogram* snapshot_seconds = nullptr;  // each snapshot written (temporary file to rename)
  Counter* snapshot_failures = nullptr;   // snapshots not written
};

struct JournalOptions {
  std::string data_dir;
  Durability durability = Durability::kBatched;  // kAlways or kBatched
  absl::Duration flush_interval = absl::Milliseconds(100);
  // Compaction starts when the journal exceeds both this and twice the snapshot.
  int64_t compact_min_bytes = int64_t{64} << 20;
  // The file system; must outlive the journal.
  Env* env = Env::Posix();
  // Called once, with the error, when the journal breaks (see above); from the
  // thread that met the failure, with no lock of the journal held.
  std::function<void(const absl::Status&)> on_failure;
  JournalMetrics metrics;
};

// What recovery found on disk: how much it replayed, and a description of every torn
// or corrupt piece that was set aside.
struct Recovery {
  int64_t records = 0;
  int files_read = 0;
  std::vector<std::string> problems;
};

// The SessionLog of a data directory: AppendPut, AppendErase and AppendEviction
// encode their record (storage/session_codec.h), AppendGroupCreate and
// AppendGroupDelete theirs (storage/group_codec.h), and Append it.
class Journal final : public SessionLog {
 public:
  // Takes each record found on disk, in order (snapshot first); the last record of a
  // session (or of a scale group) wins.
  using Replayer = std::function<void(const storage::v1::Record&)>;
  // Takes one record of a snapshot; a failure ends the snapshot.
  using Emitter = std::function<absl::Status(const storage::v1::Record&)>;
  // Emits the live state (puts, evictions and group creations) one record at a time,
  // so that a snapshot never holds the whole store in memory; returns the emitter's
  // first error.
  using Collector = std::function<absl::Status(const Emitter&)>;

  // Opens (creating if needed) the data directory and locks it. FAILED_PRECONDITION
  // if the directory cannot be created or listed, or another server holds it.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const JournalOptions& options);

  ~Journal() override;

  // Streams the newest snapshot and the journals after it through `replay`, on the
  // calling thread, while a thread of its own reads and parses ahead (memory: a read
  // buffer and a few dozen records). A torn or corrupt frame
  // ends the replay there (described in the result's problems). FAILED_PRECONDITION
  // if a file cannot be read. Call once, before Start.
  absl::StatusOr<Recovery> Recover(const Replayer& replay);

  // Starts a fresh journal file and the background flusher/compactor. Writes a
  // snapshot of `collect()` first, and removes the files it replaces, when
  // `snapshot` says so, recovery found corrupt files (which are then renamed
  // `*.corrupt`) or the journals outgrew the snapshot (as for Compact); otherwise the recovered
  // files stay as they are, so that a restart costs one read of the directory. Journal files that
  // held no record are removed.
  absl::Status Start(Collector collect, bool snapshot = false);

  // Appends `record` (written to the file before returning) and returns its
  // sequence number. Mutations of one session must be appended in their order. After
  // a write error every append fails: the journal cannot promise order any more.
  absl::StatusOr<uint64_t> Append(const storage::v1::Record& record);

  // SessionLog: the record of each, encoded and appended as Append says.
  bool keeps_records() const override { return true; }
  absl::StatusOr<uint64_t> AppendPut(const SessionKey& key, const CalculatorState& state,
                                     absl::Time create_time, absl::Time update_time,
                                     const DedupeWindow& dedupe,
                                     const std::optional<StepState>& steps) override;
  absl::StatusOr<uint64_t> AppendErase(const SessionKey& key) override;
  absl::StatusOr<uint64_t> AppendEviction(const SessionKey& key, absl::Time evict_time) override;
  absl::StatusOr<uint64_t> AppendContribution(const SessionKey& key,
                                              const StepContribution& contribution,
                                              absl::Time update_time) override;
  absl::StatusOr<uint64_t> AppendGroupCreate(absl::string_view tenant,
                                             const ScaleGroupInfo& group) override;
  absl::StatusOr<uint64_t> AppendGroupDelete(absl::string_view tenant,
                                             absl::string_view name) override;

  // OK while the journal takes appends, else the failure that broke it.
  absl::Status health() const override;

  // Under kAlways: returns once every record up to `sequence` is fsynced (one fsync
  // serves all appends made meanwhile). Otherwise returns at once (the failure that
  // broke the journal, if it is broken).
  absl::Status Sync(uint64_t sequence) override;

  // Fsyncs what was appended and stops the background thread. Idempotent.
  absl::Status Close() override;

  // Rotates to a new journal file and writes a snapshot of `collect()` before it,
  // then removes the files they replace. The background thread calls it once the
  // journal outgrows both compact_min_bytes and twice the last snapshot.
  absl::Status Compact();

  Durability durability() const { return options_.durability; }

 private:
  explicit Journal(JournalOptions options)
      : options_(std::move(options)), env_(options_.env) {}

  // Fsyncs the current journal file up to everything appended.
  absl::Status SyncAll();
  void Background();
  // The compaction rule: journals above compact_min_bytes and twice the snapshot.
  bool Outgrown(int64_t journal_bytes, int64_t snapshot_bytes) const;
  // Creates journal-`number` with its magic and makes its entry durable; later
  // appends go there. Breaks the journal on failure.
  absl::Status Rotate() ABSL_LOCKS_EXCLUDED(sync_mu_, mu_);
  // Writes snapshot-`number` (temporary file, fsync, rename, directory fsync).
  absl::Status WriteSnapshot(uint64_t number);
  // What replaying one file found: `problem` is "" if every frame was whole and
  // intact, else what was wrong and where (`bytes` then stops before it).
  struct FileReplay {
    std::string problem;
    int64_t records = 0;
    int64_t bytes = 0;
  };
  // Reads the snapshot and journals into `pipe` (recovery's reading thread).
  absl::StatusOr<Recovery> ReadFiles(RecordPipe& pipe);
  // Reads, checks and parses one file's records into `pipe`. Errors: the file
  // cannot be read.
  absl::StatusOr<FileReplay> ParseFile(const std::string& path, RecordPipe& pipe);
  // Removes snapshot and journal files numbered below `number`, but corrupt ones.
  void RemoveFilesBefore(uint64_t number);
  // Breaks the journal with `failure` (UNAVAILABLE) unless it is broken already;
  // returns the failure that broke it. Calls on_failure the first time, once `mu_`
  // is released by the caller's scope: the caller passes its pending flag.
  absl::Status Break(absl::string_view what, const absl::Status& cause, bool* report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Report(bool report);
  std::string PathOf(absl::string_view name) const;

  const JournalOptions options_;
  Env* const env_;
  std::unique_ptr<FileLock> lock_;
  Collector collect_;
  // Found by Open: the newest snapshot (if any) and the journals from its number on.
  std::string snapshot_file_;
  std::vector<std::string> journal_files_;
  std::vector<std::string> corrupt_files_;  // found by Recover, set aside by Start
  std::vector<std::string> empty_files_;    // journals without a record, removed by Start
  int64_t recovered_snapshot_bytes_ = 0;
  int64_t recovered_journal_bytes_ = 0;

  // Lock order: sync_mu_, then mu_.
  absl::Mutex sync_mu_;
  uint64_t synced_ ABSL_GUARDED_BY(sync_mu_) = 0;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(sync_mu_);
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);
  uint64_t file_number_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t journal_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t snapshot_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);

  absl::Notification stop_;
  std::thread background_;
  bool closed_ = false;
};

}  // namespace qparams

#endif  // QPARAMS_STORAGE_JOURNAL_H_
