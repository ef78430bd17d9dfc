#include "bench/restart.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

extern char** environ;

namespace qparams::bench {
namespace {

// A child process spawned with `argv`; its stderr can be read line by line
// (`capture_stderr`) and its stdout can go to /dev/null. Killed (SIGKILL) and reaped
// when destroyed, if still running.
class Child {
 public:
  static absl::StatusOr<std::unique_ptr<Child>> Spawn(std::vector<std::string> argv,
                                                      bool capture_stderr, bool stdout_to_null) {
    std::unique_ptr<Child> child(new Child());
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    int fds[2] = {-1, -1};
    if (capture_stderr && pipe2(fds, O_CLOEXEC) != 0) {
      return absl::ErrnoToStatus(errno, "cannot make a pipe");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (capture_stderr) posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    if (stdout_to_null) {
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    }
    const int spawned = posix_spawn(&child->pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (capture_stderr) {
      close(fds[1]);
      child->log_ = fdopen(fds[0], "r");
    }
    if (spawned != 0) {
      child->pid_ = -1;
      return absl::ErrnoToStatus(spawned, absl::StrCat("cannot start ", argv[0]));
    }
    return child;
  }

  ~Child() {
    if (pid_ > 0) Stop(SIGKILL).IgnoreError();
    if (log_ != nullptr) fclose(log_);
  }

  pid_t pid() const { return pid_; }

  // Reads the log up to the first line containing `text`, and returns that line.
  // Errors: the log ends first (the process exited), with the last lines read.
  absl::StatusOr<std::string> WaitForLine(absl::string_view text) {
    char buffer[4096];
    std::string seen;
    while (fgets(buffer, sizeof buffer, log_) != nullptr) {
      if (absl::StrContains(buffer, text)) return std::string(buffer);
      seen = buffer;
    }
    return absl::UnavailableError(
        absl::StrCat("the server exited before logging \"", text, "\"; last line: ", seen));
  }

  // Sends `signal` and reaps the process; its exit code (or 128 + the signal).
  absl::StatusOr<int> Stop(int signal) {
    if (pid_ <= 0) return absl::FailedPreconditionError("not running");
    kill(pid_, signal);
    return Wait();
  }

  absl::StatusOr<int> Wait() {
    int status = 0;
    const pid_t pid = std::exchange(pid_, -1);
    if (waitpid(pid, &status, 0) != pid) return absl::ErrnoToStatus(errno, "waitpid");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  Child() = default;
  pid_t pid_ = -1;
  FILE* log_ = nullptr;
};

absl::StatusOr<std::unique_ptr<Child>> StartServer(const RestartSpec& spec,
                                                   const std::string& data_dir) {
  return Child::Spawn(
      {spec.server_binary, "--listen=127.0.0.1:0", absl::StrCat("--data_dir=", data_dir),
       absl::StrCat("--max_sessions=", spec.fill.sessions)},
      /*capture_stderr=*/true, /*stdout_to_null=*/false);
}

// "... listening on 127.0.0.1:PORT ..." -> "127.0.0.1:PORT".
std::string AddressIn(absl::string_view line) {
  absl::string_view rest = line.substr(line.find("listening on ") + 13);
  return std::string(rest.substr(0, rest.find_first_of(" \n")));
}

// The directory removed however the scenario ends.
struct ScratchDir {
  std::string path;
  ~ScratchDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

absl::StatusOr<RestartResult> MeasureRestart(const RestartSpec& spec) {
  RestartResult result;
  result.raw_bytes = RawStateBytes(spec.fill);
  std::string pattern = spec.scratch_dir + "/qparams-restart-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot make a directory under ", spec.scratch_dir));
  }
  const ScratchDir scratch{pattern};
  const std::string data_dir = scratch.path + "/data";

  {
    QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Child> server, StartServer(spec, data_dir));
    QPARAMS_ASSIGN_OR_RETURN(const std::string listening, server->WaitForLine("listening on "));
    const absl::Time start = absl::Now();
    QPARAMS_RETURN_IF_ERROR(FillSessions(AddressIn(listening), spec.fill));
    result.fill_time = absl::Now() - start;
    QPARAMS_ASSIGN_OR_RETURN(result.rss_before_kill, ResidentBytes(absl::StrCat(server->pid())));
    QPARAMS_RETURN_IF_ERROR(server->Stop(SIGKILL).status());
  }

  std::vector<std::string> cat = {"/bin/cat"};
  for (const auto& entry : std::filesystem::directory_iterator(data_dir)) {
    if (!entry.is_regular_file()) continue;
    result.data_dir_bytes += static_cast<int64_t>(entry.file_size());
    cat.push_back(entry.path().string());
  }
  {
    const absl::Time start = absl::Now();
    QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Child> reader,
                             Child::Spawn(cat, /*capture_stderr=*/false, /*stdout_to_null=*/true));
    QPARAMS_ASSIGN_OR_RETURN(const int code, reader->Wait());
    if (code != 0) return absl::InternalError(absl::StrCat("cat exited with ", code));
    result.read_time = absl::Now() - start;
  }

  const absl::Time start = absl::Now();
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Child> server, StartServer(spec, data_dir));
  QPARAMS_ASSIGN_OR_RETURN(const std::string restored, server->WaitForLine("restored "));
  QPARAMS_RETURN_IF_ERROR(server->WaitForLine("listening on ").status());
  result.restart_time = absl::Now() - start;
  QPARAMS_ASSIGN_OR_RETURN(result.rss_after_restart, ResidentBytes(absl::StrCat(server->pid())));
  const std::vector<absl::string_view> words = absl::StrSplit(restored, ' ');
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == "restored" && absl::SimpleAtoi(words[i + 1], &result.sessions_restored)) break;
  }
  QPARAMS_RETURN_IF_ERROR(server->Stop(SIGTERM).status());
  return result;
}

}  // namespace qparams::bench
