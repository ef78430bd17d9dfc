#include "types/codec.h"

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qparams::types {

absl::StatusOr<DType> DTypeFromProto(int dtype, absl::string_view field) {
  switch (dtype) {
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::FLOAT16:
      return DType::kFloat16;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    case v1::FLOAT64:
      return DType::kFloat64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is ", dtype == v1::DTYPE_UNSPECIFIED ? "unset" : "unknown (",
                       dtype == v1::DTYPE_UNSPECIFIED ? "" : absl::StrCat(dtype, ")"),
                       "; use FLOAT32, FLOAT16, BFLOAT16 or FLOAT64"));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::FLOAT32;
    case DType::kFloat16:
      return v1::FLOAT16;
    case DType::kBFloat16:
      return v1::BFLOAT16;
    case DType::kFloat64:
      return v1::FLOAT64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<Granularity> GranularityFromProto(const v1::Granularity& granularity,
                                                 absl::string_view field) {
  switch (granularity.kind_case()) {
    case v1::Granularity::KIND_NOT_SET:
    case v1::Granularity::kPerTensor:
      return Granularity::PerTensor();
    case v1::Granularity::kPerChannel:
      return Granularity::PerChannel(granularity.per_channel().axis());
    case v1::Granularity::kPerBlock: {
      const v1::PerBlock& b = granularity.per_block();
      std::optional<int64_t> axis;
      if (b.has_axis()) axis = b.axis();
      return Granularity::PerBlock(axis, {b.block_size().begin(), b.block_size().end()});
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(field, " has an unknown kind"));
}

v1::Granularity GranularityToProto(const Granularity& granularity) {
  v1::Granularity out;
  switch (granularity.kind()) {
    case Granularity::Kind::kPerTensor:
      out.mutable_per_tensor();
      break;
    case Granularity::Kind::kPerChannel:
      out.mutable_per_channel()->set_axis(static_cast<int32_t>(*granularity.axis()));
      break;
    case Granularity::Kind::kPerBlock: {
      v1::PerBlock* b = out.mutable_per_block();
      if (granularity.axis()) b->set_axis(static_cast<int32_t>(*granularity.axis()));
      b->mutable_block_size()->Assign(granularity.block_size().begin(),
                                      granularity.block_size().end());
      break;
    }
  }
  return out;
}

Target TargetFromProto(v1::Target target) {
  return target == v1::ACTIVATION ? Target::kActivation : Target::kWeight;
}

v1::Target TargetToProto(Target target) {
  return target == Target::kActivation ? v1::ACTIVATION : v1::WEIGHT;
}

absl::StatusOr<QuantSpec> SpecFromProto(const v1::QuantSpec& spec) {
  QuantSpec out;
  if (!spec.dtype().empty()) out.dtype = spec.dtype();
  switch (spec.qscheme()) {
    case v1::QSCHEME_UNSPECIFIED:
    case v1::SYMMETRIC:
      out.qscheme = QScheme::kSymmetric;
      break;
    case v1::ASYMMETRIC:
      out.qscheme = QScheme::kAsymmetric;
      break;
    case v1::SYMMETRIC_WITH_CLIPPING:
      out.qscheme = QScheme::kSymmetricWithClipping;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.qscheme is unknown (", spec.qscheme(),
                       "); use SYMMETRIC, ASYMMETRIC or SYMMETRIC_WITH_CLIPPING"));
  }
  switch (spec.target()) {
    case v1::TARGET_UNSPECIFIED:
    case v1::WEIGHT:
    case v1::ACTIVATION:
      out.target = TargetFromProto(spec.target());
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.target is unknown (", spec.target(), "); use WEIGHT or ACTIVATION"));
  }
  absl::StatusOr<Granularity> granularity =
      GranularityFromProto(spec.granularity(), "spec.granularity");
  if (!granularity.ok()) return granularity.status();
  out.granularity = *std::move(granularity);
  if (spec.has_quant_min()) out.quant_min = spec.quant_min();
  if (spec.has_quant_max()) out.quant_max = spec.quant_max();
  if (spec.float_range().has_min()) out.float_range.min = spec.float_range().min();
  if (spec.float_range().has_max()) out.float_range.max = spec.float_range().max();
  out.scale_dtype = spec.scale_dtype();
  out.range_calculator = spec.range_calculator();
  out.convention = spec.convention();
  return out;
}

v1::QuantSpec SpecToProto(const QuantSpec& spec) {
  v1::QuantSpec out;
  out.set_dtype(spec.dtype);
  switch (spec.qscheme) {
    case QScheme::kSymmetric:
      out.set_qscheme(v1::SYMMETRIC);
      break;
    case QScheme::kAsymmetric:
      out.set_qscheme(v1::ASYMMETRIC);
      break;
    case QScheme::kSymmetricWithClipping:
      out.set_qscheme(v1::SYMMETRIC_WITH_CLIPPING);
      break;
  }
  *out.mutable_granularity() = GranularityToProto(spec.granularity);
  out.set_target(TargetToProto(spec.target));
  if (spec.quant_min) out.set_quant_min(*spec.quant_min);
  if (spec.quant_max) out.set_quant_max(*spec.quant_max);
  // Always present (possibly empty), so a resolved spec reads the same either way.
  v1::FloatRange* range = out.mutable_float_range();
  if (spec.float_range.min) range->set_min(*spec.float_range.min);
  if (spec.float_range.max) range->set_max(*spec.float_range.max);
  out.set_scale_dtype(spec.scale_dtype);
  out.set_range_calculator(spec.range_calculator);
  out.set_convention(spec.convention);
  return out;
}

absl::StatusOr<HistogramParams> HistogramParamsFromProto(const v1::HistogramParams& params,
                                                         absl::string_view field) {
  HistogramParams out;
  if (params.has_num_bins()) out.num_bins = params.num_bins();
  if (params.has_percentile()) out.percentile = params.percentile();
  if (params.has_start_bin()) out.start_bin = params.start_bin();
  if (params.has_stride()) out.stride = params.stride();
  out.skip_zeros = params.skip_zeros();
  switch (params.nonfinite()) {
    case v1::NONFINITE_POLICY_UNSPECIFIED:
    case v1::NONFINITE_REJECT:
      out.nonfinite = NonFinitePolicy::kReject;
      break;
    case v1::NONFINITE_IGNORE:
      out.nonfinite = NonFinitePolicy::kIgnore;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".nonfinite is unknown (", params.nonfinite(),
                       "); use NONFINITE_REJECT or NONFINITE_IGNORE"));
  }
  return out;
}

v1::HistogramParams HistogramParamsToProto(const HistogramParams& params) {
  v1::HistogramParams out;
  if (params.num_bins) out.set_num_bins(*params.num_bins);
  if (params.percentile) out.set_percentile(*params.percentile);
  if (params.start_bin) out.set_start_bin(*params.start_bin);
  if (params.stride) out.set_stride(*params.stride);
  out.set_skip_zeros(params.skip_zeros);
  out.set_nonfinite(params.nonfinite == NonFinitePolicy::kIgnore ? v1::NONFINITE_IGNORE
                                                                 : v1::NONFINITE_REJECT);
  return out;
}

}  // namespace qparams::types
