#include "core/histogram_params.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qparams {
namespace {

absl::Status Unset(absl::string_view field, bool set, absl::string_view key,
                   absl::string_view owners) {
  if (!set) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("histogram.", field, " is for ", owners,
                                                 " only; leave it unset for ", key));
}

absl::Status InRange(absl::string_view field, int v, int lo, int hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("histogram.", field, " is ", v, "; it must be in [", lo, ", ", hi, "]"));
}

}  // namespace

bool IsHistogramCalculator(absl::string_view key) {
  return key == "percentile" || key == "entropy" || key == "mse";
}

absl::StatusOr<HistogramParams> HistogramParams::Resolve(absl::string_view key) const {
  if (!IsHistogramCalculator(key)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "histogram parameters are for percentile, entropy and mse only; leave them unset for ",
        key));
  }
  HistogramParams r = *this;
  r.num_bins = num_bins.value_or(kDefaultNumBins);
  const int n = *r.num_bins;
  if (n < 256 || n > 65536 || (n & (n - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "histogram.num_bins is ", n, "; it must be a power of two in [256, 65536]"));
  }
  if (key == "percentile") {
    if (absl::Status s = Unset("start_bin", start_bin.has_value(), key, "entropy and mse");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Unset("stride", stride.has_value(), key, "entropy and mse"); !s.ok()) {
      return s;
    }
    r.percentile = percentile.value_or(kDefaultPercentile);
    if (!(std::isfinite(*r.percentile) && *r.percentile > 0 && *r.percentile <= 100)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram.percentile is ", *r.percentile, "; it must be finite with 0 < P <= 100"));
    }
    return r;
  }
  if (absl::Status s = Unset("percentile", percentile.has_value(), key, "percentile"); !s.ok()) {
    return s;
  }
  r.start_bin = start_bin.value_or(kDefaultStartBin);
  r.stride = stride.value_or(kDefaultStride);
  if (absl::Status s = InRange("start_bin", *r.start_bin, 1, n); !s.ok()) return s;
  if (absl::Status s = InRange("stride", *r.stride, 1, n); !s.ok()) return s;
  return r;
}

std::string HistogramParams::ToString() const {
  std::string out;
  auto add = [&out](absl::string_view field, const auto& value) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", field, "=", value);
  };
  if (num_bins) add("num_bins", *num_bins);
  if (percentile) add("percentile", *percentile);
  if (start_bin) add("start_bin", *start_bin);
  if (stride) add("stride", *stride);
  add("skip_zeros", skip_zeros ? "True" : "False");
  add("nonfinite", NonFinitePolicyName(nonfinite));
  return out;
}

bool operator==(const HistogramParams& a, const HistogramParams& b) {
  return a.num_bins == b.num_bins && a.percentile == b.percentile &&
         a.start_bin == b.start_bin && a.stride == b.stride && a.skip_zeros == b.skip_zeros &&
         a.nonfinite == b.nonfinite;
}

}  // namespace qparams
