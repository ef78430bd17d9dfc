// Quantization granularities and the block shape each gives a tensor (semantics.md §3).

#ifndef QPARAMS_CORE_GRANULARITY_H_
#define QPARAMS_CORE_GRANULARITY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace qparams {

// What is being quantized. Only the single-axis per_block shape depends on it.
enum class Target { kWeight, kActivation };

// "weight" or "activation".
absl::string_view TargetName(Target target);

// per_tensor, per_channel(axis) or per_block (single-axis or multi-axis). A value may be
// built in any form; Validate() applies the rules upstream checks when the object is
// built, and BlockShape() the ones that depend on the tensor.
class Granularity {
 public:
  enum class Kind { kPerTensor, kPerChannel, kPerBlock };

  Granularity() = default;  // per_tensor
  static Granularity PerTensor();
  static Granularity PerChannel(int64_t axis);
  // Single-axis per_block: `block_size` elements along `axis`.
  static Granularity PerBlock(int64_t axis, int64_t block_size);
  // Multi-axis per_block: one entry per dim, -1 meaning the whole dim.
  static Granularity PerBlock(std::vector<int64_t> block_size);
  // The wire form: per_block with an optional axis and any number of sizes.
  static Granularity PerBlock(std::optional<int64_t> axis, std::vector<int64_t> block_size);

  Kind kind() const { return kind_; }
  // per_channel: the axis; per_block: the axis of the single-axis form, else unset.
  std::optional<int64_t> axis() const { return axis_; }
  const std::vector<int64_t>& block_size() const { return block_size_; }

  // The construction-time rules: per_block sizes are >= 1 or -1, and the single-axis
  // form has exactly one positive size. INVALID_ARGUMENT naming the field otherwise.
  absl::Status Validate() const;

  // The block-size vector B for a tensor of `shape` (same rank). INVALID_ARGUMENT for
  // an axis out of range, a block size that does not divide its dim, or a multi-axis
  // block_size whose length is not the rank.
  absl::StatusOr<Shape> BlockShape(const Shape& shape, Target target = Target::kWeight) const;

  // "per_tensor", "per_channel(axis=1)", "per_block(axis=-1, block_size=32)",
  // "per_block(block_size=(4, -1))".
  std::string ToString() const;

  friend bool operator==(const Granularity& a, const Granularity& b) {
    return a.kind_ == b.kind_ && a.axis_ == b.axis_ && a.block_size_ == b.block_size_;
  }
  friend bool operator!=(const Granularity& a, const Granularity& b) { return !(a == b); }

 private:
  Kind kind_ = Kind::kPerTensor;
  std::optional<int64_t> axis_;
  std::vector<int64_t> block_size_;
};

// N, the number of blocks per dim: shape[d] / block[d].
Shape BlockCounts(const Shape& shape, const Shape& block);

}  // namespace qparams

#endif  // QPARAMS_CORE_GRANULARITY_H_
