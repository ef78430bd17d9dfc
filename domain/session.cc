#include "domain/session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/histogram_calculator.h"
#include "core/registry.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

// Running buffers hold values of the working precision; float64 ones are returned
// rounded to float32, as the upstream float32 buffers hold them.
std::vector<float> ToFloats(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

// The histogram kinds have an observation without a search, a calibration and a
// histogram beside what every kind has; null for the other kinds.
HistogramQParamsCalculator* AsHistogram(StatefulQParamsCalculatorBase& calculator) {
  return dynamic_cast<HistogramQParamsCalculator*>(&calculator);
}

// The Apply of a contribution merged in place, which cannot apply a step (MayApply).
absl::StatusOr<QParams> NothingApplies(int64_t step, const std::optional<ReducedRange>&) {
  return absl::InternalError(absl::StrCat("step ", step, " applied by a contribution in place"));
}

}  // namespace

Session::Session(SessionKey key, std::unique_ptr<StatefulQParamsCalculatorBase> calculator,
                 SessionLog& log, absl::Time create_time, absl::Time update_time,
                 DedupeWindow dedupe, std::optional<StepMerge> steps)
    : key_(std::move(key)),
      create_time_(create_time),
      log_(log),
      last_access_ns_(absl::ToUnixNanos(absl::Now())),
      calculator_(std::move(calculator)),
      update_time_(update_time),
      dedupe_(std::move(dedupe)),
      steps_(std::move(steps)) {}

void Session::Touch() const {
  last_access_ns_.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
}

absl::Time Session::last_access() const {
  return absl::FromUnixNanos(last_access_ns_.load(std::memory_order_relaxed));
}

absl::Status Session::CheckLive() const { return gone_; }

absl::Status Session::Mutate(
    const std::function<absl::Status(StatefulQParamsCalculatorBase&)>& mutate) {
  Touch();
  absl::MutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  return MutateLocked(mutate, std::nullopt);
}

absl::Status Session::MutateLocked(
    const std::function<absl::Status(StatefulQParamsCalculatorBase&)>& mutate,
    const std::optional<ObserveKey>& key) {
  // With a log that keeps nothing, nothing can fail after `mutate`: it runs on the
  // calculator.
  if (!log_.keeps_records()) {
    QPARAMS_RETURN_IF_ERROR(mutate(*calculator_));
    if (key) dedupe_.Record(*key, calculator_->observation_count());
    update_time_ = absl::Now();
    return absl::OkStatus();
  }
  // Otherwise it runs on a copy that takes the calculator's place only once its
  // record is as durable as promised: a refused record leaves nothing to undo, and
  // the state is exported once, for the record. Synced under the session's lock, so
  // that no read sees a mutation before it is acknowledged; other sessions append
  // meanwhile and share the fsync.
  std::unique_ptr<StatefulQParamsCalculatorBase> next = calculator_->Clone();
  QPARAMS_RETURN_IF_ERROR(mutate(*next));
  // The window is copied only for a keyed mutation; it replaces the session's with
  // the calculator, so a key is remembered exactly when its observation is applied.
  std::optional<DedupeWindow> next_dedupe;
  if (key) {
    next_dedupe = dedupe_;
    next_dedupe->Record(*key, next->observation_count());
  }
  const absl::Time update_time = absl::Now();
  QPARAMS_ASSIGN_OR_RETURN(const uint64_t sequence,
                           log_.AppendPut(key_, next->ExportState(), create_time_, update_time,
                                          next_dedupe ? *next_dedupe : dedupe_, StepsLocked()));
  QPARAMS_RETURN_IF_ERROR(log_.Sync(sequence));
  calculator_ = std::move(next);
  if (next_dedupe) dedupe_ = *std::move(next_dedupe);
  update_time_ = update_time;
  return absl::OkStatus();
}

