#include "server/session.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace qparams {
namespace {

// Running buffers hold values of the working precision; float64 ones are returned
// rounded to float32, as the upstream float32 buffers hold them.
std::vector<float> ToFloats(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

}  // namespace

Session::Session(std::string name, std::unique_ptr<StatefulQParamsCalculatorBase> calculator)
    : name_(std::move(name)),
      create_time_(absl::Now()),
      calculator_(std::move(calculator)),
      update_time_(create_time_) {}

absl::Status Session::CheckLive() const {
  if (!deleted_) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("session \"", name_, "\" was deleted"));
}

absl::StatusOr<ObserveResult> Session::Observe(const Observation& x) {
  absl::MutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  absl::StatusOr<QParams> qparams = calculator_->Forward(x);
  if (!qparams.ok()) return qparams.status();
  update_time_ = absl::Now();
  return ObserveResult{*std::move(qparams), calculator_->observation_count()};
}

absl::Status Session::SetExportMode(bool enabled) {
  absl::MutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  if (absl::Status s = calculator_->SetExportMode(enabled); !s.ok()) return s;
  update_time_ = absl::Now();
  return absl::OkStatus();
}

absl::Status Session::SetGranularity(const Granularity& granularity) {
  absl::MutexLock lock(&mu_);
  if (absl::Status live = CheckLive(); !live.ok()) return live;
  if (absl::Status s = calculator_->SetGranularity(granularity); !s.ok()) return s;
  update_time_ = absl::Now();
  return absl::OkStatus();
}

std::pair<QParams, bool> Session::GetQParams() const {
  absl::ReaderMutexLock lock(&mu_);
  return {calculator_->GetQParams(), calculator_->initialized()};
}

int64_t Session::observation_count() const {
  absl::ReaderMutexLock lock(&mu_);
  return calculator_->observation_count();
}

SessionInfo Session::Info() const {
  absl::ReaderMutexLock lock(&mu_);
  const StatefulQParamsCalculatorBase& c = *calculator_;
  SessionInfo info;
  info.name = name_;
  info.calculator = std::string(c.key());
  info.spec = c.spec();
  if (auto* ma = dynamic_cast<const MovingAverageQParamsCalculator*>(&c)) {
    info.averaging_constant = ma->averaging_constant();
  }
  info.initialized = c.initialized();
  info.export_mode = c.export_mode();
  info.observation_count = c.observation_count();
  info.qparams = c.GetQParams();
  if (auto* running = dynamic_cast<const RunningRangeQParamsCalculator*>(&c)) {
    info.running_min = ToFloats(running->running_range().lo);
    info.running_max = ToFloats(running->running_range().hi);
  }
  if (c.initialized()) info.input_dtype = c.compute_dtype_for_export();
  info.create_time = create_time_;
  info.update_time = update_time_;
  info.description = c.Description();
  return info;
}

void Session::MarkDeleted() {
  absl::MutexLock lock(&mu_);
  deleted_ = true;
}

}  // namespace qparams
