// The `minmax` range calculator: the raw minimum and maximum of every block of a
// tensor (semantics.md §2.2), computed in one fused pass.

#ifndef QPARAMS_CORE_RANGE_H_
#define QPARAMS_CORE_RANGE_H_

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace qparams {

// Per-block minima and maxima, in the observed tensor's dtype and of shape N (the
// block counts). Values are the observed ones, with no clamping to include 0.
struct BlockRange {
  Tensor min;
  Tensor max;
};

// Computes the min and max of every block of `x`, where `block` is the block-size
// vector of x's granularity (Granularity::BlockShape), in one pass over the data that
// also looks for non-finite values. Runs on OpenMP threads for large tensors.
// INVALID_ARGUMENT if x has no elements or holds a NaN, +Inf or -Inf.
absl::StatusOr<BlockRange> ObserveRange(const TensorView& x, const Shape& block);

// The block range of the concatenation of two inputs along an axis every block spans
// whole (the batch axis of a per_tensor, per_channel or per_block [-1, ...]
// granularity): the elementwise minimum of the minima and maximum of the maxima,
// exact in any dtype. Between an equal -0 and +0 the minimum takes -0 and the maximum
// +0, so that the result does not depend on which range comes first.
// INVALID_ARGUMENT if the two differ in dtype or shape.
absl::StatusOr<BlockRange> MergeBlockRanges(const BlockRange& a, const BlockRange& b);

// How many OpenMP threads a large range pass uses: `threads` >= 1, or 0 for OpenMP's
// default. Process-wide, because a server runs passes on threads OpenMP did not
// create, which would not see an omp_set_num_threads of the main thread.
void SetRangeThreads(int threads);

// The OpenMP threads a pass over `elements` values uses: 1 below the size where a
// team pays off, else SetRangeThreads' setting. The histogram calculators' binning
// and searches share it.
int RangeThreadsFor(int64_t elements);

// The position of the first NaN or infinite value of `x`, or -1 if all are finite.
int64_t FindNonFinite(const TensorView& x);

}  // namespace qparams

#endif  // QPARAMS_CORE_RANGE_H_
