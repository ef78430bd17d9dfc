// The constructor parameters of the histogram calculators (histogram.md §4): the
// wire's HistogramParams, and the rules that validate them and fill in defaults.

#ifndef QPARAMS_CORE_HISTOGRAM_PARAMS_H_
#define QPARAMS_CORE_HISTOGRAM_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/histogram.h"

namespace qparams {

// A parameter left unset takes its default; a set one is validated, and one that does
// not belong to the calculator must be unset.
struct HistogramParams {
  static constexpr int kDefaultNumBins = 4096;
  static constexpr double kDefaultPercentile = 99.99;
  static constexpr int kDefaultStartBin = 128;
  static constexpr int kDefaultStride = 1;

  std::optional<int> num_bins;      // all three: a power of two in [256, 65536]
  std::optional<double> percentile;  // percentile only: finite, 0 < P <= 100
  std::optional<int> start_bin;     // entropy, mse only: [1, num_bins]
  std::optional<int> stride;        // entropy, mse only: [1, num_bins]
  bool skip_zeros = false;
  NonFinitePolicy nonfinite = NonFinitePolicy::kReject;

  // The parameters of calculator `key` ("percentile", "entropy" or "mse") with every
  // default filled in: num_bins always, percentile for percentile, start_bin and stride
  // for entropy and mse. INVALID_ARGUMENT naming the field and the rule otherwise.
  // Resolving resolved parameters returns them unchanged.
  absl::StatusOr<HistogramParams> Resolve(absl::string_view key) const;

  // "num_bins=4096, percentile=99.99, skip_zeros=False, nonfinite=reject": the set fields.
  std::string ToString() const;

  friend bool operator==(const HistogramParams& a, const HistogramParams& b);
  friend bool operator!=(const HistogramParams& a, const HistogramParams& b) { return !(a == b); }
};

// Whether `key` names one of the histogram calculators.
bool IsHistogramCalculator(absl::string_view key);

}  // namespace qparams

#endif  // QPARAMS_CORE_HISTOGRAM_PARAMS_H_
