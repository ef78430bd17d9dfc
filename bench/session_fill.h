// The memory bench's load: many initialized per-channel sessions on one server, so
// that its resident memory can be compared with the raw bytes of their buffers.

#ifndef QPARAMS_BENCH_SESSION_FILL_H_
#define QPARAMS_BENCH_SESSION_FILL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace qparams::bench {

struct FillSpec {
  int64_t sessions = 100000;
  int64_t channels = 1024;
  int concurrency = 8;
};

// The raw state of the filled sessions: per session five float32 buffers of
// `channels` values (scale, zero_point, minval, running_min, running_max), as
// coreai_opt's moving_average calculator holds them.
inline int64_t RawStateBytes(const FillSpec& spec) {
  return spec.sessions * spec.channels * 5 * 4;
}

// Creates `spec.sessions` moving_average sessions (int8 asymmetric, per_channel axis 0,
// target activation) on `target` and initializes each with one observation of a
// (channels, 1) float32 tensor, from `spec.concurrency` threads. The first failure
// ends it, with its status.
absl::Status FillSessions(const std::string& target, const FillSpec& spec);

// The resident set size (VmRSS) of `process` ("self" or a PID), in bytes.
absl::StatusOr<int64_t> ResidentBytes(const std::string& process = "self");

}  // namespace qparams::bench

#endif  // QPARAMS_BENCH_SESSION_FILL_H_
