// Whether a data directory still takes writes, proved by writing: what a health
// check asks before it calls a replica ready (server/server.h, Readiness). The
// journal learns of a full or failing disk only when a mutation meets it; an idle
// replica would look healthy until then, so the probe writes a file of its own.

#ifndef QPARAMS_STORAGE_WRITE_PROBE_H_
#define QPARAMS_STORAGE_WRITE_PROBE_H_

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/env.h"

namespace qparams {

class WriteProbe {
 public:
  // The file it writes in `dir`; not a name the journal reads or removes.
  static constexpr char kFileName[] = "health-probe";

  // Probes `dir` through `env` (which must outlive the probe); a result is reused
  // for `max_age` (zero: every Check probes).
  WriteProbe(Env* env, std::string dir, absl::Duration max_age)
      : env_(env), dir_(std::move(dir)), max_age_(max_age) {}

  // OK if DIR/health-probe could be created, written, fsynced and removed, each
  // through the Env, by a probe at most max_age old; else the first error of that
  // probe as the Env gives it (errno's code; "cannot fsync /data/health-probe:
  // Input/output error"). A failure breaks nothing: the next probe tries again.
  // Thread-safe: one probe at a time, and callers within max_age of it share its
  // result; a probe blocks as long as the disk does.
  absl::Status Check() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status Probe();

  Env* const env_;
  const std::string dir_;
  const absl::Duration max_age_;
  absl::Mutex mu_;
  absl::Time probed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qparams

#endif  // QPARAMS_STORAGE_WRITE_PROBE_H_
