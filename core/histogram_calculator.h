// The histogram calculators percentile, entropy and mse (histogram.md): stateful,
// per-tensor, keeping a power-of-two histogram of |x| (histogram.h) that tensor and
// histogram observations merge into exactly, and choosing an amax from it by a search
// (calibration.h), then the qparams of that amax.
//
// The search is the expensive part (entropy at the defaults is about 8 million
// calls of log), so it never runs on an observation: Observe only bins and merges,
// and the result is computed when qparams or the calibration are asked for, then
// cached until the histogram changes. Forward, which returns qparams, is Observe
// followed by GetQParams.
//
// Thread safety: as for every calculator, mutations (Observe, Forward, SetExportMode,
// SetGranularity) need exclusive access. The const accessors may run concurrently
// with each other (a reader lock suffices): the lazy search runs under an internal
// mutex, and the references they return stay valid until the next mutation.

#ifndef QPARAMS_CORE_HISTOGRAM_CALCULATOR_H_
#define QPARAMS_CORE_HISTOGRAM_CALCULATOR_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/calculator_state.h"
#include "core/calibration.h"
#include "core/histogram.h"
#include "core/histogram_params.h"
#include "core/observation.h"
#include "core/qparams_calculator.h"
#include "core/quant_spec.h"

namespace qparams {

class HistogramQParamsCalculator : public StatefulQParamsCalculatorBase {
 public:
  // Builds the calculator of `key` ("percentile", "entropy" or "mse") from a resolved
  // spec (QuantSpec::Resolve) and its parameters, which it resolves. INVALID_ARGUMENT
  // for a parameter out of range or not for this calculator (HistogramParams::Resolve),
  // a granularity other than per-tensor, a float_range bound, a floating-point dtype
  // with entropy or mse, or another key.
  static absl::StatusOr<std::unique_ptr<HistogramQParamsCalculator>> Create(
      absl::string_view key, QuantSpec resolved_spec, const HistogramParams& params);

  // Observe without qparams (an observation sent with omit_qparams): checks the
  // observation and merges it into the histogram; runs no search. In export mode it
  // does nothing and reads nothing of the payload (a cached observation). Errors,
  // each leaving the calculator unchanged:
  //   INVALID_ARGUMENT: a range observation (even in export mode); a tensor with no
  //     elements, a NaN or infinity under nonfinite=reject, or a float64 |x| >= 2^128;
  //     a histogram breaking a rule of histogram.md §3.2 (the message names the rule);
  //   RESOURCE_EXHAUSTED: a valid observation that would bring the histogram to 2^62
  //     values or more.
  // A successful computing observation counts in observation_count(); the input
  // dtype may change from one observation to the next.
  absl::Status Observe(const Observation& x);

  // Observe, then GetQParams (which runs the search if the histogram changed).
  absl::StatusOr<QParams> Forward(const Observation& x) override;

  // The qparams of the current histogram (histogram.md §7): shape [1], precision
  // float32; empty (shape [0]) while the histogram holds no finite value. Runs the
  // search if the histogram changed since the last call.
  const QParams& GetQParams() const override;
  // The search's result beside the qparams (same caching); unset while the histogram
  // holds no finite value.
  std::optional<CalibrationResult> calibration() const;

  // The histogram (canonical: exactly M counts, zero extrema +0.0), the wire's
  // GetHistogram. Cheap: no search.
  const Histogram& histogram() const { return histogram_; }
  // The resolved parameters (defaults filled in).
  const HistogramParams& params() const { return params_; }

  // Before the first finite value, per_tensor is accepted (no change) and any other
  // granularity is INVALID_ARGUMENT; after it, FAILED_PRECONDITION.
  absl::Status SetGranularity(const Granularity& granularity) override;

  // The parameters and the histogram, no search: cheap enough for every journaled
  // mutation. The buffers are exported empty (the qparams are derived).
  CalculatorState ExportState() const override;
  // The parameters and histogram summary; runs no search.
  std::string Description() const override;

