#include "core/qparams_calculator.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/float8.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

// PyTorch-like repr of a tensor: "tensor([[0.0235], [0.0471]])"; large ones are
// summarised by their shape.
template <typename T>
std::string TensorRepr(const std::vector<T>& values, const Shape& shape,
                       absl::string_view suffix = "") {
  constexpr size_t kMaxShown = 8;
  std::string body;
  if (values.empty()) {
    body = "[]";
  } else if (values.size() > kMaxShown) {
    body = absl::StrCat("[", absl::StrFormat("%.4g", static_cast<double>(values.front())),
                        ", ..., ", absl::StrFormat("%.4g", static_cast<double>(values.back())),
                        "], size=", ShapeString(shape));
  } else {
    // Nest brackets by the shape, innermost dim last.
    std::vector<std::string> items;
    for (const T& v : values) items.push_back(absl::StrFormat("%.4g", static_cast<double>(v)));
    for (size_t d = shape.size(); d-- > 0;) {
      const size_t width = static_cast<size_t>(shape[d]);
      std::vector<std::string> grouped;
      for (size_t i = 0; i < items.size(); i += width) {
        std::vector<std::string> group(items.begin() + i, items.begin() + i + width);
        grouped.push_back(absl::StrCat("[", absl::StrJoin(group, ", "), "]"));
      }
      items = std::move(grouped);
    }
    body = items.front();
  }
  return absl::StrCat("tensor(", body, suffix, ")");
}

std::string WorkingRangeRepr(const std::vector<double>& values, const WorkingRange& range) {
  const absl::string_view suffix =
      range.precision == DType::kFloat32
          ? ""
          : (range.precision == DType::kFloat16
                 ? ", dtype=torch.float16"
                 : (range.precision == DType::kBFloat16 ? ", dtype=torch.bfloat16"
                                                        : ", dtype=torch.float64"));
  return TensorRepr(values, range.shape, suffix);
}

absl::Status ExpectSize(absl::string_view field, size_t size, int64_t expected) {
  if (static_cast<int64_t>(size) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("state.", field, " holds ", size, " values; its shape needs ", expected));
}

}  // namespace

QParamsCalculatorBase::QParamsCalculatorBase(QuantSpec resolved_spec)
    : spec_(std::move(resolved_spec)), recipe_(QParamsRecipe::FromSpec(spec_)) {}

absl::Status QParamsCalculatorBase::SetGranularity(const Granularity& granularity) {
  if (initialized_) {
    return absl::FailedPreconditionError(
        "Cannot change granularity after observer has been initialized.");
  }
  QPARAMS_RETURN_IF_ERROR(granularity.Validate());
  if (spec_.nvfp4_scale() && granularity.kind() != Granularity::Kind::kPerBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("granularity ", granularity.ToString(),
                     ": scale_dtype float8_e4m3fn requires per_block (NVFP4 block scales)"));
  }
  spec_.granularity = granularity;
  return absl::OkStatus();
}

absl::Status QParamsCalculatorBase::RejectHistogram(const Observation& x) const {
  if (!x.is_histogram()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "a HistogramObservation is for the percentile, entropy and mse calculators; ", key(),
      " takes a tensor or a range observation"));
}

absl::StatusOr<Shape> QParamsCalculatorBase::BlockShapeFor(const Observation& x) const {
  absl::StatusOr<Shape> block = spec_.granularity.BlockShape(x.input_shape(), spec_.target);
  if (!block.ok()) return block.status();
  for (int64_t d : x.input_shape()) {
    if (d == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(x.is_range() ? "range.input_shape " : "tensor.shape ",
                       ShapeString(x.input_shape()),
                       " has no elements; dims must be >= 1 on a computing forward"));
    }
  }
  return block;
}

absl::StatusOr<WorkingRange> QParamsCalculatorBase::WorkingRangeFor(const Observation& x,
                                                                    const Shape& block) const {
  // Also with both bounds set: the values are checked even when they do not matter.
  absl::StatusOr<BlockRange> observed = x.Range(block);
  if (!observed.ok()) return observed.status();
  return qparams::GetRange(&*observed, observed->min.shape, spec_.float_range);
}

