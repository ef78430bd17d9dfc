// The steps bench (qparams-bench --mode=steps): the rate at which one server core
// applies step contributions (docs/qat.md), as a data-parallel training job sends
// them. A real qparams-server process, pinned to --server_cpus, serves `sessions`
// step-merged sessions (moving_average, int8 asymmetric, per_tensor activations);
// `ranks` client threads, pinned to --client_cpus, play the job's ranks: at every
// training step each rank sends ONE Step call carrying its per_tensor range of every
// session (a RangeObservation of an `input_shape` float32 input, min and max of block
// counts [1, ...]) and its reads of every session as of step s - lag, which wait for
// the step to be applied, as the clients' training loop does (docs/reference/qat.md
// §5: the call at the start of training step s carries the ranges of step s - 1 and
// reads as of s - lag, so with lag 1 every call waits for the slowest rank's last
// step, like a gradient all-reduce).
//
// One server keeps its sessions in memory (--durability=none), the other journals
// them to a data directory under the scratch directory (--durability=batched, the
// default with --data_dir); they take turns, `rounds` times, so that drift on the
// machine falls on both alike. Measured per server: applied contributions per second
// of wall time (the server on its pinned core), the server process's CPU time (from
// /proc) and so contributions per server CPU-second, the Step calls the server
// counted (its /metrics) per rank and step, and the calls' latency. Also the engine
// alone, without gRPC, on this process's thread: the time per contribution and per
// read of the same workload, for where the server's time goes.

#ifndef QPARAMS_BENCH_STEP_BENCH_H_
#define QPARAMS_BENCH_STEP_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"

namespace qparams::bench {

struct StepBenchSpec {
  std::string server_binary;             // qparams-server
  std::string scratch_dir = "/var/tmp";  // the journaling server's data directory goes here
  int64_t sessions = 200;                // modules: one step-merged session each
  int ranks = 8;                         // W
  int lag = 1;                           // L >= 1
  Shape input_shape = {64, 128};         // the module input each range stands for
  std::string calculator = "moving_average";
  // CPU lists ("0", "1-3", "0,2"); empty leaves the server or the clients unpinned.
  std::string server_cpus = "0";
  std::string client_cpus = "1";
  // "none" (memory), "batched" and/or "always" (journaled to a scratch directory); their
  // JSON fields start memory_, journal_ and always_.
  std::vector<std::string> durabilities = {"none", "batched"};
  absl::Duration duration = absl::Seconds(8);       // measured, per server, over the rounds
  absl::Duration warmup = absl::Milliseconds(300);  // before each round's measured run
  int rounds = 4;
  int64_t engine_steps = 100;  // steps of the engine-alone measurement (per durability)
  // StepRequest.step_timeout; zero leaves it unset (the server's --step_timeout).
  absl::Duration step_timeout = absl::ZeroDuration();
};

// Runs the scenario and prints its figures: one JSON object with `json`, else a table.
absl::Status RunStepBench(const StepBenchSpec& spec, bool json);

// "1-3,5" -> {1, 2, 3, 5}; INVALID_ARGUMENT naming `flag` for anything else.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text, const std::string& flag);

}  // namespace qparams::bench

#endif  // QPARAMS_BENCH_STEP_BENCH_H_
