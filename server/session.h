// A session: one named stateful calculator whose buffers persist across RPCs. The
// domain object behind every session method; it knows nothing of gRPC.
//
// Thread safety: every method may be called concurrently. Mutations of one session
// apply one at a time, and a read sees the state before or after a mutation, never
// half of one.

#ifndef QPARAMS_SERVER_SESSION_H_
#define QPARAMS_SERVER_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/granularity.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/qparams_calculator.h"
#include "core/quant_spec.h"

namespace qparams {

// Everything a client may read of a session, copied out under its lock.
struct SessionInfo {
  std::string name;
  std::string calculator;  // the resolved registry key
  QuantSpec spec;          // resolved, with the current granularity
  double averaging_constant = 0;  // moving_average only
  bool initialized = false;
  bool export_mode = false;
  int64_t observation_count = 0;
  QParams qparams;                  // the buffers
  std::vector<float> running_min;  // running kinds, once initialized
  std::vector<float> running_max;
  std::optional<DType> input_dtype;  // fixed by the first computing forward
  absl::Time create_time;
  absl::Time update_time;
  std::string description;
};

// A forward's outcome on a session.
struct ObserveResult {
  QParams qparams;
  int64_t observation_count = 0;  // after the forward
};

class Session {
 public:
  // Takes over `calculator` (built from the session's spec); the clock starts now.
  Session(std::string name, std::unique_ptr<StatefulQParamsCalculatorBase> calculator);

  const std::string& name() const { return name_; }

  // forward(x). The calculator's errors (INVALID_ARGUMENT, FAILED_PRECONDITION), or
  // NOT_FOUND once the session is deleted; a failure changes nothing.
  absl::StatusOr<ObserveResult> Observe(const Observation& x);

  // set_export_mode(enabled).
  absl::Status SetExportMode(bool enabled);

  // The granularity setter: FAILED_PRECONDITION once initialized (whatever the
  // granularity), INVALID_ARGUMENT for a granularity that cannot be built.
  absl::Status SetGranularity(const Granularity& granularity);

  // get_qparams: the buffers and whether a computing forward has filled them.
  std::pair<QParams, bool> GetQParams() const;

  // Computing forwards applied so far.
  int64_t observation_count() const;

  SessionInfo Info() const;

  // Called by the store when the session leaves it: later calls that reach this
  // object through an old reference answer NOT_FOUND instead of changing it.
  void MarkDeleted();

 private:
  absl::Status CheckLive() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const absl::Time create_time_;
  mutable absl::Mutex mu_;
  std::unique_ptr<StatefulQParamsCalculatorBase> calculator_ ABSL_GUARDED_BY(mu_);
  absl::Time update_time_ ABSL_GUARDED_BY(mu_);
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_SESSION_H_
