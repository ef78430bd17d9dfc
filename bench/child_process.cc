#include "bench/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace qparams::bench {

absl::StatusOr<std::unique_ptr<Child>> Child::Spawn(std::vector<std::string> argv,
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

Child::~Child() {
  if (pid_ > 0) Stop(SIGKILL).IgnoreError();
  if (drain_.joinable()) drain_.join();  // the log ends with the process
  if (log_ != nullptr) fclose(log_);
}

void Child::DrainLog() {
  if (log_ == nullptr || drain_.joinable()) return;
  drain_ = std::thread([log = log_] {
    char buffer[4096];
    while (fgets(buffer, sizeof buffer, log) != nullptr) {
    }
  });
}

absl::StatusOr<std::string> Child::WaitForLine(absl::string_view text) {
  char buffer[4096];
  std::string seen;
  while (fgets(buffer, sizeof buffer, log_) != nullptr) {
    if (absl::StrContains(buffer, text)) return std::string(buffer);
    seen = buffer;
  }
  return absl::UnavailableError(
      absl::StrCat("the server exited before logging \"", text, "\"; last line: ", seen));
}

absl::StatusOr<int> Child::Stop(int signal) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  kill(pid_, signal);
  return Wait();
}

absl::StatusOr<int> Child::Wait() {
  int status = 0;
  const pid_t pid = std::exchange(pid_, -1);
  if (waitpid(pid, &status, 0) != pid) return absl::ErrnoToStatus(errno, "waitpid");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string AddressIn(absl::string_view line, absl::string_view after) {
  const size_t at = line.find(after);
  if (at == absl::string_view::npos) return "";
  absl::string_view rest = line.substr(at + after.size());
  return std::string(rest.substr(0, rest.find_first_of(" /\n")));
}

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream file(path);
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // The command (field 2) is in parentheses and may hold spaces: count from its end.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return absl::InternalError(absl::StrCat("cannot read ", path));
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  // Fields 3 to 13, then utime (14) and stime (15), in clock ticks.
  for (int i = 3; i <= 13; ++i) fields >> field;
  long long utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) return absl::InternalError(absl::StrCat("cannot parse ", path));
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

}  // namespace qparams::bench
