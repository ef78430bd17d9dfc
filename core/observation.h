// What one forward observes: a whole tensor, or the per-block minima and maxima a
// client already reduced from it. Both lead to the same BlockRange, so the two kinds
// of observation give bit-identical qparams.

#ifndef QPARAMS_CORE_OBSERVATION_H_
#define QPARAMS_CORE_OBSERVATION_H_

#include <optional>

#include "absl/status/statusor.h"
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

  const Shape& input_shape() const { return input_shape_; }
  // The input's dtype (for a range observation, that of `min`).
  DType dtype() const { return tensor_ ? tensor_->dtype() : min_->dtype(); }
  bool is_range() const { return !tensor_.has_value(); }

  // The block range for the block-size vector `block`. A tensor is reduced with
  // ObserveRange; a range observation is checked: min/max of shape N and of one
  // dtype, finite, and min <= max in every block. INVALID_ARGUMENT otherwise, and for
  // an input with no elements.
  absl::StatusOr<BlockRange> Range(const Shape& block) const;

 private:
  Observation() = default;

  Shape input_shape_;
  std::optional<TensorView> tensor_;
  std::optional<TensorView> min_;
  std::optional<TensorView> max_;
};

}  // namespace qparams

#endif  // QPARAMS_CORE_OBSERVATION_H_