CalculatorState QParamsCalculatorBase::ExportState() const {
  CalculatorState state;
  state.calculator = std::string(key());
  state.spec = spec_;
  state.initialized = initialized_;
  state.compute_dtype_for_export = compute_dtype_for_export_;
  return state;
}

absl::Status QParamsCalculatorBase::RestoreState(const CalculatorState& state) {
  if (!state.initialized && state.compute_dtype_for_export != DType::kFloat32) {
    return absl::InvalidArgumentError(
        "state.compute_dtype_for_export is set by the first forward; it must be float32 before");
  }
  initialized_ = state.initialized;
  compute_dtype_for_export_ = state.compute_dtype_for_export;
  return absl::OkStatus();
}

// ---- Stateful ----

absl::StatusOr<QParams> StatefulQParamsCalculatorBase::Forward(const Observation& x) {
  QPARAMS_RETURN_IF_ERROR(RejectHistogram(x));
  if (initialized_ && spec_.float_range.frozen()) return buffers_;  // frozen range
  if (export_mode_) return buffers_;
  const bool initializing = !initialized_;
  absl::StatusOr<QParams> q = ComputingForward(x);
  // The first computing forward allocates the buffers amid its own temporaries. Once
  // those are freed, the buffers move out of the gaps between them: glibc's malloc
  // would split the gaps around the buffers and leave sub-page holes that no later
  // buffer fits (a fifth more resident memory for many small sessions). Later
  // forwards reuse the buffers' storage.
  if (initializing && initialized_) ReallocateBuffers();
  return q;
}

void StatefulQParamsCalculatorBase::ReallocateBuffers() {
  QParams fresh = buffers_;
  buffers_ = std::move(fresh);
}

absl::StatusOr<Shape> StatefulQParamsCalculatorBase::StableBlockShapeFor(
    const Observation& x) const {
  absl::StatusOr<Shape> block = BlockShapeFor(x);
  if (!block.ok()) return block.status();
  if (initialized_) {
    if (x.dtype() != compute_dtype_for_export_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "input dtype ", DTypeName(x.dtype()), " differs from ",
          DTypeName(compute_dtype_for_export_),
          ", fixed by the first forward; use a new session (or dynamic) for another dtype"));
    }
    const Shape counts = BlockCounts(x.input_shape(), *block);
    if (counts != buffers_.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "input shape ", ShapeString(x.input_shape()), " gives scale shape ", ShapeString(counts),
          " but the buffers have shape ", ShapeString(buffers_.shape),
          ", fixed by the first forward; shapes must stay stable (use dynamic for varying ones)"));
    }
  }
  return block;
}

absl::StatusOr<StatefulQParamsCalculatorBase::ReducedRange>
StatefulQParamsCalculatorBase::ReduceRange(const Observation& x) const {
  QPARAMS_RETURN_IF_ERROR(RejectHistogram(x));
  QPARAMS_ASSIGN_OR_RETURN(const Shape block, StableBlockShapeFor(x));
  QPARAMS_ASSIGN_OR_RETURN(BlockRange range, x.Range(block));
  return ReducedRange{x.input_shape(), std::move(range)};
}

absl::StatusOr<QParams> StatefulQParamsCalculatorBase::ComputingForward(const Observation& x) {
  absl::StatusOr<Shape> block = StableBlockShapeFor(x);
  if (!block.ok()) return block.status();
  absl::StatusOr<WorkingRange> range = WorkingRangeFor(x, *block);
  if (!range.ok()) return range.status();

  QParams q = ComputeQParams(*range);
  if (!initialized_) {
    compute_dtype_for_export_ = x.dtype();
    initialized_ = true;
  }
  buffers_ = q;
  ++observation_count_;
  return q;
}

QParams StatefulQParamsCalculatorBase::ComputeQParams(const WorkingRange& range) {
  return QParamsFromRange(recipe_, range);
}

absl::Status StatefulQParamsCalculatorBase::SetExportMode(bool enabled) {
  export_mode_ = enabled;
  return absl::OkStatus();
}

std::string StatefulQParamsCalculatorBase::Description() const {
  const QParams& b = buffers_;
  return absl::StrCat(
      "scale=", TensorRepr(ScaleValues(b), b.shape), ", zero_point=",
      b.has_zero_point ? TensorRepr(b.zero_point, b.shape, ", dtype=torch.int32") : "None",
      ", minval=", b.has_minval ? TensorRepr(b.minval, b.shape) : "None",
      b.global_scale.has_value()
          ? absl::StrFormat(", global_scale=%.9g, amax=%.9g", *b.global_scale, b.amax.value_or(0))
          : "",
      ", export_mode=", export_mode_ ? "True" : "False");
}

