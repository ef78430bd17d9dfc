#include "core/histogram_calculator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace qparams {

absl::StatusOr<std::unique_ptr<HistogramQParamsCalculator>> HistogramQParamsCalculator::Create(
    absl::string_view key, QuantSpec resolved_spec, const HistogramParams& params) {
  QPARAMS_ASSIGN_OR_RETURN(HistogramParams resolved, params.Resolve(key));
  if (resolved_spec.granularity.kind() != Granularity::Kind::kPerTensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.granularity is ", resolved_spec.granularity.ToString(), "; ", key,
                     " keeps one histogram and is per_tensor only"));
  }
  if (!resolved_spec.float_range.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.float_range: ", key, " chooses its range from the histogram; leave both bounds unset"));
  }
  if (key != "percentile") {
    QPARAMS_ASSIGN_OR_RETURN(const QuantDType dtype, ParseQuantDType(resolved_spec.dtype));
    if (dtype.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.dtype is ", dtype.name, "; ", key, " needs an integer dtype (int1-int8, uint1-uint8)"));
    }
  }
  std::unique_ptr<HistogramQParamsCalculator> calculator;
  if (key == "percentile") {
    calculator = std::make_unique<PercentileQParamsCalculator>(std::move(resolved_spec), resolved);
  } else if (key == "entropy") {
    calculator = std::make_unique<EntropyQParamsCalculator>(std::move(resolved_spec), resolved);
  } else {
    calculator = std::make_unique<MseQParamsCalculator>(std::move(resolved_spec), resolved);
  }
  return calculator;
}

HistogramQParamsCalculator::HistogramQParamsCalculator(QuantSpec resolved_spec,
                                                       HistogramParams params)
    : StatefulQParamsCalculatorBase(std::move(resolved_spec)),
      params_(std::move(params)),
      histogram_(Histogram::Empty(params_.num_bins.value_or(HistogramParams::kDefaultNumBins))) {}

HistogramQParamsCalculator::HistogramQParamsCalculator(const HistogramQParamsCalculator& other)
    : StatefulQParamsCalculatorBase(other), params_(other.params_), histogram_(other.histogram_) {
  absl::MutexLock lock(&other.mu_);
  result_ = other.result_;  // immutable: the copy may share it
}

absl::Status HistogramQParamsCalculator::Observe(const Observation& x) {
  if (x.is_range()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a RangeObservation cannot feed ", key(),
        ": a block's min and max do not give its histogram; send the tensor or a "
        "HistogramObservation"));
  }
  if (export_mode()) return absl::OkStatus();  // cached: the payload is not read

  const int num_bins = histogram_.num_bins;
  absl::StatusOr<Histogram> merged;
  bool finite_added;
  if (const Histogram* h = x.histogram()) {
    QPARAMS_RETURN_IF_ERROR(ValidateHistogram(*h, num_bins, params_.nonfinite));
    merged = Merge(histogram_, *h);
    finite_added = h->has_finite();
  } else {
    QPARAMS_ASSIGN_OR_RETURN(const Histogram binned,
                             BinTensor(*x.tensor(), num_bins, params_.nonfinite));
    merged = Merge(histogram_, binned);
    finite_added = binned.has_finite();
  }
  if (!merged.ok()) return merged.status();

  histogram_ = *std::move(merged);
  initialized_ = histogram_.has_finite();
  CountObservation();
  if (finite_added) {  // non-finite values change no result (§5.3)
    absl::MutexLock lock(&mu_);
    result_.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<QParams> HistogramQParamsCalculator::Forward(const Observation& x) {
  QPARAMS_RETURN_IF_ERROR(Observe(x));
  return GetQParams();
}

std::shared_ptr<const HistogramQParamsCalculator::Result>
HistogramQParamsCalculator::CachedResult() const {
  if (!histogram_.has_finite()) return nullptr;
  absl::MutexLock lock(&mu_);
  if (result_ == nullptr) {
    auto result = std::make_shared<Result>();
    result->calibration = Calibrate(histogram_);
    result->qparams = QParamsFromAmax(recipe_, result->calibration.amax, nonnegative());
    result_ = std::move(result);
  }
  return result_;
}

const QParams& HistogramQParamsCalculator::GetQParams() const {
  const std::shared_ptr<const Result> result = CachedResult();
  // result_ keeps the Result alive until the next mutation.
  return result ? result->qparams : StatefulQParamsCalculatorBase::GetQParams();
}

std::optional<CalibrationResult> HistogramQParamsCalculator::calibration() const {
  const std::shared_ptr<const Result> result = CachedResult();
  if (result == nullptr) return std::nullopt;
  return result->calibration;
}

bool HistogramQParamsCalculator::nonnegative() const {
  return spec_.qscheme == QScheme::kAsymmetric && histogram_.negative_count == 0;
}

absl::Status HistogramQParamsCalculator::SetGranularity(const Granularity& granularity) {
  if (!initialized_) {
    QPARAMS_RETURN_IF_ERROR(granularity.Validate());
    if (granularity.kind() != Granularity::Kind::kPerTensor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "granularity ", granularity.ToString(), ": ", key(), " is per_tensor only"));
    }
  }
  return QParamsCalculatorBase::SetGranularity(granularity);
}

