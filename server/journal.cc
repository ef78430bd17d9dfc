#include "server/journal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "server/log.h"

namespace qparams {
namespace {

constexpr char kMagic[8] = {'Q', 'P', 'J', 'R', 'N', 'L', '1', '\n'};
constexpr char kSnapshotPrefix[] = "snapshot-";
constexpr char kJournalPrefix[] = "journal-";
constexpr uint32_t kMaxRecordBytes = 1u << 30;

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": ", strerror(errno)));
}

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

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", path);
    }
    bytes.remove_prefix(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status status = ErrnoError("cannot read", path);
      close(fd);
      return status;
    }
    if (n == 0) break;
    out.append(buffer, n);
  }
  close(fd);
  return out;
}

// Appends the records of `bytes` (a whole file) to `records`; returns "" if every
// frame was whole and intact, else what was wrong and where.
std::string ParseFile(absl::string_view bytes, std::vector<storage::v1::Record>& records) {
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

absl::Status SyncFd(int fd, const std::string& path) {
  if (fdatasync(fd) != 0) return ErrnoError("cannot fsync", path);
  return absl::OkStatus();
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

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const JournalOptions& options,
                                                       Recovery* recovery) {
  std::unique_ptr<Journal> journal(new Journal(options));
  const std::string& dir = options.data_dir;
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return ErrnoError("cannot create the data directory", dir);
  }
  journal->dir_fd_ = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (journal->dir_fd_ < 0) return ErrnoError("cannot open the data directory", dir);
  const std::string lock_path = dir + "/LOCK";
  journal->lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (journal->lock_fd_ < 0) return ErrnoError("cannot open", lock_path);
  if (flock(journal->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the data directory ", dir, " is in use by another server (", lock_path,
                     " is locked)"));
  }

  // The files by kind and number.
  std::map<uint64_t, std::string> snapshots, journals;
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return ErrnoError("cannot list", dir);
  while (dirent* entry = readdir(listing)) {
    absl::string_view name = entry->d_name;
    uint64_t number = 0;
    for (auto [prefix, files] : {std::pair{absl::string_view(kSnapshotPrefix), &snapshots},
                                 std::pair{absl::string_view(kJournalPrefix), &journals}}) {
      absl::string_view rest = name;
      if (absl::ConsumePrefix(&rest, prefix) && rest.size() == 20 &&
          absl::SimpleAtoi(rest, &number)) {
        (*files)[number] = std::string(name);
      }
    }
  }
  closedir(listing);

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
    const std::string path = dir + "/" + name;
    if (!intact) {
      recovery->problems.push_back(
          absl::StrCat(path, ": not replayed, as it follows a corrupt record"));
      journal->corrupt_files_.push_back(name);
      continue;
    }
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) return bytes.status();
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

absl::Status Journal::Start(Collector collect) {
  collect_ = std::move(collect);
  // The new snapshot holds everything recovered, so corrupt files can be set aside
  // (kept for inspection, no longer read) and the rest removed (by Compact).
  if (absl::Status s = Compact(); !s.ok()) return s;
  for (const std::string& name : corrupt_files_) {
    const std::string path = options_.data_dir + "/" + name;
    rename(path.c_str(), (path + ".corrupt").c_str());
  }
  fsync(dir_fd_);
  background_ = std::thread([this] { Background(); });
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Journal::Append(const storage::v1::Record& record) {
  const std::string frame = Frame(record);
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  if (fd_ < 0) return absl::FailedPreconditionError("the journal is not open");
  if (absl::Status s = WriteAll(fd_, frame, FileName(kJournalPrefix, file_number_)); !s.ok()) {
    broken_ = absl::UnavailableError(
        absl::StrCat("the journal cannot be written (", s.message(),
                     "); mutations are refused until the server restarts"));
    return broken_;
  }
  journal_bytes_ += frame.size();
  return ++appended_;
}

absl::Status Journal::Sync(uint64_t sequence) {
  if (options_.durability != Durability::kAlways) return absl::OkStatus();
  {
    absl::MutexLock lock(&sync_mu_);
    if (synced_ >= sequence) return absl::OkStatus();
  }
  return SyncAll();
}

absl::Status Journal::SyncAll() {
  absl::MutexLock sync_lock(&sync_mu_);
  int fd;
  uint64_t target;
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    if (synced_ >= appended_ || fd_ < 0) return absl::OkStatus();
    fd = fd_;
    target = appended_;
    name = FileName(kJournalPrefix, file_number_);
  }
  // Appends continue meanwhile; the file cannot change under us, as rotation also
  // holds sync_mu_.
  if (absl::Status s = SyncFd(fd, name); !s.ok()) {
    absl::MutexLock lock(&mu_);
    broken_ = absl::UnavailableError(
        absl::StrCat("the journal cannot be synced (", s.message(),
                     "); mutations are refused until the server restarts"));
    return broken_;
  }
  synced_ = target;
  return absl::OkStatus();
}

