#include "proto/convert.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qparams::wire {

absl::StatusOr<TensorView> TensorFromProto(const v1::Tensor& tensor, int64_t max_elements,
                                           absl::string_view field) {
  absl::StatusOr<DType> dtype = DTypeFromProto(tensor.dtype(), absl::StrCat(field, ".dtype"));
  if (!dtype.ok()) return dtype.status();
  return TensorView::Create(*dtype, Shape(tensor.shape().begin(), tensor.shape().end()),
                            tensor.data(), max_elements, field);
}

v1::Tensor TensorToProto(const TensorView& tensor) {
  v1::Tensor out;
  out.set_dtype(DTypeToProto(tensor.dtype()));
  out.mutable_shape()->Assign(tensor.shape().begin(), tensor.shape().end());
  out.set_data(std::string(tensor.bytes()));
  return out;
}

v1::QParams QParamsToProto(const QParams& qparams) {
  v1::QParams out;
  out.mutable_shape()->Assign(qparams.shape.begin(), qparams.shape.end());
  // NVFP4: the core keeps only the codes; the wire carries their values too.
  const std::vector<float> scale = ScaleValues(qparams);
  out.mutable_scale()->Assign(scale.begin(), scale.end());
  out.mutable_zero_point()->Assign(qparams.zero_point.begin(), qparams.zero_point.end());
  out.mutable_minval()->Assign(qparams.minval.begin(), qparams.minval.end());
  out.set_has_zero_point(qparams.has_zero_point);
  out.set_has_minval(qparams.has_minval);
  if (qparams.precision) out.set_precision(DTypeToProto(*qparams.precision));
  // The NVFP4 fields only when set (nvfp4.md §3.5), so other results read as before.
  if (!qparams.scale_e4m3.empty()) {
    out.set_scale_e4m3(reinterpret_cast<const char*>(qparams.scale_e4m3.data()),
                       qparams.scale_e4m3.size());
  }
  if (qparams.global_scale) out.set_global_scale(*qparams.global_scale);
  if (qparams.amax) out.set_amax(*qparams.amax);
  return out;
}

QParams QParamsFromProto(const v1::QParams& qparams) {
  QParams out;
  out.shape.assign(qparams.shape().begin(), qparams.shape().end());
  out.scale.assign(qparams.scale().begin(), qparams.scale().end());
  out.zero_point.assign(qparams.zero_point().begin(), qparams.zero_point().end());
  out.minval.assign(qparams.minval().begin(), qparams.minval().end());
  out.has_zero_point = qparams.has_zero_point();
  out.has_minval = qparams.has_minval();
  absl::StatusOr<DType> precision = DTypeFromProto(qparams.precision(), "precision");
  if (precision.ok()) out.precision = *precision;
  out.scale_e4m3.assign(qparams.scale_e4m3().begin(), qparams.scale_e4m3().end());
  // NVFP4: the wire's scale values are the codes'; the core keeps the codes only.
  if (!out.scale_e4m3.empty()) out.scale.clear();
  if (qparams.has_global_scale()) out.global_scale = qparams.global_scale();
  if (qparams.has_amax()) out.amax = qparams.amax();
  return out;
}

Histogram HistogramFromProto(const v1::HistogramObservation& histogram) {
  Histogram out;
  out.num_bins = histogram.num_bins();
  out.exponent = histogram.exponent();
  out.counts.assign(histogram.counts().begin(), histogram.counts().end());
  out.zero_count = histogram.zero_count();
  out.negative_count = histogram.negative_count();
  out.nan_count = histogram.nan_count();
  out.posinf_count = histogram.posinf_count();
  out.neginf_count = histogram.neginf_count();
  if (histogram.has_min()) out.min = histogram.min();
  if (histogram.has_max()) out.max = histogram.max();
  return out;
}

