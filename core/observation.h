// What one forward observes: a whole tensor, or the per-block minima and maxima a
// client already reduced from it. Both lead to the same BlockRange, so the two kinds
// of observation give bit-identical qparams. The histogram calculators take a third
// kind, a histogram of |x| a client binned (histogram.h), and refuse ranges; the other
// calculators refuse histograms.

#ifndef QPARAMS_CORE_OBSERVATION_H_
#define QPARAMS_CORE_OBSERVATION_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "core/histogram.h"
#include "core/range.h"
#include "core/tensor.h"

namespace qparams {

class Observation {
 public:
  // A full tensor; its values are read by Range().
  static Observation FromTensor(TensorView tensor);
  // A block-reduced tensor of `input_shape`: `min` and `max` must have the block-count
  // shape N of the granularity and the input's dtype (checked by Range()).
  static Observation FromRange(Shape input_shape, TensorView min, TensorView max);
  // A histogram a client binned, checked by the calculator (ValidateHistogram).
  // `histogram` must outlive the observation.
  static Observation FromHistogram(const Histogram& histogram);
  // The same, holding the histogram: for a histogram decoded from a request, which
  // (unlike a tensor's bytes) is not a view of the request.
  static Observation FromHistogram(std::shared_ptr<const Histogram> histogram);

  // The input's shape ([] for a histogram observation).
  const Shape& input_shape() const { return input_shape_; }
  // The input's dtype (for a range observation, that of `min`; float32 for a
  // histogram observation, which has none).
  DType dtype() const {
    return tensor_ ? tensor_->dtype() : min_ ? min_->dtype() : DType::kFloat32;
  }
  bool is_range() const { return min_.has_value(); }
  bool is_histogram() const { return histogram_ != nullptr; }
  // The tensor of a tensor observation, else null.
  const TensorView* tensor() const { return tensor_ ? &*tensor_ : nullptr; }
  // The histogram of a histogram observation, else null.
  const Histogram* histogram() const { return histogram_; }

  // The block range for the block-size vector `block`. A tensor is reduced with
  // ObserveRange; a range observation is checked: min/max of shape N and of one
  // dtype, finite, and min <= max in every block. INVALID_ARGUMENT otherwise, for an
  // input with no elements, and for a histogram observation.
  absl::StatusOr<BlockRange> Range(const Shape& block) const;

 private:
  Observation() = default;

  Shape input_shape_;
  std::optional<TensorView> tensor_;
  std::optional<TensorView> min_;
  std::optional<TensorView> max_;
  const Histogram* histogram_ = nullptr;
  std::shared_ptr<const Histogram> owned_histogram_;  // null for a view
};

}  // namespace qparams

#endif  // QPARAMS_CORE_OBSERVATION_H_
