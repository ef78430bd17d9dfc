// The restart bench: a real qparams-server process fills a data directory with
// initialized sessions (bench/session_fill.h), is killed (SIGKILL, as a crash or an
// OOM kill would), and is started again on the same directory. The restart is timed
// against reading the directory's bytes once, and the restarted server's resident
// memory is compared with the raw bytes of the session buffers.

#ifndef QPARAMS_BENCH_RESTART_H_
#define QPARAMS_BENCH_RESTART_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/session_fill.h"

namespace qparams::bench {

struct RestartSpec {
  std::string server_binary;  // qparams-server
  std::string scratch_dir;    // the data directory is made (and removed) under it
  FillSpec fill;
};

struct RestartResult {
  int64_t data_dir_bytes = 0;
  int64_t raw_bytes = 0;          // RawStateBytes(fill)
  absl::Duration fill_time;       // creating and observing every session
  absl::Duration read_time;       // `cat` of the directory's files to /dev/null
  absl::Duration restart_time;    // from spawning the server to its "listening" line
  int64_t rss_before_kill = 0;    // the first server's VmRSS once filled
  int64_t rss_after_restart = 0;  // the restarted server's VmRSS once serving
  int64_t sessions_restored = 0;  // from the restarted server's log
};

// Runs the whole scenario; the directory is removed afterwards, and every process
// started is stopped by its PID. Errors: a step that fails, with what it was.
absl::StatusOr<RestartResult> MeasureRestart(const RestartSpec& spec);

}  // namespace qparams::bench

#endif  // QPARAMS_BENCH_RESTART_H_