CalculatorState StatefulQParamsCalculatorBase::ExportState() const {
  CalculatorState state = QParamsCalculatorBase::ExportState();
  state.export_mode = export_mode_;
  state.observation_count = observation_count_;
  state.qparams = buffers_;
  return state;
}

absl::Status StatefulQParamsCalculatorBase::RestoreState(const CalculatorState& state) {
  const QParams& q = state.qparams;
  if (q.has_zero_point != recipe_.has_zero_point || q.has_minval != recipe_.has_zero_point) {
    return absl::InvalidArgumentError(
        "state.qparams: has_zero_point/has_minval do not match the spec's dtype");
  }
  if (state.running.has_value() && !has_running_range()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state.running: ", key(), " keeps no running range"));
  }
  if (!keeps_buffers()) {
    if (q.shape != Shape{0} || q.precision.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state.qparams: ", key(), " computes its qparams on demand; its buffers are empty"));
    }
    if (state.observation_count < 0 || state.observation_count == INT64_MAX ||
        (state.initialized && state.observation_count == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state.observation_count is ", state.observation_count,
                       "; it must be >= 0, and > 0 once initialized"));
    }
    QPARAMS_RETURN_IF_ERROR(QParamsCalculatorBase::RestoreState(state));
    export_mode_ = state.export_mode;
    observation_count_ = state.observation_count;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> n = NumElements(q.shape, "state.qparams.shape");
  if (!n.ok()) return n.status();
  const bool empty = q.shape == Shape{0};
  if (state.initialized == empty || state.initialized != q.precision.has_value() ||
      state.initialized != (state.observation_count > 0)) {
    return absl::InvalidArgumentError(
        "state: the initialized flag, filled buffers, their precision and a positive "
        "observation_count go together");
  }
  if (state.observation_count < 0 || state.observation_count == INT64_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state.observation_count is ", state.observation_count, "; no calculator can have it"));
  }
  if (recipe_.nvfp4.has_value()) {
    // The block scales are the values of their codes; global scale and amax come
    // with the first computing forward. A state may carry those values in `scale`
    // (records written before the buffers stopped keeping them): they are checked,
    // then dropped, as a forward's buffers hold none.
    QPARAMS_RETURN_IF_ERROR(ExpectSize("qparams.scale_e4m3", q.scale_e4m3.size(), *n));
    if (!q.scale.empty()) {
      QPARAMS_RETURN_IF_ERROR(ExpectSize("qparams.scale", q.scale.size(), *n));
    }
    if (q.global_scale.has_value() != state.initialized ||
        q.amax.has_value() != state.initialized) {
      return absl::InvalidArgumentError(
          "state.qparams: global_scale and amax are set exactly when the calculator is "
          "initialized");
    }
    for (int64_t i = 0; i < static_cast<int64_t>(q.scale.size()); ++i) {
      const float value = Float8E4M3FnToFloat(q.scale_e4m3[i]);
      if (FloatBits(value) != FloatBits(q.scale[i]) &&
          !(std::isnan(value) && std::isnan(q.scale[i]))) {
        return absl::InvalidArgumentError(absl::StrCat("state.qparams.scale[", i, "] is ",
                                                       q.scale[i], "; it must be the value ", value,
                                                       " of its e4m3 code"));
      }
    }
    QPARAMS_RETURN_IF_ERROR(QParamsCalculatorBase::RestoreState(state));
    buffers_ = q;
    buffers_.scale.clear();
    export_mode_ = state.export_mode;
    observation_count_ = state.observation_count;
    return absl::OkStatus();
  }
  if (!q.scale_e4m3.empty() || q.global_scale.has_value() || q.amax.has_value()) {
    return absl::InvalidArgumentError(
        "state.qparams: scale_e4m3, global_scale and amax are for a float8_e4m3fn scale_dtype");
  }
  QPARAMS_RETURN_IF_ERROR(ExpectSize("qparams.scale", q.scale.size(), *n));
  if (absl::Status s =
          ExpectSize("qparams.zero_point", q.zero_point.size(), q.has_zero_point ? *n : 0);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ExpectSize("qparams.minval", q.minval.size(), q.has_minval ? *n : 0);
      !s.ok()) {
    return s;
  }
  // Only finite inputs are observed, but a finite range wider than float32 (or a
  // float_range bound beyond it) gives an infinite scale and minval, and then a zero
  // point from inf/inf: states a restored calculator must carry on with. The e8m0
  // path ignores quant_min/quant_max (§7): its zero point is always 0.
  const bool e8m0 = recipe_.e8m0_target.has_value();
  for (int64_t i = 0; i < *n; ++i) {
    const bool zero_point_ok =
        !q.has_zero_point || (e8m0 ? q.zero_point[i] == 0
                                   : !std::isfinite(q.scale[i]) ||
                                         (q.zero_point[i] >= recipe_.quant_min &&
                                          q.zero_point[i] <= recipe_.quant_max));
    if (!(q.scale[i] > 0) || (q.has_minval && std::isnan(q.minval[i])) || !zero_point_ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state.qparams[", i,
          "]: scale must be > 0, minval not NaN and the zero point within [quant_min, "
          "quant_max] (0 with an e8m0 scale)"));
    }
  }
  QPARAMS_RETURN_IF_ERROR(QParamsCalculatorBase::RestoreState(state));
  buffers_ = q;
  export_mode_ = state.export_mode;
  observation_count_ = state.observation_count;
  return absl::OkStatus();
}