absl::StatusOr<ObserveResult> Session::Observe(const Observation& x, bool omit_qparams,
                                               const std::optional<ObserveKey>& key) {
  Touch();
  absl::MutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  if (steps_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", key_.name,
                     " takes step contributions (it is step-merged, docs/qat.md): "
                     "an ordinary observation would make its state depend on arrival order"));
  }
  ObserveResult result;
  if (key) {
    QPARAMS_ASSIGN_OR_RETURN(const std::optional<int64_t> applied, dedupe_.Check(*key));
    if (applied) {
      result.duplicate = true;
      result.observation_count = *applied;
      if (!omit_qparams) {
        result.qparams = calculator_->GetQParams();
        if (const HistogramQParamsCalculator* histogram = AsHistogram(*calculator_)) {
          result.calibration = histogram->calibration();
        }
      }
      return result;
    }
  }
  absl::Status status = MutateLocked(
      [&](StatefulQParamsCalculatorBase& calculator) -> absl::Status {
        if (HistogramQParamsCalculator* histogram = AsHistogram(calculator)) {
          QPARAMS_RETURN_IF_ERROR(histogram->Observe(x));
          if (!omit_qparams) {  // the search runs here, and only here on this path
            result.qparams = histogram->GetQParams();
            result.calibration = histogram->calibration();
          }
        } else {
          QPARAMS_ASSIGN_OR_RETURN(result.qparams, calculator.Forward(x));
        }
        result.observation_count = calculator.observation_count();
        return absl::OkStatus();
      },
      key);
  if (!status.ok()) return status;
  return result;
}

absl::Status Session::SetExportMode(bool enabled) {
  return Mutate(
      [&](StatefulQParamsCalculatorBase& calculator) { return calculator.SetExportMode(enabled); });
}

absl::Status Session::SetGranularity(const Granularity& granularity) {
  return Mutate([&](StatefulQParamsCalculatorBase& calculator) {
    return calculator.SetGranularity(granularity);
  });
}

CachedQParams Session::GetQParams() const {
  Touch();
  absl::ReaderMutexLock lock(&mu_);
  CachedQParams out{calculator_->GetQParams(), calculator_->initialized(), std::nullopt};
  if (const HistogramQParamsCalculator* histogram = AsHistogram(*calculator_)) {
    out.calibration = histogram->calibration();
  }
  return out;
}

absl::StatusOr<Histogram> Session::GetHistogram() const {
  Touch();
  absl::ReaderMutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  const HistogramQParamsCalculator* histogram = AsHistogram(*calculator_);
  if (histogram == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("session ", key_.name, " is a ", calculator_->key(),
                     " session; only percentile, entropy and mse sessions keep a histogram"));
  }
  return histogram->histogram();
}

int64_t Session::observation_count() const {
  absl::ReaderMutexLock lock(&mu_);
  return calculator_->observation_count();
}

absl::StatusOr<GroupMemberState> Session::GroupMember() const {
  Touch();
  absl::ReaderMutexLock lock(&mu_);
  QPARAMS_RETURN_IF_ERROR(CheckLive());
  GroupMemberState member;
  member.name = key_.name;
  member.spec = calculator_->spec();
  member.initialized = calculator_->initialized();
  member.range = calculator_->current_range();
  return member;
}

SessionInfo Session::Info() const {
  Touch();
  absl::ReaderMutexLock lock(&mu_);
  // The exported state holds every kind's own fields (averaging constant, running
  // range) without asking which kind this is.
  CalculatorState state = calculator_->ExportState();
  SessionInfo info;
  info.name = key_.name;
  info.calculator = std::move(state.calculator);
  info.spec = std::move(state.spec);
  info.averaging_constant = state.averaging_constant.value_or(0);
  info.initialized = state.initialized;
  info.export_mode = state.export_mode;
  info.observation_count = state.observation_count;
  // Not the exported buffers: the histogram kinds export none and derive their
  // qparams (running the search if the histogram changed since it last ran).
  info.qparams = calculator_->GetQParams();
  if (state.running) {
    info.running_min = ToFloats(state.running->lo);
    info.running_max = ToFloats(state.running->hi);
  }
  // The histogram kinds take any input dtype at every observation.
  if (state.initialized && !state.histogram) info.input_dtype = state.compute_dtype_for_export;
  info.histogram_params = std::move(state.histogram_params);
  if (const HistogramQParamsCalculator* histogram = AsHistogram(*calculator_)) {
    info.calibration = histogram->calibration();
  }
  info.create_time = create_time_;
  info.update_time = update_time_;
  info.description = calculator_->Description();
  info.steps = StepsLocked();
  return info;
}

