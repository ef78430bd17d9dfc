// The qparams calculators of coreai_opt (semantics.md §1): an abstract base, a
// stateful base whose buffers persist across forwards, a stateless base, and the
// four registered kinds static, moving_average, global_minmax and dynamic. The
// histogram kinds percentile, entropy and mse are stateful too
// (histogram_calculator.h).
//
// A forward is *cached* when a stateful calculator is in export mode, or is
// initialized with both float_range bounds set: it returns the buffers and reads
// nothing of the input. Every other forward is *computing*. A failed forward changes
// nothing.

#ifndef QPARAMS_CORE_QPARAMS_CALCULATOR_H_
#define QPARAMS_CORE_QPARAMS_CALCULATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calculator_state.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/quant_spec.h"

namespace qparams {

class StatefulQParamsCalculatorBase;

class QParamsCalculatorBase {
 public:
  virtual ~QParamsCalculatorBase() = default;
  QParamsCalculatorBase& operator=(const QParamsCalculatorBase&) = delete;

  // The registry key: "static", "moving_average", "global_minmax", "dynamic",
  // "percentile", "entropy" or "mse".
  virtual absl::string_view key() const = 0;
  virtual bool stateful() const = 0;

  // forward(x): the qparams of this observation (see the file comment). Errors:
  // INVALID_ARGUMENT for a granularity that does not fit the input shape, an input
  // with no elements or with non-finite values, or a malformed range observation,
  // and (even when cached) for a histogram observation, which only the histogram
  // kinds take; FAILED_PRECONDITION (stateful only) for an input dtype or block count
  // N other than those of the first computing forward.
  virtual absl::StatusOr<QParams> Forward(const Observation& x) = 0;

  // set_export_mode. Stateful: freezes (true) or unfreezes the buffers. Stateless:
  // true is FAILED_PRECONDITION, false does nothing.
  virtual absl::Status SetExportMode(bool enabled) = 0;

  // The granularity setter: FAILED_PRECONDITION once initialized, INVALID_ARGUMENT
  // for a granularity that cannot be built (or that the kind does not support).
  virtual absl::Status SetGranularity(const Granularity& granularity);

  // A one- or two-line summary in the style of the module's extra_repr.
  virtual std::string Description() const = 0;

  // The calculator's full state as a plain value; CreateFromState (registry.h)
  // rebuilds a calculator that continues bit-identically.
  virtual CalculatorState ExportState() const;

  // The resolved spec (its granularity follows SetGranularity).
  const QuantSpec& spec() const { return spec_; }
  // True after the first successful computing forward.
  bool initialized() const { return initialized_; }
  // The dtype of the first computing forward's input (float32 before it).
  DType compute_dtype_for_export() const { return compute_dtype_for_export_; }

 protected:
  // `resolved_spec` comes from QuantSpec::Resolve().
  explicit QParamsCalculatorBase(QuantSpec resolved_spec);
  // For the concrete classes' copies (StatefulQParamsCalculatorBase::Clone); a base
  // is never copied on its own, which would slice it.
  QParamsCalculatorBase(const QParamsCalculatorBase&) = default;

  // INVALID_ARGUMENT for a histogram observation, naming this kind.
  absl::Status RejectHistogram(const Observation& x) const;

  // The block-size vector of x's input shape for the spec's granularity and target.
  // INVALID_ARGUMENT if the granularity does not fit or the input has no elements.
  absl::StatusOr<Shape> BlockShapeFor(const Observation& x) const;

  // get_range (§2): the range pass over x, then float_range handling. INVALID_ARGUMENT
  // for non-finite values or a malformed range observation.
  absl::StatusOr<WorkingRange> WorkingRangeFor(const Observation& x, const Shape& block) const;

  // Restores what ExportState wrote of the common fields.
  virtual absl::Status RestoreState(const CalculatorState& state);
  friend absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> CreateFromState(
      const CalculatorState& state);
  friend absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> CreateStatefulFromState(
      const CalculatorState& state);

