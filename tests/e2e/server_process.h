// A qparams-server child process whose stderr (the log) a test reads line by line.

#ifndef QPARAMS_TESTS_SERVER_PROCESS_H_
#define QPARAMS_TESTS_SERVER_PROCESS_H_

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/support/subprocess.h"

extern char** environ;

namespace qparams::testing {

// A qparams-server child whose stderr (the log) the test reads line by line.
// `flags` follow --listen=127.0.0.1:0 (a later --listen wins).
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> flags) {
    std::vector<std::string> args = {QPARAMS_SERVER_PATH, "--listen=127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv = CStrings(args);
    int fds[2];
    if (pipe(fds) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    log_ = fdopen(fds[0], "r");
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (log_ != nullptr) fclose(log_);
  }

  bool started() const { return pid_ > 0 && log_ != nullptr; }

  // Reads log lines up to one containing `text` (blocking); the line, or "" at EOF.
  std::string WaitForLine(const std::string& text) {
    char buffer[4096];
    while (fgets(buffer, sizeof buffer, log_) != nullptr) {
      log_text_ += buffer;
      if (absl::StrContains(buffer, text)) return buffer;
    }
    return "";
  }

  // Sends `signal` and returns the exit status (or -1 if it did not exit normally).
  int Stop(int signal) {
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // Sends `signal` and returns at once.
  void Signal(int signal) { kill(pid_, signal); }

  // Kills the process at once (SIGKILL) and reaps it.
  void Kill() { Stop(SIGKILL); }

  const std::string& log_text() const { return log_text_; }

 private:
  pid_t pid_ = -1;
  FILE* log_ = nullptr;
  std::string log_text_;
};

// The address of the "listening on ADDRESS" line.
inline std::string AddressFrom(const std::string& listening_line) {
  return std::string(listening_line.substr(listening_line.rfind(' ') + 1,
                                           listening_line.size() - listening_line.rfind(' ') - 2));
}

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_SERVER_PROCESS_H_