storage::v1::SessionState Session::Record() const {
  absl::ReaderMutexLock lock(&mu_);
  return EncodeSession(key_, calculator_->ExportState(), create_time_, update_time_, dedupe_,
                       StepsLocked());
}

std::optional<StepState> Session::StepsLocked() const {
  if (!steps_.has_value()) return std::nullopt;
  return steps_->ExportState();
}

std::optional<StepState> Session::Steps() const {
  absl::ReaderMutexLock lock(&mu_);
  return StepsLocked();
}

absl::StatusOr<StepMerge::Outcome> Session::Contribute(int64_t step, int32_t rank,
                                                       int32_t world_size,
                                                       const std::optional<Observation>& x) {
  Touch();
  absl::MutexLock lock(&mu_);
  QPARAMS_RETURN_IF_ERROR(CheckLive());
  if (AsHistogram(*calculator_) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", key_.name, " is a ", calculator_->key(),
                     " session; step contributions merge ranges, for static, moving_average and "
                     "global_minmax sessions"));
  }
  if (calculator_->export_mode()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", key_.name, " is in export mode; its state is frozen"));
  }
  StepContribution contribution{step, rank, world_size, std::nullopt};
  if (x.has_value()) {
    QPARAMS_ASSIGN_OR_RETURN(contribution.range, calculator_->ReduceRange(*x));
  }
  if (steps_.has_value() && !steps_->MayApply(contribution)) {
    // W - 1 of every W contributions apply nothing: merged in place, and taken back
    // if the record cannot be written (a refused contribution changes nothing
    // itself: StepMerge checks before it merges).
    // Its record is the contribution alone (AppendContribution), not the state.
    std::optional<StepMerge::SavedStep> saved;
    std::optional<StepContribution> record;
    if (log_.keeps_records()) {
      saved = steps_->Save(step);
      record = contribution;
    }
    absl::StatusOr<StepMerge::Outcome> outcome =
        steps_->Contribute(std::move(contribution), NothingApplies);
    if (outcome.ok() && !outcome->duplicate) {
      const absl::Time update_time = absl::Now();
      if (record.has_value()) {
        absl::StatusOr<uint64_t> sequence = log_.AppendContribution(key_, *record, update_time);
        absl::Status journaled = sequence.ok() ? log_.Sync(*sequence) : sequence.status();
        if (!journaled.ok()) outcome = journaled;
      }
      if (outcome.ok()) update_time_ = update_time;
    }
    if (!outcome.ok() && saved.has_value()) steps_->Restore(*saved);
    return outcome;
  }
  // On copies, which replace the session's only once journaled.
  StepMerge next_steps = steps_.value_or(StepMerge());
  std::unique_ptr<StatefulQParamsCalculatorBase> next = calculator_->Clone();
  QPARAMS_ASSIGN_OR_RETURN(const StepMerge::Outcome outcome,
                           next_steps.Contribute(std::move(contribution), ApplyTo(*next)));
  if (outcome.duplicate) return outcome;
  QPARAMS_RETURN_IF_ERROR(CommitSteps(std::move(next), std::move(next_steps)));
  return outcome;
}

absl::Status Session::ReplayContribution(const StepContribution& c, absl::Time update_time) {
  absl::MutexLock lock(&mu_);
  QPARAMS_RETURN_IF_ERROR(CheckLive());
  if (!steps_.has_value() || steps_->MayApply(c)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a contribution of rank ", c.rank, " to step ", c.step,
                     " does not follow the session's record (no steps, or it would apply one)"));
  }
  QPARAMS_RETURN_IF_ERROR(steps_->Contribute(c, NothingApplies).status());
  update_time_ = update_time;
  return absl::OkStatus();
}

absl::StatusOr<int> Session::CloseSteps(int64_t step, Counter* closed_incomplete) {
  absl::MutexLock lock(&mu_);
  QPARAMS_RETURN_IF_ERROR(CheckLive());
  if (!steps_.has_value() || steps_->last_applied() >= step) return 0;
  StepMerge next_steps = *steps_;
  std::unique_ptr<StatefulQParamsCalculatorBase> next = calculator_->Clone();
  QPARAMS_RETURN_IF_ERROR(next_steps.Close(step, ApplyTo(*next)));
  // Counted by the last incomplete step each side holds (the list is bounded).
  auto last = [](const StepMerge& m) {
    return m.incomplete().empty() ? int64_t{-1} : m.incomplete().back().step;
  };
  int closed = 0;
  for (const IncompleteStep& s : next_steps.incomplete()) closed += s.step > last(*steps_) ? 1 : 0;
  QPARAMS_RETURN_IF_ERROR(CommitSteps(std::move(next), std::move(next_steps)));
  if (closed_incomplete != nullptr && closed > 0) closed_incomplete->Increment(closed);
  return closed;
}

