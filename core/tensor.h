// Tensors as they arrive: a dtype, a shape and raw little-endian row-major bytes.

#ifndef QPARAMS_CORE_TENSOR_H_
#define QPARAMS_CORE_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/bytes.h"
#include "core/dtype.h"

namespace qparams {

using Shape = std::vector<int64_t>;

// Default limit on the number of elements of one tensor (2^31).
inline constexpr int64_t kDefaultMaxTensorElements = int64_t{1} << 31;

// The product of the dims. INVALID_ARGUMENT naming `field` if a dim is negative or the
// product overflows int64.
absl::StatusOr<int64_t> NumElements(const Shape& shape, absl::string_view field = "shape");

// "[2, 3]".
std::string ShapeString(const Shape& shape);

// A non-owning, validated view of a tensor's bytes. Dims of 0 are well formed (a
// zero-size tensor is rejected only where its values would be read).
class TensorView {
 public:
  // Checks that the rank is at least 1, that every dim is >= 0, that the element
  // count neither overflows (INVALID_ARGUMENT) nor exceeds `max_elements`
  // (RESOURCE_EXHAUSTED), and that `data` holds exactly count * itemsize bytes
  // (INVALID_ARGUMENT). Messages name `field`. `data` must outlive the view.
  static absl::StatusOr<TensorView> Create(DType dtype, Shape shape, absl::string_view data,
                                           int64_t max_elements = kDefaultMaxTensorElements,
                                           absl::string_view field = "tensor");

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t num_elements() const { return num_elements_; }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(data_.data()); }
  absl::string_view bytes() const { return data_; }

  // Element `i` (row-major) widened exactly to double.
  double ValueAt(int64_t i) const;

 private:
  friend struct Tensor;
  TensorView(DType dtype, Shape shape, int64_t num_elements, absl::string_view data)
      : dtype_(dtype), shape_(std::move(shape)), num_elements_(num_elements), data_(data) {}

  DType dtype_;
  Shape shape_;
  int64_t num_elements_;
  absl::string_view data_;
};

// An owning tensor, e.g. the block minima computed by ObserveRange.
struct Tensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  Bytes data;

  // A view of this tensor; the shape and size are trusted to agree.
  TensorView view() const;
};

}  // namespace qparams

#endif  // QPARAMS_CORE_TENSOR_H_
