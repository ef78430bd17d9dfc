// qparams-bench --mode group: the latency of GetGroupQParams on a GLOBAL_AMAX scale
// group of NVFP4 weight sessions (nvfp4.md §4.2), against that of a one-member group
// on the same server, taking turns.

#ifndef QPARAMS_BENCH_GROUP_LATENCY_H_
#define QPARAMS_BENCH_GROUP_LATENCY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace qparams::bench {

struct GroupLatencySpec {
  int members = 64;            // of the measured group
  int64_t calls = 2000;        // GetGroupQParams calls per group, split over the rounds
  int rounds = 4;              // the two groups take turns this many times
  int64_t warmup_calls = 50;   // unmeasured, per group and round
  Shape shape = {64, 256};     // each member's weight, [out, in]; in a multiple of 16
  DType dtype = DType::kBFloat16;
};

struct GroupLatencyResult {
  std::vector<int64_t> latency_ns;      // the group's calls, sorted
  std::vector<int64_t> ref_latency_ns;  // the one-member group's, sorted
  int64_t response_bytes = 0;           // one GroupQParams of the group, serialized
  int64_t ref_response_bytes = 0;
};

// Creates `spec.members` static NVFP4 sessions (float4_e2m1fn_x2, float8_e4m3fn block
// scales, compressed_tensors, per_block 16 on the last axis) on `target`, each
// initialized with one range observation of a weight of `spec.shape` (its per-block
// ranges, reduced here; member i's values scaled by 1 + i / members so that the
// amaxes differ), groups them all as GLOBAL_AMAX and the first one alone, times the
// calls over one channel, and deletes the groups and sessions again.
absl::StatusOr<GroupLatencyResult> MeasureGroupLatency(const std::string& target,
                                                       const GroupLatencySpec& spec);

// The mean of latencies, in microseconds (0 for none).
double MeanUs(const std::vector<int64_t>& ns);

}  // namespace qparams::bench

#endif  // QPARAMS_BENCH_GROUP_LATENCY_H_
