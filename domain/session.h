// A session: one named stateful calculator whose buffers persist across RPCs. The
// domain object behind every session method; it knows nothing of gRPC.
//
// Thread safety: every method may be called concurrently. Mutations of one session
// apply one at a time, and a read sees the state before or after a mutation, never
// half of one. Lock order: the session's lock, then a histogram calculator's own
// lock on its cached search result (reads under the session's reader lock may run
// the search; the first runs it, the others wait for its result).

#ifndef QPARAMS_DOMAIN_SESSION_H_
#define QPARAMS_DOMAIN_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dedupe_window.h"
#include "core/calibration.h"
#include "core/granularity.h"
#include "core/histogram.h"
#include "core/histogram_params.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/qparams_calculator.h"
#include "core/quant_spec.h"
#include "core/scale_group.h"
#include "core/step_merge.h"
#include "metrics/metrics.h"
#include "qparams/storage/v1/storage.pb.h"
#include "storage/session_codec.h"
#include "storage/session_log.h"

namespace qparams {

// get_qparams: the buffers, and whether a computing forward has filled them.
struct CachedQParams {
  QParams qparams;
  bool initialized = false;
  std::optional<CalibrationResult> calibration;  // histogram kinds, once initialized
};

// Everything a client may read of a session, copied out under its lock.
struct SessionInfo {
  std::string name;
  std::string calculator;         // the resolved registry key
  QuantSpec spec;                 // resolved, with the current granularity
  double averaging_constant = 0;  // moving_average only
  bool initialized = false;
  bool export_mode = false;
  int64_t observation_count = 0;
  QParams qparams;                 // the buffers
  std::vector<float> running_min;  // running kinds, once initialized
  std::vector<float> running_max;
  std::optional<DType> input_dtype;  // fixed by the first computing forward
  absl::Time create_time;
  absl::Time update_time;
  std::string description;
  std::optional<HistogramParams> histogram_params;  // histogram kinds: resolved
  std::optional<CalibrationResult> calibration;     // histogram kinds, once initialized
  std::optional<StepState> steps;                   // step-merged sessions, once stepped
};

// A forward's outcome on a session.
struct ObserveResult {
  QParams qparams;                // empty when the observation omitted them
  int64_t observation_count = 0;  // after the forward
  std::optional<CalibrationResult> calibration;  // histogram kinds, unless omitted
  // The key was applied before: nothing was applied now, observation_count is the
  // count after the original, and qparams/calibration are the session's current ones.
  bool duplicate = false;
};

// Every successful mutation appends the session's new state to the session log
// under the session's lock (so the log holds one session's states in their order)
// and returns only once the log has synced it (on disk under Durability::kAlways).
// With a log that keeps records the mutation is made on a copy of the calculator
// that replaces it only then: if the log cannot take the record, the session is
// unchanged and the call fails.
class Session {
 public:
  // Takes over `calculator` (built from the session's spec, or restored with its
  // times, dedupe window and steps). `log` must outlive the session.
  Session(SessionKey key, std::unique_ptr<StatefulQParamsCalculatorBase> calculator,
          SessionLog& log, absl::Time create_time, absl::Time update_time,
          DedupeWindow dedupe = {}, std::optional<StepMerge> steps = std::nullopt);

  const SessionKey& key() const { return key_; }
  const std::string& name() const { return key_.name; }

  // forward(x). The calculator's errors (INVALID_ARGUMENT, FAILED_PRECONDITION,
  // RESOURCE_EXHAUSTED at a histogram's 2^62 values), NOT_FOUND once the session is
  // deleted, or the session log's error; a failure changes nothing.
  //
  // The lazy-search rule of the histogram kinds (percentile, entropy, mse): with
  // `omit_qparams` the observation is only merged into the histogram and no search
  // runs (the result carries no qparams and no calibration); without it the search
  // runs, unless the histogram is unchanged since the last one, and its result is
  // returned. The search's result is kept until the histogram changes, so reads
  // (GetQParams, Info) run it at most once per state. The other kinds compute their
  // qparams on every computing forward whatever `omit_qparams` says (it is cheap);
  // the caller drops them.
  //
  // With an idempotency `key` (valid: ValidateObserveKey), the rule of the session's
  // dedupe window (common/dedupe_window.h): a key it holds is answered as a
  // duplicate (ObserveResult::duplicate) and applies nothing; a key older than the
  // window is FAILED_PRECONDITION; otherwise the forward applies and its key is
  // remembered in the same record. A failure is not remembered (it changed nothing):
  // the key's retry is evaluated anew.
  absl::StatusOr<ObserveResult> Observe(const Observation& x, bool omit_qparams = false,
                                        const std::optional<ObserveKey>& key = std::nullopt);

