// The three searches that choose a clipping amax from a histogram of |x|
// (histogram.md §6) and the qparams of an amax (§7). Each is a deterministic function
// of the histogram, bit for bit: integer ranks, float64 KL divergences with the C
// library's log summed in bin order, and torch's float32 fake-quant arithmetic.
// Compiled with -ffp-contract=off (no fused multiply-add).

#ifndef QPARAMS_CORE_CALIBRATION_H_
#define QPARAMS_CORE_CALIBRATION_H_

#include <cstdint>
#include <optional>

#include "core/histogram.h"
#include "core/qparams.h"

namespace qparams {

// A search's result (the wire's CalibrationResult, §10).
struct CalibrationResult {
  double amax = 0;        // the chosen clipping magnitude
  int64_t bin_index = 0;  // percentile: k (amax = k·2^e); entropy: bins kept i
                          // (amax = i·2^e); mse: the bin whose center is amax
  int exponent = kMinBinExponent;
  uint64_t total_count = 0;         // the finite values observed (zeros included)
  std::optional<double> kl_margin;  // entropy only (§6.3), informative

  friend bool operator==(const CalibrationResult& a, const CalibrationResult& b);
};

// The candidate grid of entropy and mse: i = start_bin, start_bin + stride, ...
struct SearchGrid {
  int64_t start_bin = 128;
  int64_t stride = 1;
};

// The histograms below are a session's: valid and with a finite value (counts may be
// shorter than M; missing bins are 0). `skip_zeros` leaves exact zeros out (§6.1).

// percentile (§6.2) with 0 < percentile <= 100: the left edge of the first bin whose
// cumulative count reaches ceil(P·T/100), P read as its shortest decimal string.
CalibrationResult PercentileCalibration(const Histogram& histogram, double percentile,
                                        bool skip_zeros);

// entropy (§6.3): the largest candidate whose KL divergence is within 2^-30 (relative)
// of the smallest, for a grid of `levels` quantization levels (2^(bits-1+u)). The
// candidates run on RangeThreadsFor OpenMP threads; each divergence is summed
// sequentially, so the result does not depend on the thread count.
CalibrationResult EntropyCalibration(const Histogram& histogram, const SearchGrid& grid,
                                     bool skip_zeros, int64_t levels);

// mse (§6.4): the first candidate bin center whose fake-quantization error over the
// bin centers is smallest, with the qparams `recipe` gives that center
// (QParamsFromAmax) on the grid [qmin, qmax] of the recipe. Parallel over candidates
// as EntropyCalibration.
CalibrationResult MseCalibration(const Histogram& histogram, const SearchGrid& grid,
                                 bool skip_zeros, const QParamsRecipe& recipe,
                                 bool nonnegative);

// The qparams of [-amax, amax], or of [0, amax] when `nonnegative` (an asymmetric
// scheme that saw no negative value), by the formulas of semantics.md for a float32
// range (§7); an amax that is not a float32 value (float64 data with percentile 100,
// an entropy edge of 2^128) is handled in float64 with scale and minval rounded to
// float32 at the end (§8). Shape [1], precision float32.
QParams QParamsFromAmax(const QParamsRecipe& recipe, double amax, bool nonnegative);

}  // namespace qparams

#endif  // QPARAMS_CORE_CALIBRATION_H_
