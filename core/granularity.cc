#include "core/granularity.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qparams {
namespace {

// Python-style axis normalisation: valid when -rank <= axis < rank.
absl::StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank, absl::string_view field) {
  if (axis < -rank || axis >= rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", axis,
                                                   " is out of the allowed range [", -rank, ", ",
                                                   rank, ") for an input of rank ", rank));
  }
  return axis < 0 ? axis + rank : axis;
}

}  // namespace

absl::string_view TargetName(Target target) {
  return target == Target::kActivation ? "activation" : "weight";
}

Granularity Granularity::PerTensor() { return Granularity(); }

Granularity Granularity::PerChannel(int64_t axis) {
  Granularity g;
  g.kind_ = Kind::kPerChannel;
  g.axis_ = axis;
  return g;
}

Granularity Granularity::PerBlock(int64_t axis, int64_t block_size) {
  return PerBlock(std::optional<int64_t>(axis), {block_size});
}

Granularity Granularity::PerBlock(std::vector<int64_t> block_size) {
  return PerBlock(std::nullopt, std::move(block_size));
}

Granularity Granularity::PerBlock(std::optional<int64_t> axis, std::vector<int64_t> block_size) {
  Granularity g;
  g.kind_ = Kind::kPerBlock;
  g.axis_ = axis;
  g.block_size_ = std::move(block_size);
  return g;
}

absl::Status Granularity::Validate() const {
  if (kind_ != Kind::kPerBlock) return absl::OkStatus();
  if (block_size_.empty()) {
    return absl::InvalidArgumentError(
        "granularity.per_block.block_size is empty; give one size per dim (-1 = whole dim), "
        "or an axis and one size");
  }
  for (size_t i = 0; i < block_size_.size(); ++i) {
    if (block_size_[i] == 0 || block_size_[i] < -1) {
      return absl::InvalidArgumentError(absl::StrCat("granularity.per_block.block_size[", i,
                                                     "] is ", block_size_[i],
                                                     "; block sizes must be >= 1, or -1 for a "
                                                     "whole dim"));
    }
  }
  if (axis_.has_value() && (block_size_.size() != 1 || block_size_[0] < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "granularity.per_block: with an axis, block_size must hold exactly one positive size "
        "(got ",
        block_size_.size(), " entries); leave axis unset for one size per dim"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Shape> Granularity::BlockShape(const Shape& shape, Target target) const {
  if (absl::Status valid = Validate(); !valid.ok()) return valid;
  const int64_t rank = static_cast<int64_t>(shape.size());
  Shape block = shape;
  switch (kind_) {
    case Kind::kPerTensor:
      return block;
    case Kind::kPerChannel: {
      absl::StatusOr<int64_t> a = NormalizeAxis(*axis_, rank, "granularity.per_channel.axis");
      if (!a.ok()) return a.status();
      block[*a] = 1;
      return block;
    }
    case Kind::kPerBlock:
      break;
  }
  if (axis_.has_value()) {
    absl::StatusOr<int64_t> a = NormalizeAxis(*axis_, rank, "granularity.per_block.axis");
    if (!a.ok()) return a.status();
    const int64_t b = block_size_[0];
    if (shape[*a] % b != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("block size mismatch: dim ", *a, " of the input (size ", shape[*a],
                       ") is not divisible by granularity.per_block.block_size ", b));
    }
    // Weights block the two leading (channel) axes only; activations every other axis.
    const int64_t leading = target == Target::kActivation ? rank : std::min<int64_t>(2, rank);
    for (int64_t i = 0; i < leading; ++i) block[i] = 1;
    block[*a] = b;
    return block;
  }
  if (static_cast<int64_t>(block_size_.size()) != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("granularity.per_block.block_size has ", block_size_.size(),
                     " entries but the input has rank ", rank, " (shape ", ShapeString(shape),
                     "); give one size per dim"));
  }
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t b = block_size_[d];
    if (b == -1) continue;
    if (shape[d] % b != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block size mismatch: dim ", d, " of the input shape ", ShapeString(shape),
          " is not divisible by granularity.per_block.block_size ", ShapeString(block_size_)));
    }
    block[d] = b;
  }
  return block;
}

std::string Granularity::ToString() const {
  switch (kind_) {
    case Kind::kPerTensor:
      return "per_tensor";
    case Kind::kPerChannel:
      return absl::StrCat("per_channel(axis=", *axis_, ")");
    case Kind::kPerBlock:
      if (axis_.has_value() && block_size_.size() == 1) {
        return absl::StrCat("per_block(axis=", *axis_, ", block_size=", block_size_[0], ")");
      }
      return absl::StrCat(
          "per_block(", axis_.has_value() ? absl::StrCat("axis=", *axis_, ", ") : "",
          "block_size=(", absl::StrJoin(block_size_, ", "), block_size_.size() == 1 ? ",))" : "))");
  }
  return "";
}

Shape BlockCounts(const Shape& shape, const Shape& block) {
  Shape counts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) counts[d] = block[d] == 0 ? 0 : shape[d] / block[d];
  return counts;
}

}  // namespace qparams
