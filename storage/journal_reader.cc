// The journal's reading half (journal.h): recovery reads and checks every file's
// frames (journal_format.h) on a thread of its own, ahead of the caller's replay.

#include "storage/journal.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "google/protobuf/arena.h"
#include "storage/journal_format.h"

namespace qparams {
namespace {

using journal_format::Checksum;
using journal_format::GetU32;
using journal_format::kMagic;
using journal_format::kMaxRecordBytes;

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

}  // namespace qparams
