// The load qparams-bench puts on a server: `concurrency` workers, each with its own
// session, sending prebuilt requests back to back for a while and timing each. Every
// call naming a session carries it in the x-qparams-session header, as the clients'
// calls do, so that a balancer in front of sharded replicas routes it to the owner.

#ifndef QPARAMS_BENCH_LOAD_GENERATOR_H_
#define QPARAMS_BENCH_LOAD_GENERATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "qparams/v1/qparams.grpc.pb.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams::bench {

enum class Mode {
  kCompute,  // unary Compute of the tensor (calculator "dynamic")
  kObserve,  // unary Observe of the whole tensor
  kStream,   // the same observations over one ObserveStream per worker
  kRange,    // unary Observe of the tensor's block minima and maxima (reduced once here)
};

// "compute", "observe", "stream" or "range"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Mode> ParseMode(absl::string_view name);
absl::string_view ModeName(Mode mode);

struct LoadSpec {
  Mode mode = Mode::kObserve;
  Shape shape = {64};
  DType dtype = DType::kFloat32;  // the tensor's; quantized to int8, target activation
  v1::Granularity granularity;    // unset = per_tensor
  std::string calculator = "moving_average";  // the sessions'; Compute uses "dynamic"
  bool omit_qparams = false;  // Observe and ObserveStream requests ask for no qparams
  // Observations carry idempotency keys (docs/retries.md): a client_id per worker and
  // run, and a sequence the worker increases with every call, as the clients send.
  bool idempotency_keys = false;
  int concurrency = 1;
  absl::Duration warmup = absl::Milliseconds(300);  // before each measured run
};

// What one run measured.
struct LoadResult {
  int64_t requests = 0;              // completed in the measured window
  double seconds = 0;                // the window
  std::vector<int64_t> latency_ns;   // of each request, sorted
  int64_t request_bytes = 0;         // one request, serialized
  int64_t covered_bytes = 0;         // the input tensor bytes one request stands for
  double cpu_seconds = 0;            // this process's CPU time in the window (all threads)

  double qps() const { return seconds > 0 ? requests / seconds : 0; }
  double mb_per_s() const { return qps() * request_bytes / 1e6; }
  double covered_mb_per_s() const { return qps() * covered_bytes / 1e6; }
  // Process CPU time (client and any in-process server) per request.
  double cpu_us_per_request() const { return requests > 0 ? 1e6 * cpu_seconds / requests : 0; }
  // The q-quantile (0..1) of the latencies, in microseconds.
  double LatencyUs(double q) const;

  // Adds another run's requests, window and latencies to this one.
  void Merge(const LoadResult& other);
};

class LoadGenerator {
 public:
  // Builds the requests once: a tensor of normally distributed values (fixed seed)
  // and, for range mode, its block minima and maxima. INVALID_ARGUMENT for a
  // shape, granularity or concurrency the workload cannot have.
  static absl::StatusOr<LoadGenerator> Create(const LoadSpec& spec);

  // Creates the workers' sessions on `target` (nothing for Compute).
  absl::Status CreateSessions(const std::string& target) const;
  // Deletes them again.
  absl::Status DeleteSessions(const std::string& target) const;

  // Runs the workers against `target` for `warmup` and then for `duration`,
  // measured, over one new channel. The first failed call ends the run with its
  // status, prefixed with the method.
  absl::StatusOr<LoadResult> Run(const std::string& target, absl::Duration duration) const;

  // The largest message the workload sends, for the servers' receive limits.
  int64_t max_request_bytes() const { return result_template_.request_bytes; }

 private:
  LoadGenerator() = default;

  // Calls `call` for each worker's session over one channel to `target`, each with a
  // 30 s deadline; the first failure ends it. Nothing to do for Compute.
  absl::Status ForEachSession(
      const std::string& target,
      const std::function<absl::Status(v1::QParamsService::Stub&, const std::string&,
                                       grpc::ClientContext*)>& call) const;

  LoadSpec spec_;
  v1::QuantSpec quant_spec_;
  std::vector<std::string> sessions_;                 // one per worker
  std::vector<v1::ObserveRequest> observe_requests_;  // one per worker
  // Runs started, so that each run's workers key with client ids of their own.
  std::shared_ptr<std::atomic<int64_t>> runs_ = std::make_shared<std::atomic<int64_t>>(0);
  v1::ComputeRequest compute_request_;
  LoadResult result_template_;  // request_bytes and covered_bytes
};

}  // namespace qparams::bench

#endif  // QPARAMS_BENCH_LOAD_GENERATOR_H_
