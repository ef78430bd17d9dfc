#include "core/observation.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/granularity.h"

namespace qparams {

Observation Observation::FromTensor(TensorView tensor) {
  Observation o;
  o.input_shape_ = tensor.shape();
  o.tensor_ = std::move(tensor);
  return o;
}

Observation Observation::FromRange(Shape input_shape, TensorView min, TensorView max) {
  Observation o;
  o.input_shape_ = std::move(input_shape);
  o.min_ = std::move(min);
  o.max_ = std::move(max);
  return o;
}

Observation Observation::FromHistogram(const Histogram& histogram) {
  Observation o;
  o.histogram_ = &histogram;
  return o;
}

Observation Observation::FromHistogram(std::shared_ptr<const Histogram> histogram) {
  Observation o;
  o.histogram_ = histogram.get();
  o.owned_histogram_ = std::move(histogram);
  return o;
}

absl::StatusOr<BlockRange> Observation::Range(const Shape& block) const {
  if (tensor_.has_value()) return ObserveRange(*tensor_, block);
  if (histogram_ != nullptr) {
    return absl::InvalidArgumentError(
        "a HistogramObservation is for the percentile, entropy and mse calculators only");
  }

  absl::StatusOr<int64_t> elements = NumElements(input_shape_, "range.input_shape");
  if (!elements.ok()) return elements.status();
  if (input_shape_.empty() || *elements == 0) {
    return absl::InvalidArgumentError(absl::StrCat("range.input_shape ", ShapeString(input_shape_),
                                                   " has no elements; dims must be >= 1"));
  }
  const Shape counts = BlockCounts(input_shape_, block);
  for (auto [field, t] : {std::pair{"range.min", &*min_}, std::pair{"range.max", &*max_}}) {
    if (t->shape() != counts) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".shape is ", ShapeString(t->shape()), "; the granularity gives input_shape ",
          ShapeString(input_shape_), " the block counts ", ShapeString(counts)));
    }
    if (t->dtype() != min_->dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("range.max.dtype is ", DTypeName(t->dtype()), " but range.min.dtype is ",
                       DTypeName(min_->dtype()), "; both carry the input's dtype"));
    }
    if (int64_t bad = FindNonFinite(*t); bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".data holds a NaN or infinite value (first at flat index ", bad,
                       "); only finite values can be observed"));
    }
  }
  for (int64_t i = 0; i < min_->num_elements(); ++i) {
    if (min_->ValueAt(i) > max_->ValueAt(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("range.min[", i, "] = ", min_->ValueAt(i), " exceeds range.max[", i,
                       "] = ", max_->ValueAt(i), "; a block's min must be <= its max"));
    }
  }
  return BlockRange{Tensor{min_->dtype(), counts, Bytes(min_->bytes())},
                    Tensor{max_->dtype(), counts, Bytes(max_->bytes())}};
}

}  // namespace qparams