std::optional<int64_t> Session::FirstPendingStep() const {
  absl::ReaderMutexLock lock(&mu_);
  if (!steps_.has_value()) return std::nullopt;
  return steps_->first_pending();
}

bool Session::ExchangeArmedStep(std::optional<int64_t> step) {
  const int64_t value = step.value_or(kNoArmedStep);
  return armed_step_.exchange(value, std::memory_order_relaxed) != value;
}

std::function<absl::StatusOr<QParams>(int64_t, const std::optional<ReducedRange>&)>
Session::ApplyTo(StatefulQParamsCalculatorBase& calculator) {
  return
      [&calculator](int64_t, const std::optional<ReducedRange>& range) -> absl::StatusOr<QParams> {
        if (range.has_value()) {
          QPARAMS_RETURN_IF_ERROR(
              calculator
                  .Forward(Observation::FromRange(range->input_shape, range->range.min.view(),
                                                  range->range.max.view()))
                  .status());
        }
        return calculator.GetQParams();
      };
}

absl::Status Session::Journal(const StatefulQParamsCalculatorBase& calculator,
                              const StepMerge& steps) {
  const absl::Time update_time = absl::Now();
  // A log that keeps nothing needs no state exported.
  if (log_.keeps_records()) {
    QPARAMS_ASSIGN_OR_RETURN(const uint64_t sequence,
                             log_.AppendPut(key_, calculator.ExportState(), create_time_,
                                            update_time, dedupe_, steps.ExportState()));
    QPARAMS_RETURN_IF_ERROR(log_.Sync(sequence));
  }
  update_time_ = update_time;
  return absl::OkStatus();
}

absl::Status Session::CommitSteps(std::unique_ptr<StatefulQParamsCalculatorBase> next,
                                  StepMerge next_steps) {
  QPARAMS_RETURN_IF_ERROR(Journal(*next, next_steps));
  calculator_ = std::move(next);
  steps_ = std::move(next_steps);
  steps_applied_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<Session::StepRead> Session::ReadLocked(std::optional<int64_t> step) const {
  QPARAMS_RETURN_IF_ERROR(CheckLive());
  if (!steps_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", key_.name, " has taken no step contribution; read it with GetQParams"));
  }
  const int64_t t = step.value_or(steps_->last_applied());
  QPARAMS_ASSIGN_OR_RETURN(std::optional<QParams> qparams, steps_->AsOf(t));
  return StepRead{t, std::move(qparams)};
}

absl::StatusOr<Session::StepRead> Session::ReadStep(std::optional<int64_t> step) const {
  Touch();
  absl::ReaderMutexLock lock(&mu_);
  return ReadLocked(step);
}

absl::StatusOr<Session::StepRead> Session::AwaitStep(int64_t step, absl::Time deadline) const {
  Touch();
  absl::MutexLock lock(&mu_);
  auto ready = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !gone_.ok() || !steps_.has_value() || steps_->last_applied() >= step;
  };
  // A CondVar loop rather than Mutex::Await, for the sanitizers' model of Abseil
  // (storage/journal_reader.cc says why).
  while (!ready() && !steps_applied_.WaitWithDeadline(&mu_, deadline)) {
  }
  if (!ready()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "step ", step, " of session ", key_.name, " is not applied yet (the last applied is ",
        steps_->last_applied(), "); a rank may be late, or gone until its step timeout"));
  }
  return ReadLocked(step);
}

std::optional<uint64_t> Session::WhenApplied(int64_t step, std::function<void()> ready) {
  absl::ReaderMutexLock lock(&mu_);
  // A session that has taken no step yet waits for its first.
  if (!gone_.ok() || (steps_.has_value() && steps_->last_applied() >= step)) return std::nullopt;
  absl::MutexLock waits_lock(&waits_mu_);
  const uint64_t id = next_wait_id_++;
  waits_.emplace(id, Wait{step, std::move(ready)});
  return id;
}