  QuantSpec spec_;
  QParamsRecipe recipe_;
  bool initialized_ = false;
  DType compute_dtype_for_export_ = DType::kFloat32;
};

class StatefulQParamsCalculatorBase : public QParamsCalculatorBase {
 public:
  bool stateful() const final { return true; }
  // The range kinds' forward; the histogram kinds override it.
  absl::StatusOr<QParams> Forward(const Observation& x) override;
  absl::Status SetExportMode(bool enabled) final;
  std::string Description() const override;
  CalculatorState ExportState() const override;

  // get_qparams: the buffers, empty (shape [0]) before the first computing forward.
  // The histogram kinds compute theirs on demand (histogram_calculator.h). The
  // reference stays valid until the next mutation.
  virtual const QParams& GetQParams() const { return buffers_; }
  bool export_mode() const { return export_mode_; }
  // Computing forwards applied so far.
  int64_t observation_count() const { return observation_count_; }

  // The member range a scale group reads (nvfp4.md §4.2): the running range of the
  // running kinds, the last computing forward's range for static; unset before
  // initialization, for the histogram kinds, and for a static state restored from a
  // record written before the range was kept.
  virtual std::optional<WorkingRange> current_range() const { return std::nullopt; }

  // A step contribution's range (qat.md §3): x reduced to its per-block minima and
  // maxima, as the range pass of a computing forward reduces it, with x's input
  // shape. Checked as a computing forward checks x: INVALID_ARGUMENT as Forward's;
  // FAILED_PRECONDITION for a dtype or block count N other than the first
  // forward's. Changes nothing. A forward of FromRange(input_shape, min, max) of the
  // elementwise min and max of several such ranges (MergeBlockRanges) is the
  // forward of the concatenation of their inputs along a fully reduced axis.
  struct ReducedRange {
    Shape input_shape;
    BlockRange range;
  };
  absl::StatusOr<ReducedRange> ReduceRange(const Observation& x) const;

  // An independent copy, bit-identical in state: a caller can mutate the copy and
  // keep it only if the mutation is to stand (the server's journaled mutations).
  virtual std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const = 0;

  // Moves every buffer the calculator keeps into a fresh allocation of its own. For
  // a caller that has just freed the temporaries the calculator was built amid (a
  // restore, the first forward): glibc's malloc would otherwise leave sub-page holes
  // between long-lived buffers that no later buffer fits.
  virtual void ReallocateBuffers();

 protected:
  using QParamsCalculatorBase::QParamsCalculatorBase;

  // compute_qparams for this kind, from the forward's working range. Called only
  // once the forward can no longer fail; may update the kind's own state. By default
  // the qparams of that range alone.
  virtual QParams ComputeQParams(const WorkingRange& range);
  // Whether the kind keeps running_min/running_max (and so may restore them).
  virtual bool has_running_range() const { return false; }
  // Whether the kind keeps its qparams in the buffers; a kind that derives them on
  // demand exports and restores empty buffers.
  virtual bool keeps_buffers() const { return true; }
  absl::Status RestoreState(const CalculatorState& state) override;
  // For a kind that overrides Forward: one more computing observation succeeded.
  void CountObservation() { ++observation_count_; }

 private:
  absl::StatusOr<QParams> ComputingForward(const Observation& x);
  // The block-size vector of x, checked against the first forward's dtype and N once
  // initialized (FAILED_PRECONDITION).
  absl::StatusOr<Shape> StableBlockShapeFor(const Observation& x) const;