absl::Status Journal::Compact() {
  uint64_t number;
  {
    // Rotate: later appends go to the new file, which the snapshot precedes.
    absl::MutexLock sync_lock(&sync_mu_);
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    number = file_number_ + (fd_ < 0 ? 0 : 1);
    const std::string name = FileName(kJournalPrefix, number);
    const std::string path = options_.data_dir + "/" + name;
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) return ErrnoError("cannot create", path);
    if (absl::Status s = WriteAll(fd, absl::string_view(kMagic, sizeof kMagic), path); !s.ok()) {
      close(fd);
      return s;
    }
    if (fd_ >= 0) {
      if (absl::Status s = SyncFd(fd_, FileName(kJournalPrefix, file_number_)); !s.ok()) {
        close(fd);
        broken_ = absl::UnavailableError(s.message());
        return broken_;
      }
      close(fd_);
    }
    fd_ = fd;
    file_number_ = number;
    journal_bytes_ = 0;
    synced_ = appended_;
  }
  fsync(dir_fd_);

  // Every state collected now is at least as new as the rotation.
  std::string snapshot(kMagic, sizeof kMagic);
  for (const storage::v1::Record& record : collect_()) snapshot += Frame(record);
  const std::string name = FileName(kSnapshotPrefix, number);
  const std::string path = options_.data_dir + "/" + name;
  const std::string temp = path + ".tmp";
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return ErrnoError("cannot create", temp);
  absl::Status written = WriteAll(fd, snapshot, temp);
  if (written.ok() && fsync(fd) != 0) written = ErrnoError("cannot fsync", temp);
  close(fd);
  if (written.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    written = ErrnoError("cannot rename", temp);
  }
  if (!written.ok()) {
    unlink(temp.c_str());
    return written;
  }
  fsync(dir_fd_);
  {
    absl::MutexLock lock(&mu_);
    snapshot_bytes_ = snapshot.size();
  }
  RemoveFilesBefore(number);
  return absl::OkStatus();
}

void Journal::RemoveFilesBefore(uint64_t number) {
  DIR* listing = opendir(options_.data_dir.c_str());
  if (listing == nullptr) return;
  std::vector<std::string> doomed;
  while (dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    absl::string_view rest = name;
    uint64_t n = 0;
    const bool ours =
        absl::ConsumePrefix(&rest, kSnapshotPrefix) || absl::ConsumePrefix(&rest, kJournalPrefix);
    absl::ConsumeSuffix(&rest, ".tmp");  // an unfinished snapshot
    if (ours && absl::SimpleAtoi(rest, &n) && n < number &&
        std::find(corrupt_files_.begin(), corrupt_files_.end(), name) == corrupt_files_.end()) {
      doomed.push_back(name);
    }
  }
  closedir(listing);
  for (const std::string& name : doomed) unlink((options_.data_dir + "/" + name).c_str());
  fsync(dir_fd_);
}

void Journal::Background() {
  while (!stop_.WaitForNotificationWithTimeout(options_.flush_interval)) {
    if (absl::Status s = SyncAll(); !s.ok()) LogError(s.message());
    bool compact;
    {
      absl::MutexLock lock(&mu_);
      compact = broken_.ok() && journal_bytes_ > options_.compact_min_bytes &&
                journal_bytes_ > 2 * snapshot_bytes_;
    }
    if (!compact) continue;
    if (absl::Status s = Compact(); !s.ok()) {
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
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  return status;
}

Journal::~Journal() {
  Close().IgnoreError();
  if (lock_fd_ >= 0) close(lock_fd_);
  if (dir_fd_ >= 0) close(dir_fd_);
}

}  // namespace qparams