// ---- Static ----

std::optional<WorkingRange> StaticQParamsCalculator::current_range() const {
  if (!has_last_range_) return std::nullopt;
  return last_range_.Get();
}

QParams StaticQParamsCalculator::ComputeQParams(const WorkingRange& range) {
  last_range_.Assign(range);
  has_last_range_ = true;
  return StatefulQParamsCalculatorBase::ComputeQParams(range);
}

CalculatorState StaticQParamsCalculator::ExportState() const {
  CalculatorState state = StatefulQParamsCalculatorBase::ExportState();
  state.last_range = current_range();
  return state;
}

void StaticQParamsCalculator::ReallocateBuffers() {
  StatefulQParamsCalculatorBase::ReallocateBuffers();
  StoredRange fresh = last_range_;
  last_range_ = std::move(fresh);
}

absl::Status StaticQParamsCalculator::RestoreState(const CalculatorState& state) {
  if (state.last_range.has_value()) {
    const WorkingRange& r = *state.last_range;
    if (!state.initialized || r.shape != state.qparams.shape ||
        r.precision != state.qparams.precision || r.lo.size() != ScaleCount(state.qparams) ||
        r.hi.size() != ScaleCount(state.qparams)) {
      return absl::InvalidArgumentError(
          "state.last_range: set only once initialized, with the buffers' shape and precision");
    }
  }
  QPARAMS_RETURN_IF_ERROR(StatefulQParamsCalculatorBase::RestoreState(state));
  has_last_range_ = state.last_range.has_value();
  last_range_ = StoredRange(state.last_range.value_or(WorkingRange()));
  return absl::OkStatus();
}

// ---- Running range ----

std::optional<WorkingRange> RunningRangeQParamsCalculator::current_range() const {
  if (!initialized_) return std::nullopt;
  return running_range();
}

QParams RunningRangeQParamsCalculator::ComputeQParams(const WorkingRange& range) {
  WorkingRange running = initialized_ ? UpdateRunningRange(range) : range;
  running_.Assign(running);
  return QParamsFromRange(recipe_, running);
}

std::string RunningRangeQParamsCalculator::Description() const {
  const WorkingRange running = running_range();
  return absl::StrCat(StatefulQParamsCalculatorBase::Description(),
                      "\nrunning_min=", WorkingRangeRepr(running.lo, running),
                      ", running_max=", WorkingRangeRepr(running.hi, running));
}

void RunningRangeQParamsCalculator::ReallocateBuffers() {
  StatefulQParamsCalculatorBase::ReallocateBuffers();
  StoredRange fresh = running_;
  running_ = std::move(fresh);
}

CalculatorState RunningRangeQParamsCalculator::ExportState() const {
  CalculatorState state = StatefulQParamsCalculatorBase::ExportState();
  if (initialized_) state.running = running_range();
  return state;
}