v1::HistogramObservation HistogramToProto(const Histogram& histogram) {
  v1::HistogramObservation out;
  out.set_num_bins(histogram.num_bins);
  out.set_exponent(histogram.exponent);
  out.mutable_counts()->Assign(histogram.counts.begin(), histogram.counts.end());
  out.set_zero_count(histogram.zero_count);
  out.set_negative_count(histogram.negative_count);
  out.set_nan_count(histogram.nan_count);
  out.set_posinf_count(histogram.posinf_count);
  out.set_neginf_count(histogram.neginf_count);
  if (histogram.min) out.set_min(*histogram.min);
  if (histogram.max) out.set_max(*histogram.max);
  return out;
}

v1::CalibrationResult CalibrationToProto(const CalibrationResult& calibration) {
  v1::CalibrationResult out;
  out.set_amax(calibration.amax);
  out.set_bin_index(calibration.bin_index);
  out.set_exponent(calibration.exponent);
  out.set_total_count(calibration.total_count);
  if (calibration.kl_margin) out.set_kl_margin(*calibration.kl_margin);
  return out;
}

CalibrationResult CalibrationFromProto(const v1::CalibrationResult& calibration) {
  CalibrationResult out;
  out.amax = calibration.amax();
  out.bin_index = calibration.bin_index();
  out.exponent = calibration.exponent();
  out.total_count = calibration.total_count();
  if (calibration.has_kl_margin()) out.kl_margin = calibration.kl_margin();
  return out;
}

namespace {

absl::StatusOr<Observation> RangeFromProto(const v1::RangeObservation& range,
                                           int64_t max_elements) {
  Shape input_shape(range.input_shape().begin(), range.input_shape().end());
  if (input_shape.empty()) {
    return absl::InvalidArgumentError(
        "range.input_shape is empty; the observed tensor must have rank >= 1");
  }
  absl::StatusOr<int64_t> elements = NumElements(input_shape, "range.input_shape");
  if (!elements.ok()) return elements.status();
  if (*elements > max_elements) {
    return absl::ResourceExhaustedError(absl::StrCat("range.input_shape ", ShapeString(input_shape),
                                                     " has ", *elements, " elements; the limit is ",
                                                     max_elements));
  }
  absl::StatusOr<TensorView> min = TensorFromProto(range.min(), max_elements, "range.min");
  if (!min.ok()) return min.status();
  absl::StatusOr<TensorView> max = TensorFromProto(range.max(), max_elements, "range.max");
  if (!max.ok()) return max.status();
  return Observation::FromRange(std::move(input_shape), *std::move(min), *std::move(max));
}

}  // namespace

absl::StatusOr<Observation> ObservationFromProto(const v1::ObserveRequest& request,
                                                 int64_t max_elements) {
  switch (request.observation_case()) {
    case v1::ObserveRequest::kTensor: {
      absl::StatusOr<TensorView> tensor = TensorFromProto(request.tensor(), max_elements, "tensor");
      if (!tensor.ok()) return tensor.status();
      return Observation::FromTensor(*std::move(tensor));
    }
    case v1::ObserveRequest::kRange:
      return RangeFromProto(request.range(), max_elements);
    case v1::ObserveRequest::kHistogram:
      return Observation::FromHistogram(
          std::make_shared<const Histogram>(HistogramFromProto(request.histogram())));
    case v1::ObserveRequest::OBSERVATION_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "observation is unset; send a tensor, a range (block minima and maxima) or, to a "
      "histogram session, a histogram");
}

std::optional<ObserveKey> ObserveKeyFromProto(const v1::ObserveRequest& request) {
  if (request.client_id().empty() && request.sequence() == 0) return std::nullopt;
  return ObserveKey{request.client_id(), request.sequence()};
}

absl::StatusOr<Observation> ComputeObservationFromProto(const v1::ComputeRequest& request,
                                                        int64_t max_elements) {
  if (request.has_tensor() == request.has_range()) {
    return absl::InvalidArgumentError(
        request.has_tensor()
            ? "tensor and range are both set; send one: the tensor, or its block minima "
              "and maxima"
            : "tensor and range are both unset; send the tensor, or its block minima and "
              "maxima");
  }
  if (request.has_range()) return RangeFromProto(request.range(), max_elements);
  absl::StatusOr<TensorView> tensor = TensorFromProto(request.tensor(), max_elements, "tensor");
  if (!tensor.ok()) return tensor.status();
  return Observation::FromTensor(*std::move(tensor));
}

