// The power-of-two histogram of |x| that the percentile, entropy and mse calculators
// keep (histogram.md §2–§3): bin k of exponent e counts the finite x with
// k·2^e <= |x| < (k+1)·2^e, the exponent is a function of the largest magnitude, and
// counts are integers, so binning, coarsening and merging are exact and the state
// depends only on the multiset of observed values.

#ifndef QPARAMS_CORE_HISTOGRAM_H_
#define QPARAMS_CORE_HISTOGRAM_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace qparams {

// What an observation's NaN, +Inf and -Inf do (histogram.md §5.3).
enum class NonFinitePolicy {
  kReject,  // the observation is INVALID_ARGUMENT (the default)
  kIgnore,  // counted in the side counts; nothing else changes
};

// "reject", "ignore".
absl::string_view NonFinitePolicyName(NonFinitePolicy policy);
// Parses a NonFinitePolicyName. INVALID_ARGUMENT naming the allowed values otherwise.
absl::StatusOr<NonFinitePolicy> ParseNonFinitePolicy(absl::string_view name);

// The smallest bin exponent: that of all-zero data and of a histogram with no finite value.
inline constexpr int kMinBinExponent = -126;
// A histogram (and a session) holds fewer values than this, finite plus counted
// non-finite (§5.4): every sum then fits int64 and a percentile rank 128 bits.
inline constexpr uint64_t kHistogramValueLimit = uint64_t{1} << 62;
// Magnitudes must stay below this (2^128): beyond it no float32 bin edge exists.
inline constexpr double kHistogramMagnitudeLimit = 0x1.0p128;

// canonical_exponent(amax, N) (§2.2): the smallest e >= -126 with amax < N·2^e.
// `amax` must be finite, >= 0 and below 2^128; `num_bins` a power of two.
int CanonicalExponent(double amax, int num_bins);

// The number of occupied bins M = floor(amax·2^-e) + 1 for the canonical exponent e
// of `amax` (bin M-1 holds amax).
int64_t OccupiedBins(double amax, int num_bins);

// A histogram as the wire's HistogramObservation carries it: a client's payload (any
// length up to num_bins, trailing bins may be omitted or empty, a zero extreme may
// be -0.0) or a session's state, which is canonical: exactly M counts (none before a
// finite value), exponent canonical, zero extrema +0.0.
struct Histogram {
  int num_bins = 0;
  int exponent = kMinBinExponent;
  std::vector<uint64_t> counts;  // bins 0 .. L-1; missing bins are 0
  uint64_t zero_count = 0;       // +0 and -0, also counted in counts[0]
  uint64_t negative_count = 0;   // finite x < 0 (-0 is not negative)
  uint64_t nan_count = 0;
  uint64_t posinf_count = 0;
  uint64_t neginf_count = 0;
  std::optional<double> min;  // the finite extrema, exactly; unset before a finite value
  std::optional<double> max;

  // An empty canonical histogram: no values, exponent -126.
  static Histogram Empty(int num_bins);

  bool has_finite() const { return min.has_value(); }
  // max(|min|, |max|); +0.0 without a finite value.
  double amax() const;
  // M for amax() (0 without a finite value).
  int64_t occupied_bins() const;
  // Σ counts: the finite values. Only for a valid histogram (no overflow).
  uint64_t total() const;
  // total() plus the three non-finite counts.
  uint64_t value_count() const;

  // Every field, the extrema by their bits.
  friend bool operator==(const Histogram& a, const Histogram& b);
  friend bool operator!=(const Histogram& a, const Histogram& b) { return !(a == b); }
};

// Checks a received histogram against §3.2 for a session of `num_bins` bins and
// `policy`: INVALID_ARGUMENT naming the field and the rule (e.g. "histogram.exponent
// is -8; ... (rule 8.2)") for the first broken rule, else OK. Integer rules use exact
// (128-bit) sums.
absl::Status ValidateHistogram(const Histogram& histogram, int num_bins, NonFinitePolicy policy);

// Checks a histogram restored as a session's state: the rules of ValidateHistogram
// except that it may hold no value, plus the canonical form (exactly M counts, zero
// extrema +0.0). INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateHistogramState(const Histogram& histogram, int num_bins,
                                    NonFinitePolicy policy);

// coarsen (§2.4): `histogram` (valid) re-binned at `exponent` >= its own, bin k moving
// to k >> d; the counts keep every bin up to the last non-empty one.
Histogram Coarsen(const Histogram& histogram, int exponent);

// merge (§2.4) of two valid histograms: the canonical histogram of the union of their
// multisets, whatever the order of the operands. INVALID_ARGUMENT if num_bins differ;
// RESOURCE_EXHAUSTED if the union would hold 2^62 values or more (§5.4).
absl::StatusOr<Histogram> Merge(const Histogram& a, const Histogram& b);

// bin (§2.3): the canonical histogram of `x` with `num_bins` bins, exact for every
// dtype (float16, bfloat16 and float32 values are scaled in float32, float64 values in
// float64, both exact). Runs on RangeThreadsFor(elements) OpenMP threads with a
// partial histogram per thread: the result does not depend on the thread count.
// INVALID_ARGUMENT for a tensor with no elements, a NaN or infinity under kReject,
// or a float64 |x| >= 2^128.
absl::StatusOr<Histogram> BinTensor(const TensorView& x, int num_bins, NonFinitePolicy policy);

}  // namespace qparams

#endif  // QPARAMS_CORE_HISTOGRAM_H_