 protected:
  HistogramQParamsCalculator(QuantSpec resolved_spec, HistogramParams params);
  HistogramQParamsCalculator(const HistogramQParamsCalculator& other);

  // The method's search over `histogram` (holding a finite value).
  virtual CalibrationResult Calibrate(const Histogram& histogram) const = 0;
  // Whether the grid is [0, amax]: an asymmetric scheme that saw no negative value.
  bool nonnegative() const;

  bool keeps_buffers() const final { return false; }
  // Restores the histogram and parameters; INVALID_ARGUMENT for a histogram that is
  // not a canonical state of these parameters (ValidateHistogramState), or flags that
  // disagree with it.
  absl::Status RestoreState(const CalculatorState& state) override;

  HistogramParams params_;

 private:
  struct Result {
    QParams qparams;
    CalibrationResult calibration;
  };
  // The cached result of the current histogram, computing it if needed. Null while
  // the histogram holds no finite value.
  std::shared_ptr<const Result> CachedResult() const;

  Histogram histogram_;
  mutable absl::Mutex mu_;
  // Immutable once built; replaced (never changed) when the histogram changes, so a
  // reference into it lives until the next mutation.
  mutable std::shared_ptr<const Result> result_ ABSL_GUARDED_BY(mu_);
};

// The three kinds. Their constructors take resolved parameters and spec as they are;
// build them through HistogramQParamsCalculator::Create or the registry, which check.

// percentile (§6.2): the left edge of the bin where the cumulative count reaches P%.
class PercentileQParamsCalculator final : public HistogramQParamsCalculator {
 public:
  PercentileQParamsCalculator(QuantSpec resolved_spec, HistogramParams resolved_params)
      : HistogramQParamsCalculator(std::move(resolved_spec), std::move(resolved_params)) {}
  absl::string_view key() const override { return "percentile"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override {
    return std::unique_ptr<PercentileQParamsCalculator>(new PercentileQParamsCalculator(*this));
  }

 protected:
  CalibrationResult Calibrate(const Histogram& histogram) const override;

 private:
  PercentileQParamsCalculator(const PercentileQParamsCalculator&) = default;
};

// entropy (§6.3): the clipping that minimizes the KL divergence of the quantized
// distribution (TensorRT's and ModelOpt's calibration, with fixed arithmetic).
class EntropyQParamsCalculator final : public HistogramQParamsCalculator {
 public:
  EntropyQParamsCalculator(QuantSpec resolved_spec, HistogramParams resolved_params)
      : HistogramQParamsCalculator(std::move(resolved_spec), std::move(resolved_params)) {}
  absl::string_view key() const override { return "entropy"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override {
    return std::unique_ptr<EntropyQParamsCalculator>(new EntropyQParamsCalculator(*this));
  }

 protected:
  CalibrationResult Calibrate(const Histogram& histogram) const override;

 private:
  EntropyQParamsCalculator(const EntropyQParamsCalculator&) = default;
};

// mse (§6.4): the bin center whose qparams fake-quantize the histogram with the least
// squared error, on the session's own quantization grid.
class MseQParamsCalculator final : public HistogramQParamsCalculator {
 public:
  MseQParamsCalculator(QuantSpec resolved_spec, HistogramParams resolved_params)
      : HistogramQParamsCalculator(std::move(resolved_spec), std::move(resolved_params)) {}
  absl::string_view key() const override { return "mse"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override {
    return std::unique_ptr<MseQParamsCalculator>(new MseQParamsCalculator(*this));
  }

 protected:
  CalibrationResult Calibrate(const Histogram& histogram) const override;

 private:
  MseQParamsCalculator(const MseQParamsCalculator&) = default;
};

}  // namespace qparams

#endif  // QPARAMS_CORE_HISTOGRAM_CALCULATOR_H_
