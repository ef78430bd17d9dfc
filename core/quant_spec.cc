#include "core/quant_spec.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/nvfp4.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

// The quant range for the dtype and scheme when the spec gives none (§4.2, §4.3).
std::pair<double, double> DerivedQuantRange(const QuantDType& dtype, QScheme qscheme) {
  double qmin = dtype.min_value();
  const double qmax = dtype.max_value();
  if (qscheme == QScheme::kSymmetricWithClipping && dtype.kind == QuantDType::Kind::kSignedInt) {
    qmin = -qmax;
  }
  return {qmin, qmax};
}

absl::Status ValidateQuantRange(const QuantDType& dtype, double qmin, double qmax) {
  if (dtype.is_floating_point()) {
    if (qmin != dtype.min_value() || qmax != dtype.max_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.quant_min/quant_max: ", dtype.name, " only accepts its own range [",
                       dtype.min_value(), ", ", dtype.max_value(), "]; leave both unset"));
    }
    return absl::OkStatus();
  }
  for (auto [field, v] : {std::pair{"quant_min", qmin}, std::pair{"quant_max", qmax}}) {
    if (!std::isfinite(v) || v != std::trunc(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.", field, " is ", v, "; it must be an integer"));
    }
  }
  if (qmin < dtype.min_value() || qmax > dtype.max_value() || qmin >= qmax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.quant_min/quant_max [", qmin, ", ", qmax, "] must satisfy ", dtype.min_value(),
        " <= quant_min < quant_max <= ", dtype.max_value(), " for ", dtype.name));
  }
  return absl::OkStatus();
}

absl::Status ValidateFloatRange(const FloatRange& range) {
  for (auto [field, v] : {std::pair{"min", range.min}, std::pair{"max", range.max}}) {
    if (v.has_value() && !std::isfinite(*v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.float_range.", field, " is ", *v, "; bounds must be finite"));
    }
  }
  if (range.min.has_value() && *range.min > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.float_range.min is ", *range.min, "; it must be <= 0"));
  }
  if (range.max.has_value() && *range.max < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.float_range.max is ", *range.max, "; it must be >= 0"));
  }
  if (range.frozen() && *range.min >= *range.max) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.float_range [", *range.min, ", ", *range.max, "] must have min < max"));
  }
  return absl::OkStatus();
}

// The NVFP4 rules of nvfp4.md §2 on `spec`, whose scale_dtype `resolved` already
// holds canonically; names the convention in `resolved`.
absl::Status ResolveNvfp4(const QuantSpec& spec, const QuantDType& dtype, QuantSpec& resolved) {
  if (!resolved.nvfp4_scale()) {
    if (!spec.convention.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("spec.convention is \"", spec.convention,
                                                     "\"; a convention requires scale_dtype "
                                                     "\"float8_e4m3fn\" (the NVFP4 scales), not \"",
                                                     spec.scale_dtype, "\""));
    }
    return absl::OkStatus();
  }
  if (dtype.name != "float4_e2m1fn_x2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.scale_dtype: float8_e4m3fn requires dtype float4_e2m1fn_x2, not ", dtype.name));
  }
  if (spec.granularity.kind() != Granularity::Kind::kPerBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.granularity is ", spec.granularity.ToString(),
                     "; scale_dtype float8_e4m3fn requires per_block (NVFP4 block scales)"));
  }
  absl::StatusOr<Nvfp4Convention> convention = ParseNvfp4Convention(spec.convention);
  if (!convention.ok()) return convention.status();
  resolved.convention = std::string(Nvfp4ConventionName(*convention));
  return absl::OkStatus();
}

}  // namespace

absl::string_view QSchemeName(QScheme qscheme) {
  switch (qscheme) {
    case QScheme::kSymmetric:
      return "symmetric";
    case QScheme::kAsymmetric:
      return "asymmetric";
    case QScheme::kSymmetricWithClipping:
      return "symmetric_with_clipping";
  }
  return "?";
}