CalculatorState HistogramQParamsCalculator::ExportState() const {
  CalculatorState state = StatefulQParamsCalculatorBase::ExportState();
  state.histogram_params = params_;
  state.histogram = histogram_;
  return state;
}

absl::Status HistogramQParamsCalculator::RestoreState(const CalculatorState& state) {
  if (!state.histogram_params.has_value() || !state.histogram.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state.histogram: ", key(), " needs its parameters and its histogram"));
  }
  if (*state.histogram_params != params_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state.histogram_params {", state.histogram_params->ToString(),
        "} are not resolved parameters of ", key(), " (resolved: {", params_.ToString(), "})"));
  }
  const Histogram& h = *state.histogram;
  QPARAMS_RETURN_IF_ERROR(ValidateHistogramState(h, *params_.num_bins, params_.nonfinite));
  if (state.initialized != h.has_finite() ||
      state.compute_dtype_for_export != DType::kFloat32) {
    return absl::InvalidArgumentError(
        "state: a histogram calculator is initialized exactly when its histogram holds a "
        "finite value, and its compute_dtype_for_export is float32");
  }
  QPARAMS_RETURN_IF_ERROR(StatefulQParamsCalculatorBase::RestoreState(state));
  histogram_ = h;
  absl::MutexLock lock(&mu_);
  result_.reset();
  return absl::OkStatus();
}

std::string HistogramQParamsCalculator::Description() const {
  return absl::StrCat(params_.ToString(), "\nexponent=", histogram_.exponent,
                      ", total_count=", histogram_.total(), ", non_finite=",
                      histogram_.nan_count + histogram_.posinf_count + histogram_.neginf_count,
                      ", export_mode=", export_mode() ? "True" : "False");
}

CalibrationResult PercentileQParamsCalculator::Calibrate(const Histogram& histogram) const {
  return PercentileCalibration(histogram, *params_.percentile, params_.skip_zeros);
}

CalibrationResult EntropyQParamsCalculator::Calibrate(const Histogram& histogram) const {
  // Levels L = 2^(bits - 1 + u), u = 1 on a [0, amax] grid; Create checked the dtype.
  const absl::StatusOr<QuantDType> dtype = ParseQuantDType(spec_.dtype);
  const int bits = dtype.ok() ? dtype->bits : 8;
  const int64_t levels = int64_t{1} << (bits - 1 + (nonnegative() ? 1 : 0));
  return EntropyCalibration(histogram, {*params_.start_bin, *params_.stride},
                            params_.skip_zeros, levels);
}

CalibrationResult MseQParamsCalculator::Calibrate(const Histogram& histogram) const {
  return MseCalibration(histogram, {*params_.start_bin, *params_.stride}, params_.skip_zeros,
                        recipe_, nonnegative());
}

}  // namespace qparams