  // ---- Step-merged sessions (shared/docs/qat.md, docs/qat.md) ----
  //
  // Rank `rank` of `world_size` contributes `x` (a tensor or a range observation;
  // unset: nothing, the rank skipped the module) to step `step`; every step then
  // complete is applied, in order, and journaled with the contribution (one record).
  // StepMerge::Contribute's refusals; the calculator's for `x` (INVALID_ARGUMENT, or
  // FAILED_PRECONDITION for another dtype or N than the session's); FAILED_PRECONDITION
  // for a histogram kind (only the range kinds merge steps) or a session in export
  // mode; the log's error. A failure changes nothing; a retry (duplicate) neither.
  absl::StatusOr<StepMerge::Outcome> Contribute(int64_t step, int32_t rank, int32_t world_size,
                                                const std::optional<Observation>& x);
  // Replays a journaled contribution that applied no step (storage's
  // EncodeContribution) onto the state the session's record restored; nothing is
  // journaled. INVALID_ARGUMENT for one that does not follow that state (the session
  // never stepped, or it would apply a step); the merge's refusals.
  absl::Status ReplayContribution(const StepContribution& c, absl::Time update_time);
  // Closes every step up to `step` that is still open (its timeout expired), applying
  // it with what it has and recording the missing ranks; journaled. Returns how many
  // steps closed with ranks missing, and adds them to `closed_incomplete` (if not
  // null) before a reader waiting for those steps can return.
  absl::StatusOr<int> CloseSteps(int64_t step, Counter* closed_incomplete = nullptr);
  // The lowest step with a contribution not applied yet, if any.
  std::optional<int64_t> FirstPendingStep() const;
  // Records `step` as the one the engine's step timer holds for the session (unset:
  // none); whether that changed it. The engine's bookkeeping, kept here so that a
  // contribution that leaves the lowest open step as it was takes no timer lock.
  bool ExchangeArmedStep(std::optional<int64_t> step);
  // The qparams as of step `step` (unset: the latest applied), and the step they
  // follow; qparams unset if that step is not applied yet (or none is).
  // FAILED_PRECONDITION for a step older than the kept ones, or a session that never
  // took a step.
  struct StepRead {
    int64_t step = -1;
    std::optional<QParams> qparams;
  };
  absl::StatusOr<StepRead> ReadStep(std::optional<int64_t> step) const;
  // ReadStep, once step `step` is applied or at `deadline` (DEADLINE_EXCEEDED naming
  // the last applied step); wakes when the session is retired (its gone status).
  absl::StatusOr<StepRead> AwaitStep(int64_t step, absl::Time deadline) const;
  // The steps as a plain value (unset: never stepped), for reads and metrics.
  std::optional<StepState> Steps() const;

  // Waits without a thread (the Step RPC): `ready` is to run once step `step` is
  // applied or the session is retired. Unset if that is so already (`ready` is then
  // dropped: the caller reads at once); else the wait's id, and `ready` runs on the
  // thread of a later RunReadyWaits, or never if CancelWait comes first.
  std::optional<uint64_t> WhenApplied(int64_t step, std::function<void()> ready);
  void CancelWait(uint64_t id);
  // Runs the waits whose step is applied (or all, once retired). Whoever applies steps
  // calls it after releasing every lock of its own: `ready` may read the session.
  void RunReadyWaits();

  // The session's state as of its last applied step, which must be `step`
  // (FAILED_PRECONDITION otherwise, or for a session that never took a step): the
  // bytes of its calculator's record, opaque to clients, for Resume.
  absl::StatusOr<std::string> Checkpoint(int64_t step) const;
  // Restarts the steps from `checkpoint` (Checkpoint's bytes for this session; empty:
  // uninitialized) so that the next step applied is `next_step`: open steps are
  // discarded, the steps closed incomplete before `next_step` kept; journaled.
  // INVALID_ARGUMENT for a negative step or bytes that are no record;
  // FAILED_PRECONDITION for another session's record (name, calculator or spec), a
  // histogram kind or a session in export mode.
  absl::Status Resume(int64_t next_step, absl::string_view checkpoint);

  // set_export_mode(enabled).
  absl::Status SetExportMode(bool enabled);

  // The granularity setter: FAILED_PRECONDITION once initialized (whatever the
  // granularity), INVALID_ARGUMENT for a granularity that cannot be built.
  absl::Status SetGranularity(const Granularity& granularity);

