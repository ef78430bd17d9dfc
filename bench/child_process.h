// A child process for the benches that run a real qparams-server (bench/restart.h,
// bench/step_bench.h): spawned with posix_spawn, its stderr read line by line, killed
// and reaped by its PID when destroyed.

#ifndef QPARAMS_BENCH_CHILD_PROCESS_H_
#define QPARAMS_BENCH_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams::bench {

// A child process spawned with `argv`; its stderr can be read line by line
// (`capture_stderr`) and its stdout can go to /dev/null. Killed (SIGKILL) and reaped
// when destroyed, if still running.
class Child {
 public:
  static absl::StatusOr<std::unique_ptr<Child>> Spawn(std::vector<std::string> argv,
                                                      bool capture_stderr, bool stdout_to_null);
  ~Child();

  pid_t pid() const { return pid_; }

  // Reads the log up to the first line containing `text`, and returns that line.
  // Errors: the log ends first (the process exited), with the last line read.
  absl::StatusOr<std::string> WaitForLine(absl::string_view text);

  // Sends `signal` and reaps the process; its exit code (or 128 + the signal).
  absl::StatusOr<int> Stop(int signal);
  absl::StatusOr<int> Wait();

  // Reads (and drops) the rest of the log on a thread of its own, so that a server
  // that goes on logging never blocks on a full pipe. WaitForLine is not called again.
  void DrainLog();

 private:
  Child() = default;
  pid_t pid_ = -1;
  FILE* log_ = nullptr;
  std::thread drain_;
};

// "... listening on 127.0.0.1:PORT ..." -> "127.0.0.1:PORT" (the server's log lines
// "listening on ADDRESS" and "serving metrics on http://ADDRESS/metrics" alike).
std::string AddressIn(absl::string_view line, absl::string_view after = "listening on ");

// The user and system CPU time `pid` has used, all its threads, in seconds
// (/proc/PID/stat).
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);

}  // namespace qparams::bench

#endif  // QPARAMS_BENCH_CHILD_PROCESS_H_
