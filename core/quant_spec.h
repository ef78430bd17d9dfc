// The quantization spec a calculator is built from, and the rules that validate it
// and fill in its defaults (semantics.md §4).

#ifndef QPARAMS_CORE_QUANT_SPEC_H_
#define QPARAMS_CORE_QUANT_SPEC_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/granularity.h"

namespace qparams {

// SYMMETRIC_WITH_CLIPPING is SYMMETRIC with quant_min := -quant_max for signed dtypes.
enum class QScheme { kSymmetric, kAsymmetric, kSymmetricWithClipping };

// "symmetric", "asymmetric", "symmetric_with_clipping".
absl::string_view QSchemeName(QScheme qscheme);

// Parses a QSchemeName. INVALID_ARGUMENT ("unknown quantization scheme") otherwise.
absl::StatusOr<QScheme> ParseQScheme(absl::string_view name);

// Fixed bounds of the range; an unset bound is observed.
struct FloatRange {
  std::optional<double> min;
  std::optional<double> max;

  // Both bounds set: the range never depends on the data (the frozen-range shortcut).
  bool frozen() const { return min.has_value() && max.has_value(); }
  bool empty() const { return !min.has_value() && !max.has_value(); }
};

// The canonical name of the power-of-two scale dtype.
inline constexpr absl::string_view kE8M0ScaleDType = "float8_e8m0fnu";
// The NVFP4 block scale dtype (nvfp4.md §2), spelled only so.
inline constexpr absl::string_view kE4M3ScaleDType = "float8_e4m3fn";

struct QuantSpec {
  std::string dtype = "int8";
  QScheme qscheme = QScheme::kSymmetric;
  Granularity granularity;
  Target target = Target::kWeight;
  std::optional<double> quant_min;  // both or neither; unset = derived
  std::optional<double> quant_max;
  FloatRange float_range;
  std::string scale_dtype;       // "", "float8_e8m0fnu" (alias "float8_e8m0") or "float8_e4m3fn"
  std::string range_calculator;  // "" or "minmax"
  // NVFP4 only: "" (= "compressed_tensors"), "compressed_tensors" or "modelopt".
  std::string convention;

  // Validates the spec and returns it with every default filled in: the canonical
  // dtype name, quant_min/quant_max derived (SYMMETRIC_WITH_CLIPPING applied),
  // scale_dtype "float8_e8m0fnu" for float4_e2m1fn_x2 without one, range_calculator
  // "minmax", and the convention named when scale_dtype is float8_e4m3fn.
  // INVALID_ARGUMENT naming the field and the rule for anything semantics.md §4, the
  // conformance FORMAT and nvfp4.md §2 reject (float8_e4m3fn scales need
  // float4_e2m1fn_x2 and a per_block granularity; a convention needs them).
  // Resolving a resolved spec returns it unchanged.
  absl::StatusOr<QuantSpec> Resolve() const;

  // On a resolved spec: the scale is a power of two (semantics.md §7).
  bool e8m0_scale() const { return scale_dtype == kE8M0ScaleDType; }
  // On a resolved spec: NVFP4 scales, e4m3 blocks and a global scale (nvfp4.md §3).
  bool nvfp4_scale() const { return scale_dtype == kE4M3ScaleDType; }

  friend bool operator==(const QuantSpec& a, const QuantSpec& b);
};

}  // namespace qparams

#endif  // QPARAMS_CORE_QUANT_SPEC_H_
