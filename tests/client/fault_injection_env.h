// An Env for tests that fails chosen file-system calls, can "crash" (every call
// after a chosen one fails), and then leaves on disk what a power loss would: only
// what was fsynced, in files whose directory entry was fsynced. Modelled on LevelDB's
// FaultInjectionTestEnv (db/fault_injection_test.cc). Thread-safe.

#ifndef QPARAMS_TESTS_FAULT_INJECTION_ENV_H_
#define QPARAMS_TESTS_FAULT_INJECTION_ENV_H_

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "storage/env.h"

namespace qparams::testing {

class FaultInjectionEnv final : public Env {
 public:
  // The calls that change the disk, which faults and crashes count.
  enum class Op { kNewFile, kAppend, kSync, kRename, kRemove, kSyncDir };

  explicit FaultInjectionEnv(Env* base = Env::Posix()) : base_(base) {}

  // The `nth` next call of `op` fails with EIO. A failing append writes the first
  // half of its data first when `partial` (a short write).
  void FailNext(Op op, int nth = 1, bool partial = false) {
    absl::MutexLock lock(&mu_);
    faults_[op] = {nth, partial};
  }

  // After `calls` more calls that change the disk, every call fails: the process is
  // dead from then on (until DropUnsyncedData).
  void CrashAfter(int calls) {
    absl::MutexLock lock(&mu_);
    crash_after_ = mutating_calls_ + calls;
  }

  int mutating_calls() const {
    absl::MutexLock lock(&mu_);
    return mutating_calls_;
  }

  // What a power loss leaves: each file written through this Env keeps only what
  // it held at its last successful Sync, and disappears if its directory was not
  // synced since it was created or renamed into place. Then the Env works again.
  void DropUnsyncedData() {
    absl::MutexLock lock(&mu_);
    for (const auto& [path, file] : files_) {
      if (!file.entry_durable) {
        unlink(path.c_str());
      } else if (truncate(path.c_str(), file.synced) != 0) {
        ADD_FAILURE() << "cannot truncate " << path;
      }
    }
    files_.clear();
    crash_after_ = -1;
    faults_.clear();
  }

  absl::Status CreateDir(const std::string& dir) override { return base_->CreateDir(dir); }
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    return base_->LockFile(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    if (absl::Status dead = Dead("list", dir); !dead.ok()) return dead;
    return base_->ListDir(dir);
  }
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    if (absl::Status dead = Dead("read", path); !dead.ok()) return dead;
    return base_->NewSequentialFile(path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (absl::Status s = Enter(Op::kNewFile, "create", path); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<WritableFile>> file = base_->NewWritableFile(path);
    if (!file.ok()) return file.status();
    absl::MutexLock lock(&mu_);
    files_[path] = FileState{};
    return std::unique_ptr<WritableFile>(new File(this, path, *std::move(file)));
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (absl::Status s = Enter(Op::kRename, "rename", from); !s.ok()) return s;
    if (absl::Status s = base_->RenameFile(from, to); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    FileState moved;
    if (auto it = files_.find(from); it != files_.end()) {
      moved = it->second;
      files_.erase(it);
    } else {  // written before this Env saw it: all of it durable
      struct stat st;
      moved.size = moved.synced = stat(to.c_str(), &st) == 0 ? st.st_size : 0;
    }
    moved.entry_durable = false;
    files_[to] = moved;
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (absl::Status s = Enter(Op::kRemove, "remove", path); !s.ok()) return s;
    if (absl::Status s = base_->RemoveFile(path); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    files_.erase(path);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    if (absl::Status s = Enter(Op::kSyncDir, "fsync the directory", dir); !s.ok()) return s;
    if (absl::Status s = base_->SyncDir(dir); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    for (auto& [path, file] : files_) {
      if (absl::StartsWith(path, dir + "/")) file.entry_durable = true;
    }
    return absl::OkStatus();
  }

 private:
  struct FileState {
    int64_t size = 0;
    int64_t synced = 0;
    bool entry_durable = false;
  };
  struct Fault {
    int nth = 0;
    bool partial = false;
  };

  class File final : public WritableFile {
   public:
    File(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base)
        : env_(env), path_(std::move(path)), base_(std::move(base)) {}

    absl::Status Append(absl::string_view data) override {
      bool partial = false;
      if (absl::Status s = env_->Enter(Op::kAppend, "write", path_, &partial); !s.ok()) {
        if (partial && base_->Append(data.substr(0, data.size() / 2)).ok()) {
          env_->Grew(path_, data.size() / 2);
        }
        return s;
      }
      if (absl::Status s = base_->Append(data); !s.ok()) return s;
      env_->Grew(path_, data.size());
      return absl::OkStatus();
    }

    absl::Status Sync() override {
      if (absl::Status s = env_->Enter(Op::kSync, "fsync", path_); !s.ok()) return s;
      if (absl::Status s = base_->Sync(); !s.ok()) return s;
      env_->Synced(path_);
      return absl::OkStatus();
    }

   private:
    FaultInjectionEnv* const env_;
    const std::string path_;
    const std::unique_ptr<WritableFile> base_;
  };

  static absl::Status Injected(absl::string_view what, absl::string_view path) {
    return absl::ErrnoToStatus(EIO, absl::StrCat("cannot ", what, " ", path, " (injected)"));
  }

  absl::Status Dead(absl::string_view what, absl::string_view path) const {
    absl::MutexLock lock(&mu_);
    if (crash_after_ >= 0 && mutating_calls_ >= crash_after_) return Injected(what, path);
    return absl::OkStatus();
  }

  // Counts a call that changes the disk; its injected failure, if any.
  absl::Status Enter(Op op, absl::string_view what, absl::string_view path,
                     bool* partial = nullptr) {
    absl::MutexLock lock(&mu_);
    if (crash_after_ >= 0 && mutating_calls_ >= crash_after_) return Injected(what, path);
    ++mutating_calls_;
    auto it = faults_.find(op);
    if (it != faults_.end() && --it->second.nth == 0) {
      if (partial != nullptr) *partial = it->second.partial;
      faults_.erase(it);
      return Injected(what, path);
    }
    return absl::OkStatus();
  }

  void Grew(const std::string& path, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    files_[path].size += bytes;
  }
  void Synced(const std::string& path) {
    absl::MutexLock lock(&mu_);
    files_[path].synced = files_[path].size;
  }

  Env* const base_;
  mutable absl::Mutex mu_;
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
  std::map<Op, Fault> faults_ ABSL_GUARDED_BY(mu_);
  int mutating_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int crash_after_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_FAULT_INJECTION_ENV_H_