std::optional<GroupShare> GroupShareFromProto(v1::ScaleGroup::Share share) {
  switch (share) {
    case v1::ScaleGroup::GLOBAL_AMAX:
      return GroupShare::kGlobalAmax;
    case v1::ScaleGroup::UNION_RANGE:
      return GroupShare::kUnionRange;
    default:
      return std::nullopt;
  }
}

v1::ScaleGroup::Share GroupShareToProto(GroupShare share) {
  return share == GroupShare::kGlobalAmax ? v1::ScaleGroup::GLOBAL_AMAX
                                          : v1::ScaleGroup::UNION_RANGE;
}

v1::GroupQParams GroupResultToProto(absl::string_view group, const GroupResult& result) {
  v1::GroupQParams out;
  out.set_group(std::string(group));
  out.set_initialized(result.initialized);
  for (const std::string& name : result.uncalibrated) out.add_uncalibrated(name);
  out.set_amax(result.amax);
  out.set_global_scale(result.global_scale);
  for (const GroupMemberResult& m : result.members) {
    v1::GroupMember* member = out.add_members();
    member->set_name(m.name);
    *member->mutable_qparams() = QParamsToProto(m.qparams);
    if (m.amax.has_value()) member->set_amax(*m.amax);
  }
  out.set_min(result.min);
  out.set_max(result.max);
  // UNION_RANGE only: GLOBAL_AMAX results carry their qparams per member.
  if (result.initialized && result.members.empty()) {
    *out.mutable_qparams() = QParamsToProto(result.qparams);
  }
  return out;
}

GroupResult GroupResultFromProto(const v1::GroupQParams& in) {
  GroupResult out;
  out.initialized = in.initialized();
  out.uncalibrated.assign(in.uncalibrated().begin(), in.uncalibrated().end());
  out.amax = in.amax();
  out.global_scale = in.global_scale();
  for (const v1::GroupMember& m : in.members()) {
    GroupMemberResult& member = out.members.emplace_back();
    member.name = m.name();
    member.qparams = QParamsFromProto(m.qparams());
    if (m.has_amax()) member.amax = m.amax();
  }
  out.min = in.min();
  out.max = in.max();
  if (in.has_qparams()) out.qparams = QParamsFromProto(in.qparams());
  return out;
}

absl::StatusOr<std::optional<Observation>> ContributionFromProto(
    const v1::StepContribution& contribution, int64_t max_elements) {
  switch (contribution.observation_case()) {
    case v1::StepContribution::kTensor: {
      absl::StatusOr<TensorView> tensor =
          TensorFromProto(contribution.tensor(), max_elements, "tensor");
      if (!tensor.ok()) return tensor.status();
      return std::optional<Observation>(Observation::FromTensor(*std::move(tensor)));
    }
    case v1::StepContribution::kRange: {
      absl::StatusOr<Observation> range = RangeFromProto(contribution.range(), max_elements);
      if (!range.ok()) return range.status();
      return std::optional<Observation>(*std::move(range));
    }
    case v1::StepContribution::OBSERVATION_NOT_SET:
      break;
  }
  return std::optional<Observation>();
}

v1::StepProgress StepProgressToProto(const StepState& steps) {
  v1::StepProgress out;
  out.set_last_applied_step(steps.last_applied);
  for (const StepState::Pending& p : steps.pending) {
    v1::StepProgress::Pending* pending = out.add_pending();
    pending->set_step(p.step);
    pending->set_world_size(p.world_size);
    for (int32_t rank = 0; rank < static_cast<int32_t>(p.contributed.size()); ++rank) {
      if (!p.contributed[rank]) pending->add_missing_ranks(rank);
    }
  }
  for (const IncompleteStep& s : steps.incomplete) {
    v1::StepProgress::Incomplete* incomplete = out.add_incomplete();
    incomplete->set_step(s.step);
    incomplete->set_world_size(s.world_size);
    incomplete->mutable_missing_ranks()->Assign(s.missing_ranks.begin(), s.missing_ranks.end());
  }
  return out;
}

}  // namespace qparams::wire
