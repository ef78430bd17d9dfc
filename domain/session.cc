#include "domain/session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/histogram_calculator.h"
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

}  // namespace

Session::Session(SessionKey key, std::unique_ptr<StatefulQParamsCalculatorBase> calculator,
                 SessionLog& log, absl::Time create_time, absl::Time update_time,
                 DedupeWindow dedupe)
    : key_(std::move(key)),
      create_time_(create_time),
      log_(log),
      last_access_ns_(absl::ToUnixNanos(absl::Now())),
      calculator_(std::move(calculator)),
      update_time_(update_time),
      dedupe_(std::move(dedupe)) {}

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
                                          next_dedupe ? *next_dedupe : dedupe_));
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
  return info;
}

storage::v1::SessionState Session::Record() const {
  absl::ReaderMutexLock lock(&mu_);
  return EncodeSession(key_, calculator_->ExportState(), create_time_, update_time_, dedupe_);
}

absl::Status Session::Retire(const std::function<absl::Status()>& leave, absl::Status gone) {
  absl::MutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  QPARAMS_RETURN_IF_ERROR(leave());
  gone_ = std::move(gone);
  return absl::OkStatus();
}

}  // namespace qparams
