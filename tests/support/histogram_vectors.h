// Reads the histogram conformance vectors (shared/conformance/HISTOGRAM-FORMAT.md)
// into plain values, with the JSON reading of conformance_vectors.h.

#ifndef QPARAMS_TESTS_HISTOGRAM_VECTORS_H_
#define QPARAMS_TESTS_HISTOGRAM_VECTORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/granularity.h"
#include "core/histogram.h"
#include "core/histogram_params.h"
#include "core/quant_spec.h"
#include "core/tensor.h"
#include "tests/support/conformance_vectors.h"

namespace qparams::testing {

// The calibration keys of an expect, beside its qparams keys.
struct ExpectedCalibration {
  std::optional<uint64_t> amax_bits;  // null before a finite value
  std::optional<int64_t> bin_index;
  int exponent = kMinBinExponent;
  uint64_t total_count = 0;
};

struct HistogramStep {
  enum class Op {
    kForward,
    kObserveHistogram,
    kGetQParams,
    kGetHistogram,
    kSetExportMode,
    kSetGranularity
  };
  Op op = Op::kForward;
  Tensor input;             // forward
  Histogram histogram;      // observe_histogram
  bool enabled = false;     // set_export_mode
  Granularity granularity;  // set_granularity
  std::optional<ExpectedQParams> expect;
  std::optional<ExpectedCalibration> expect_calibration;
  std::optional<Histogram> expect_histogram;  // get_histogram
  std::optional<absl::StatusCode> expect_error;
  std::string rule;  // informative
};

struct HistogramCase {
  std::string id;
  std::string calculator;
  QuantSpec spec;
  // The "histogram" key: unset when absent or null ({} is set, with every default).
  std::optional<HistogramParams> params;
  // Its "nonfinite" as written: the harness parses it, since an unknown name is a
  // construction error of the case.
  std::optional<std::string> nonfinite;
  std::string group;  // "" outside a group
  std::optional<absl::StatusCode> construct_error;
  std::vector<HistogramStep> steps;
};

// $QPARAMS_HISTOGRAM_VECTORS if set, else the copy in the repo.
std::string HistogramVectorsPath();

// Parses every line of a histogram vectors file. INVALID_ARGUMENT naming the line for
// anything that is not a well-formed case.
absl::StatusOr<std::vector<HistogramCase>> LoadHistogramVectors(const std::string& path);

// A HistogramObservation in its JSON form (dense or sparse counts, hex extrema).
absl::StatusOr<Histogram> ParseHistogram(const google::protobuf::Struct& h);

// "" if `actual` equals `expected` in every field (extrema by bits), else the first
// difference.
std::string HistogramDifference(const Histogram& expected, const Histogram& actual);

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_HISTOGRAM_VECTORS_H_
