#include "storage/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace qparams {
namespace {

absl::Status Error(absl::string_view what, const std::string& path, int code = errno) {
  return absl::ErrnoToStatus(code, absl::StrCat("cannot ", what, " ", path));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override { close(fd_); }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return Error("write", path_);
      }
      data.remove_prefix(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fdatasync(fd_) != 0) return Error("fsync", path_);
    return absl::OkStatus();
  }

 private:
  const int fd_;
  const std::string path_;
};

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixSequentialFile() override { close(fd_); }

  absl::StatusOr<size_t> Read(char* scratch, size_t n) override {
    while (true) {
      const ssize_t got = read(fd_, scratch, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) return Error("read", path_);
    }
  }

 private:
  const int fd_;
  const std::string path_;
};

class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { close(fd_); }  // closing releases the flock

 private:
  const int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::Status CreateDir(const std::string& dir) override {
    if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) return Error("create", dir);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) return Error("open", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int code = errno;
      close(fd);
      if (code == EWOULDBLOCK) {
        return absl::FailedPreconditionError(absl::StrCat(path, " is locked by another process"));
      }
      return Error("lock", path, code);
    }
    return std::make_unique<PosixFileLock>(fd);
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* listing = opendir(dir.c_str());
    if (listing == nullptr) return Error("list", dir);
    std::vector<std::string> names;
    errno = 0;
    while (dirent* entry = readdir(listing)) {
      const absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int code = errno;
    closedir(listing);
    if (code != 0) return Error("list", dir, code);
    return names;
  }

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Error("open", path);
    return std::make_unique<PosixSequentialFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) return Error("create", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) return Error("rename", from + " to " + to);
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return Error("remove", path);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Error("open", dir);
    const int result = fsync(fd);
    const int code = errno;
    close(fd);
    if (result != 0) return Error("fsync the directory", dir, code);
    return absl::OkStatus();
  }
};

}  // namespace

Env* Env::Posix() {
  static Env* const env = new PosixEnv();
  return env;
}

}  // namespace qparams