  QParams buffers_ = QParams::Empty(recipe_.has_zero_point, recipe_.has_zero_point);
  bool export_mode_ = false;
  int64_t observation_count_ = 0;
};

// The qparams of each computing forward's range alone; the range is kept for scale
// groups (current_range).
class StaticQParamsCalculator final : public StatefulQParamsCalculatorBase {
 public:
  explicit StaticQParamsCalculator(QuantSpec resolved_spec)
      : StatefulQParamsCalculatorBase(std::move(resolved_spec)) {}
  absl::string_view key() const override { return "static"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override {
    return std::make_unique<StaticQParamsCalculator>(*this);
  }
  std::optional<WorkingRange> current_range() const override;
  CalculatorState ExportState() const override;
  void ReallocateBuffers() override;

 protected:
  QParams ComputeQParams(const WorkingRange& range) override;
  absl::Status RestoreState(const CalculatorState& state) override;

 private:
  bool has_last_range_ = false;
  StoredRange last_range_;
};

// The running-range mixin: qparams come from a running range that the first
// computing forward sets to its range and later ones update.
class RunningRangeQParamsCalculator : public StatefulQParamsCalculatorBase {
 public:
  // running_min / running_max in working precision (empty before initialization).
  WorkingRange running_range() const { return running_.Get(); }
  std::optional<WorkingRange> current_range() const override;
  std::string Description() const override;
  CalculatorState ExportState() const override;
  void ReallocateBuffers() override;

 protected:
  using StatefulQParamsCalculatorBase::StatefulQParamsCalculatorBase;
  QParams ComputeQParams(const WorkingRange& range) final;
  bool has_running_range() const final { return true; }
  virtual WorkingRange UpdateRunningRange(const WorkingRange& range) const = 0;
  absl::Status RestoreState(const CalculatorState& state) override;

 private:
  StoredRange running_;
};

class MovingAverageQParamsCalculator final : public RunningRangeQParamsCalculator {
 public:
  static constexpr double kDefaultAveragingConstant = 0.01;
  MovingAverageQParamsCalculator(QuantSpec resolved_spec, double averaging_constant)
      : RunningRangeQParamsCalculator(std::move(resolved_spec)),
        averaging_constant_(averaging_constant) {}
  absl::string_view key() const override { return "moving_average"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override {
    return std::make_unique<MovingAverageQParamsCalculator>(*this);
  }
  double averaging_constant() const { return averaging_constant_; }
  CalculatorState ExportState() const override;

 protected:
  WorkingRange UpdateRunningRange(const WorkingRange& range) const override;

 private:
  double averaging_constant_;
};

class GlobalMinMaxQParamsCalculator final : public RunningRangeQParamsCalculator {
 public:
  explicit GlobalMinMaxQParamsCalculator(QuantSpec resolved_spec)
      : RunningRangeQParamsCalculator(std::move(resolved_spec)) {}
  absl::string_view key() const override { return "global_minmax"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override {
    return std::make_unique<GlobalMinMaxQParamsCalculator>(*this);
  }

 protected:
  WorkingRange UpdateRunningRange(const WorkingRange& range) const override;
};

// No buffers: every forward computes from scratch, with any shape and dtype.
class StatelessQParamsCalculatorBase : public QParamsCalculatorBase {
 public:
  bool stateful() const final { return false; }
  absl::StatusOr<QParams> Forward(const Observation& x) final;
  absl::Status SetExportMode(bool enabled) final;
  std::string Description() const override;

 protected:
  using QParamsCalculatorBase::QParamsCalculatorBase;
  virtual QParams ComputeQParams(const WorkingRange& range) const = 0;
  absl::Status RestoreState(const CalculatorState& state) override;
};

class DynamicQParamsCalculator final : public StatelessQParamsCalculatorBase {
 public:
  explicit DynamicQParamsCalculator(QuantSpec resolved_spec)
      : StatelessQParamsCalculatorBase(std::move(resolved_spec)) {}
  absl::string_view key() const override { return "dynamic"; }

 protected:
  QParams ComputeQParams(const WorkingRange& range) const override;
};

}  // namespace qparams

#endif  // QPARAMS_CORE_QPARAMS_CALCULATOR_H_
