#include "core/tensor.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qparams {

absl::StatusOr<int64_t> NumElements(const Shape& shape, absl::string_view field) {
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", d, "] is ", shape[d], "; dims must be >= 0"));
    }
    if (shape[d] != 0 && count > INT64_MAX / shape[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", ShapeString(shape), " has more elements than int64 can count"));
    }
    count *= shape[d];
  }
  return count;
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<TensorView> TensorView::Create(DType dtype, Shape shape, absl::string_view data,
                                              int64_t max_elements, absl::string_view field) {
  if (shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape is empty; a tensor must have rank >= 1"));
  }
  absl::StatusOr<int64_t> count = NumElements(shape, absl::StrCat(field, ".shape"));
  if (!count.ok()) return count.status();
  // The length before the limit: for a huge shape with the wrong data, the mismatch
  // is the error the caller can fix.
  const int64_t item = ItemSize(dtype);
  if (*count > std::numeric_limits<int64_t>::max() / item) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data has ", data.size(),
                                                   " bytes; shape ", ShapeString(shape), " of ",
                                                   DTypeName(dtype), " needs more than 2^63"));
  }
  const int64_t expected = *count * item;
  if (static_cast<int64_t>(data.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data has ", data.size(),
                                                   " bytes; shape ", ShapeString(shape), " of ",
                                                   DTypeName(dtype), " needs ", expected));
  }
  if (*count > max_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(field, ".shape ", ShapeString(shape), " has ",
                                                     *count, " elements; the limit is ",
                                                     max_elements));
  }
  return TensorView(dtype, std::move(shape), *count, data);
}

double TensorView::ValueAt(int64_t i) const {
  const char* p = data_.data();
  switch (dtype_) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t bits;
      std::memcpy(&bits, p + 2 * i, 2);
      return dtype_ == DType::kFloat16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
  }
  return 0;
}

TensorView Tensor::view() const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return TensorView(dtype, shape, count, data);
}

}  // namespace qparams