absl::Status RunningRangeQParamsCalculator::RestoreState(const CalculatorState& state) {
  if (state.initialized != state.running.has_value()) {
    return absl::InvalidArgumentError(
        "state.running: a running range is present exactly when the calculator is initialized");
  }
  if (state.running.has_value()) {
    const WorkingRange& r = *state.running;
    if (r.shape != state.qparams.shape || r.precision != state.qparams.precision) {
      return absl::InvalidArgumentError(absl::StrCat("state.running: shape ", ShapeString(r.shape),
                                                     " and precision ", DTypeName(r.precision),
                                                     " must be those of the buffers"));
    }
    if (absl::Status s = ExpectSize("running.lo", r.lo.size(), ScaleCount(state.qparams));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ExpectSize("running.hi", r.hi.size(), ScaleCount(state.qparams));
        !s.ok()) {
      return s;
    }
    for (size_t i = 0; i < r.lo.size(); ++i) {
      // Infinite only through a float_range bound beyond float32.
      if (!(r.lo[i] <= 0 && r.hi[i] >= 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("state.running[", i, "]: running_min must be <= 0 and running_max >= 0"));
      }
    }
  }
  QPARAMS_RETURN_IF_ERROR(StatefulQParamsCalculatorBase::RestoreState(state));
  running_ = StoredRange(state.running.value_or(WorkingRange()));
  return absl::OkStatus();
}

CalculatorState MovingAverageQParamsCalculator::ExportState() const {
  CalculatorState state = RunningRangeQParamsCalculator::ExportState();
  state.averaging_constant = averaging_constant_;
  return state;
}

WorkingRange MovingAverageQParamsCalculator::UpdateRunningRange(const WorkingRange& range) const {
  return MovingAverageUpdate(averaging_constant_, range, running_range());
}

WorkingRange GlobalMinMaxQParamsCalculator::UpdateRunningRange(const WorkingRange& range) const {
  return GlobalMinMaxUpdate(range, running_range());
}

// ---- Stateless ----

absl::StatusOr<QParams> StatelessQParamsCalculatorBase::Forward(const Observation& x) {
  QPARAMS_RETURN_IF_ERROR(RejectHistogram(x));
  absl::StatusOr<Shape> block = BlockShapeFor(x);
  if (!block.ok()) return block.status();
  // NVFP4 scales of a whole tensor: one fused pass instead of the range pass, the
  // widened range and the scales, with the same bits (Nvfp4QParamsFromTensor). A
  // stateless kind keeps no range, so nothing else needs one.
  std::optional<QParams> fused;
  if (recipe_.nvfp4.has_value() && spec_.float_range.empty() && x.tensor() != nullptr) {
    fused = Nvfp4QParamsFromTensor(*recipe_.nvfp4, *x.tensor(), *block);
  }
  QParams q;
  if (fused.has_value()) {
    q = *std::move(fused);
  } else {
    absl::StatusOr<WorkingRange> range = WorkingRangeFor(x, *block);
    if (!range.ok()) return range.status();
    q = ComputeQParams(*range);
  }
  if (!initialized_) {
    compute_dtype_for_export_ = x.dtype();
    initialized_ = true;
  }
  return q;
}

absl::Status StatelessQParamsCalculatorBase::SetExportMode(bool enabled) {
  if (enabled) {
    return absl::FailedPreconditionError(
        absl::StrCat("Stateless quantization (", key(),
                     ") does not support export mode: its qparams depend on each input"));
  }
  return absl::OkStatus();
}

absl::Status StatelessQParamsCalculatorBase::RestoreState(const CalculatorState& state) {
  if (state.export_mode || state.observation_count != 0 || state.qparams.shape != Shape{0} ||
      state.running.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: ", key(),
                     " is stateless; export_mode, observation_count, qparams and running "
                     "must be unset"));
  }
  return QParamsCalculatorBase::RestoreState(state);
}

std::string StatelessQParamsCalculatorBase::Description() const {
  return absl::StrCat("stateless, initialized=", initialized_ ? "True" : "False");
}

QParams DynamicQParamsCalculator::ComputeQParams(const WorkingRange& range) const {
  return QParamsFromRange(recipe_, range);
}

}  // namespace qparams