void Session::CancelWait(uint64_t id) {
  absl::MutexLock waits_lock(&waits_mu_);
  waits_.erase(id);
}

void Session::RunReadyWaits() {
  std::vector<std::function<void()>> ready;
  {
    absl::ReaderMutexLock lock(&mu_);
    const bool all = !gone_.ok();
    const int64_t applied = steps_.has_value() ? steps_->last_applied() : -1;
    absl::MutexLock waits_lock(&waits_mu_);
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (all || it->second.step <= applied) {
        ready.push_back(std::move(it->second.ready));
        it = waits_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::function<void()>& run : ready) run();
}

absl::StatusOr<std::string> Session::Checkpoint(int64_t step) const {
  Touch();
  absl::ReaderMutexLock lock(&mu_);
  QPARAMS_RETURN_IF_ERROR(CheckLive());
  if (!steps_.has_value() || steps_->last_applied() != step) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", key_.name, ": a checkpoint is of the last applied step (",
                     steps_.has_value() ? steps_->last_applied() : -1, "), not step ", step,
                     "; take it before any rank contributes to the next step"));
  }
  return EncodeSession(key_, calculator_->ExportState(), create_time_, update_time_)
      .SerializeAsString();
}

absl::Status Session::Resume(int64_t next_step, absl::string_view checkpoint) {
  Touch();
  if (next_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("next_step: ", next_step, " is negative; steps start at 0"));
  }
  std::unique_ptr<StatefulQParamsCalculatorBase> restored;
  if (!checkpoint.empty()) {
    storage::v1::SessionState record;
    if (!record.ParseFromArray(checkpoint.data(), static_cast<int>(checkpoint.size()))) {
      return absl::InvalidArgumentError("checkpoint: not a session checkpoint's bytes");
    }
    absl::StatusOr<DecodedSession> decoded = DecodeSession(record);
    if (!decoded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", decoded.status().message()));
    }
    if (decoded->key.name != key_.name) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: it is session ", decoded->key.name, "'s, not ", key_.name, "'s"));
    }
    restored = std::move(decoded->calculator);
  }
  absl::MutexLock lock(&mu_);
  QPARAMS_RETURN_IF_ERROR(CheckLive());
  if (AsHistogram(*calculator_) != nullptr || calculator_->export_mode()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", key_.name, " takes no steps (a ", calculator_->key(),
                     calculator_->export_mode() ? " session in export mode)" : " session)"));
  }
  CalculatorState current = calculator_->ExportState();
  if (restored == nullptr) {
    // The session's own calculator, as its creation left it.
    current.initialized = false;
    current.observation_count = 0;
    current.qparams = QParams::Empty(current.qparams.has_zero_point, current.qparams.has_minval);
    current.running.reset();
    current.last_range.reset();
    QPARAMS_ASSIGN_OR_RETURN(restored, CreateStatefulFromState(current));
  } else {
    const CalculatorState theirs = restored->ExportState();
    if (theirs.calculator != current.calculator || !(theirs.spec == current.spec) ||
        theirs.averaging_constant != current.averaging_constant) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint: session ", key_.name, " was a ", theirs.calculator,
                       " session of another spec or averaging constant than it is now"));
    }
  }
  StepState state;
  state.last_applied = next_step - 1;
  if (next_step > 0) state.applied.push_back({next_step - 1, restored->GetQParams()});
  if (steps_.has_value()) {
    for (const IncompleteStep& s : steps_->incomplete()) {
      if (s.step < next_step) state.incomplete.push_back(s);
    }
  }
  QPARAMS_ASSIGN_OR_RETURN(StepMerge next_steps, StepMerge::FromState(std::move(state)));
  return CommitSteps(std::move(restored), std::move(next_steps));
}

absl::Status Session::Retire(const std::function<absl::Status()>& leave, absl::Status gone) {
  absl::MutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  QPARAMS_RETURN_IF_ERROR(leave());
  gone_ = std::move(gone);
  steps_applied_.SignalAll();  // readers waiting for a step learn it is gone
  return absl::OkStatus();
}

}  // namespace qparams