absl::StatusOr<QScheme> ParseQScheme(absl::string_view name) {
  for (QScheme q : {QScheme::kSymmetric, QScheme::kAsymmetric, QScheme::kSymmetricWithClipping}) {
    if (name == QSchemeName(q)) return q;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("spec.qscheme: unknown quantization scheme \"", name,
                   "\"; allowed: symmetric, asymmetric, symmetric_with_clipping"));
}

absl::StatusOr<QuantSpec> QuantSpec::Resolve() const {
  QuantSpec r = *this;
  absl::StatusOr<QuantDType> dt = ParseQuantDType(dtype);
  if (!dt.ok()) return dt.status();
  r.dtype = dt->name;

  if (dt->is_floating_point() && qscheme != QScheme::kSymmetric) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.qscheme: FP quantization (dtype ", dt->name,
                     ") requires symmetric quantization scheme, not ", QSchemeName(qscheme)));
  }

  if (scale_dtype.empty()) {
    r.scale_dtype = dt->name == "float4_e2m1fn_x2" ? std::string(kE8M0ScaleDType) : "";
  } else if (scale_dtype == kE8M0ScaleDType || scale_dtype == "float8_e8m0") {
    r.scale_dtype = std::string(kE8M0ScaleDType);
  } else if (scale_dtype == kE4M3ScaleDType) {
    r.scale_dtype = std::string(kE4M3ScaleDType);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.scale_dtype: \"", scale_dtype,
                     "\" is not supported; use \"\", \"float8_e8m0fnu\" (alias \"float8_e8m0\") "
                     "or \"float8_e4m3fn\""));
  }
  QPARAMS_RETURN_IF_ERROR(ResolveNvfp4(*this, *dt, r));
  if (r.e8m0_scale() && !dt->is_floating_point()) {
    if (dt->name != "int8") {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.scale_dtype: float8_e8m0fnu is supported for float8_e4m3fn, float8_e5m2, "
          "float4_e2m1fn_x2 and int8, not ",
          dt->name));
    }
    if (qscheme != QScheme::kSymmetric) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.qscheme: FP quantization or an e8m0 scale requires the symmetric scheme, not ",
          QSchemeName(qscheme)));
    }
  }

  if (quant_min.has_value() != quant_max.has_value()) {
    return absl::InvalidArgumentError(
        "spec.quant_min/quant_max: set both or neither (neither derives them from dtype and "
        "qscheme)");
  }
  if (!quant_min.has_value()) {
    auto [qmin, qmax] = DerivedQuantRange(*dt, qscheme);
    if (qmin >= qmax) {
      return absl::InvalidArgumentError(absl::StrCat("spec.qscheme: ", QSchemeName(qscheme),
                                                     " leaves ", dt->name, " the empty range [",
                                                     qmin, ", ", qmax, "]"));
    }
    r.quant_min = qmin;
    r.quant_max = qmax;
  } else if (absl::Status s = ValidateQuantRange(*dt, *quant_min, *quant_max); !s.ok()) {
    return s;
  }

  QPARAMS_RETURN_IF_ERROR(ValidateFloatRange(float_range));
  if (absl::Status s = granularity.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }

  if (range_calculator.empty() || range_calculator == "minmax") {
    r.range_calculator = "minmax";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("spec.range_calculator: unknown \"",
                                                   range_calculator, "\"; the only one is minmax"));
  }
  return r;
}

bool operator==(const QuantSpec& a, const QuantSpec& b) {
  return a.dtype == b.dtype && a.qscheme == b.qscheme && a.granularity == b.granularity &&
         a.target == b.target && a.quant_min == b.quant_min && a.quant_max == b.quant_max &&
         a.float_range.min == b.float_range.min && a.float_range.max == b.float_range.max &&
         a.scale_dtype == b.scale_dtype && a.range_calculator == b.range_calculator &&
         a.convention == b.convention;
}

}  // namespace qparams