  // get_qparams; a histogram kind runs its search here if its histogram changed
  // since the search last ran (under the session's reader lock: reads of one
  // session wait for it, other sessions do not).
  CachedQParams GetQParams() const;

  // The histogram of a percentile, entropy or mse session (canonical: exactly M
  // counts). INVALID_ARGUMENT naming the calculator for another kind; NOT_FOUND once
  // the session is deleted. Runs no search.
  absl::StatusOr<Histogram> GetHistogram() const;

  // Computing forwards applied so far.
  int64_t observation_count() const;

  // Everything a client may read; the qparams and calibration of a histogram kind
  // as GetQParams computes them.
  SessionInfo Info() const;

  // What a scale group reads of the session (its spec, whether it is initialized, its
  // current range), copied out under its lock; NOT_FOUND once the session is deleted.
  absl::StatusOr<GroupMemberState> GroupMember() const;

  // The whole state as a journal/snapshot record.
  storage::v1::SessionState Record() const;

  // When a call last named the session (reads included), for idle eviction.
  absl::Time last_access() const;

  // Takes the session out of service: `leave` (run under the session's lock, so no
  // mutation of it is in flight or can follow) removes it from the store and
  // journals why. If `leave` fails, the session stays as it was. Later calls that
  // reach the object through an old reference answer `gone`.
  absl::Status Retire(const std::function<absl::Status()>& leave, absl::Status gone);

 private:
  absl::Status CheckLive() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::optional<StepState> StepsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<StepRead> ReadLocked(std::optional<int64_t> step) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A step's application to `calculator` (a copy): the forward of its merged range.
  static std::function<absl::StatusOr<QParams>(int64_t, const std::optional<ReducedRange>&)>
  ApplyTo(StatefulQParamsCalculatorBase& calculator);
  // Appends the session's record with `calculator` and `steps` (if the log keeps
  // records) as durably as the log promises, and sets the update time.
  absl::Status Journal(const StatefulQParamsCalculatorBase& calculator, const StepMerge& steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Journals `next` and `next_steps` and puts them in place.
  absl::Status CommitSteps(std::unique_ptr<StatefulQParamsCalculatorBase> next,
                           StepMerge next_steps) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch() const;
  // Runs `mutate` on the calculator under the session's lock (the calculator is
  // passed in: lock analysis cannot see into a lambda). With a log that keeps
  // records, on a copy (Clone) whose state is appended to the log and made as
  // durable as it promises (fsynced under kAlways), still under the lock, before it
  // replaces the calculator; if any step fails the session is unchanged, so that no
  // read ever sees a mutation that was not acknowledged.
  absl::Status Mutate(const std::function<absl::Status(StatefulQParamsCalculatorBase&)>& mutate)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Mutate's work once the lock is held and the session is live; with a `key`, the
  // dedupe window remembers it with the calculator's new count, in the same record.
  absl::Status MutateLocked(
      const std::function<absl::Status(StatefulQParamsCalculatorBase&)>& mutate,
      const std::optional<ObserveKey>& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionKey key_;
  const absl::Time create_time_;
  SessionLog& log_;
  mutable std::atomic<int64_t> last_access_ns_;
  std::atomic<int64_t> armed_step_{kNoArmedStep};  // ExchangeArmedStep
  static constexpr int64_t kNoArmedStep = -1;
  mutable absl::Mutex mu_;
  std::unique_ptr<StatefulQParamsCalculatorBase> calculator_ ABSL_GUARDED_BY(mu_);
  absl::Time update_time_ ABSL_GUARDED_BY(mu_);
  DedupeWindow dedupe_ ABSL_GUARDED_BY(mu_);
  // Set by the first step contribution; ordinary observations are refused after it.
  std::optional<StepMerge> steps_ ABSL_GUARDED_BY(mu_);
  // Signalled when steps are applied or the session is retired (AwaitStep).
  mutable absl::CondVar steps_applied_;
  absl::Status gone_ ABSL_GUARDED_BY(mu_);  // OK while the session is in the store

  struct Wait {
    int64_t step;
    std::function<void()> ready;
  };
  // Lock order: mu_, then waits_mu_ (WhenApplied holds both so that no step can be
  // applied between its check and its wait's insertion).
  mutable absl::Mutex waits_mu_ ABSL_ACQUIRED_AFTER(mu_);
  uint64_t next_wait_id_ ABSL_GUARDED_BY(waits_mu_) = 1;
  std::map<uint64_t, Wait> waits_ ABSL_GUARDED_BY(waits_mu_);
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SESSION_H_
