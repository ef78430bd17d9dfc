#include "core/range.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/granularity.h"
#include "core/range_kernels.h"

namespace qparams {
namespace {

using range_internal::BFloat16Format;
using range_internal::Float16Format;
using range_internal::Float32Format;
using range_internal::Float64Format;

// Below this many elements one thread is faster than waking the OpenMP team.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

// SetRangeThreads; 0 = omp_get_max_threads().
std::atomic<int> range_threads{0};
// Threads take work in chunks of about this many elements, first come first served,
// so that a core slowed by other load does not hold the other back.
constexpr int64_t kChunkElements = int64_t{1} << 22;

// The reduction as a row-major walk. Each dim is kept (block size 1), reduced (one
// block spans it) or split into a kept count and a reduced block; adjacent dims of
// the same kind and dims of size 1 are merged away. What remains is a sequence of
// "rows" along the innermost dim, each reduced into one block (inner_reduced) or
// combined elementwise into a run of blocks.
struct Layout {
  std::vector<int64_t> outer_size;    // outer dims, outermost first
  std::vector<int64_t> outer_stride;  // their stride in the output; 0 for reduced dims
  int64_t inner = 1;
  bool inner_reduced = true;
  int reduced_dims = 0;
  int64_t rows = 1;

  static Layout Make(const Shape& shape, const Shape& block) {
    std::vector<std::pair<int64_t, bool>> dims;  // (size, reduced)
    auto push = [&dims](int64_t size, bool reduced) {
      if (size == 1) return;
      if (!dims.empty() && dims.back().second == reduced) {
        dims.back().first *= size;
      } else {
        dims.emplace_back(size, reduced);
      }
    };
    for (size_t d = 0; d < shape.size(); ++d) {
      if (block[d] == 1) {
        push(shape[d], false);
      } else if (block[d] == shape[d]) {
        push(shape[d], true);
      } else {
        push(shape[d] / block[d], false);
        push(block[d], true);
      }
    }
    if (dims.empty()) dims.emplace_back(1, true);

    Layout layout;
    layout.inner = dims.back().first;
    layout.inner_reduced = dims.back().second;
    int64_t stride = layout.inner_reduced ? 1 : layout.inner;
    layout.outer_size.resize(dims.size() - 1);
    layout.outer_stride.resize(dims.size() - 1);
    for (size_t i = dims.size() - 1; i-- > 0;) {
      layout.outer_size[i] = dims[i].first;
      layout.outer_stride[i] = dims[i].second ? 0 : stride;
      if (!dims[i].second) stride *= dims[i].first;
      layout.rows *= dims[i].first;
    }
    for (const auto& d : dims) layout.reduced_dims += d.second ? 1 : 0;
    return layout;
  }

  // Every row is exactly one block, and rows map to blocks in order.
  bool RowIsBlock() const { return inner_reduced && reduced_dims == 1; }
  // The outermost dim, if it is kept: slicing it splits the output without overlap.
  int64_t KeptOutermostSize() const {
    if (outer_size.empty()) return inner_reduced ? 0 : inner;
    return outer_stride[0] != 0 ? outer_size[0] : 0;
  }
};

template <typename F>
class RangeKernel {
 public:
  using Bits = typename F::Bits;
  using Key = typename F::Key;

  RangeKernel(const Layout& layout, const uint8_t* data)
      : layout_(layout), data_(data), kernels_(range_internal::BestKernels<F>()) {}

  // Rows [r0, r1) when RowIsBlock(): stores each block's bits straight into lo/hi.
  // Returns whether a block holds a non-finite value.
  bool StoreRows(int64_t r0, int64_t r1, uint8_t* lo, uint8_t* hi) const {
    return kernels_.store_rows(data_, layout_.inner, r0, r1, lo, hi);
  }

  // Elements [e0, e1), combined into the keys already in lo/hi (any layout).
  void Accumulate(int64_t e0, int64_t e1, Key* lo, Key* hi) const {
    const int64_t n = layout_.inner;
    const size_t outer = layout_.outer_size.size();
    std::vector<int64_t> index(outer);
    int64_t out = 0;
    for (size_t d = outer, rest = e0 / n; d-- > 0;) {
      index[d] = rest % layout_.outer_size[d];
      rest /= layout_.outer_size[d];
      out += index[d] * layout_.outer_stride[d];
    }
    // Consecutive whole rows of a reduced dim fold into the same run of blocks.
    const bool batch_rows = !layout_.inner_reduced && outer > 0 && layout_.outer_stride.back() == 0;
    for (int64_t e = e0, j = e0 % n; e < e1; j = 0) {
      const uint8_t* p = data_ + e * sizeof(Bits);
      int64_t rows = 1;
      if (layout_.inner_reduced) {
        const int64_t len = std::min(n - j, e1 - e);
        kernels_.reduce_span(p, len, lo[out], hi[out]);
        e += len;
      } else if (j == 0 && batch_rows && e1 - e >= n) {
        rows = std::min(layout_.outer_size.back() - index.back(), (e1 - e) / n);
        kernels_.combine_rows(p, n, rows, lo + out, hi + out);
        e += rows * n;
      } else {
        const int64_t len = std::min(n - j, e1 - e);
        kernels_.combine_rows(p, len, 1, lo + out + j, hi + out + j);
        e += len;
      }
      Advance(rows, index, out);
    }
  }

 private:
  // Moves the odometer over the outer dims `rows` rows on; `rows` never runs past
  // the end of the innermost outer dim.
  void Advance(int64_t rows, std::vector<int64_t>& index, int64_t& out) const {
    if (index.empty()) return;
    size_t d = index.size() - 1;
    index[d] += rows;
    out += rows * layout_.outer_stride[d];
    while (index[d] == layout_.outer_size[d]) {
      out -= layout_.outer_stride[d] * layout_.outer_size[d];
      index[d] = 0;
      if (d == 0) return;
      --d;
      out += layout_.outer_stride[d];
      ++index[d];
    }
  }

  const Layout& layout_;
  const uint8_t* data_;
  const range_internal::Kernels<F>& kernels_;
};

// [begin, end) of `count` items for part `part` of `parts`, evenly.
std::pair<int64_t, int64_t> Partition(int64_t count, int64_t part, int64_t parts) {
  return {count * part / parts, count * (part + 1) / parts};
}

// Runs chunk(c) for every c in [0, chunks), first come first served on `threads`
// OpenMP threads; returns whether any returned true. One thread runs them inline:
// starting even a one-thread OpenMP team costs more than the pass of a small tensor.
template <typename Chunk>
bool ForEachChunk(int threads, int64_t chunks, const Chunk& chunk) {
  bool any = false;
  if (threads == 1) {
    for (int64_t c = 0; c < chunks; ++c) any = chunk(c) || any;
    return any;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic) reduction(|| : any)
  for (int64_t c = 0; c < chunks; ++c) any = chunk(c) || any;
  return any;
}

// Fills lo_out/hi_out (`blocks` values of F::Bits each) with the block minima and
// maxima of x; returns whether a block holds a non-finite value.
template <typename F>
bool ReduceBlocks(const TensorView& x, const Layout& layout, int64_t blocks, uint8_t* lo_out,
                  uint8_t* hi_out) {
  using Key = typename F::Key;
  const int64_t elements = x.num_elements();
  const int threads = RangeThreadsFor(elements);
  const RangeKernel<F> kernel(layout, x.data());

  // How many chunks to cut `count` units of work into.
  auto chunks_of = [&](int64_t count) {
    return std::max<int64_t>(
        1, std::min(count, std::max<int64_t>(threads, elements / kChunkElements)));
  };

  if (layout.RowIsBlock() && (threads == 1 || layout.rows >= threads)) {
    const int64_t chunks = chunks_of(layout.rows);
    return ForEachChunk(threads, chunks, [&](int64_t c) {
      auto [r0, r1] = Partition(layout.rows, c, chunks);
      return kernel.StoreRows(r0, r1, lo_out, hi_out);
    });
  }

  // Keys are accumulated in place of the output bits (same width), then decoded.
  Key* lo = reinterpret_cast<Key*>(lo_out);
  Key* hi = reinterpret_cast<Key*>(hi_out);
  std::fill(lo, lo + blocks, F::kMaxKey);
  std::fill(hi, hi + blocks, F::kMinKey);
  const int64_t slices = layout.KeptOutermostSize();
  if (threads == 1 || slices >= 2 * threads) {
    // Threads own disjoint slices of the outermost kept dim, hence disjoint blocks.
    const int64_t count = std::max<int64_t>(slices, 1);
    const int64_t slice_elements = elements / count;
    const int64_t chunks = chunks_of(count);
    ForEachChunk(threads, chunks, [&](int64_t c) {
      auto [s0, s1] = Partition(count, c, chunks);
      kernel.Accumulate(s0 * slice_elements, s1 * slice_elements, lo, hi);
      return false;
    });
  } else {
    // Threads share blocks: each reduces the chunks it takes into private keys,
    // merged afterwards (the blocks are few when the outermost dim is reduced).
    std::vector<std::vector<Key>> private_lo(threads), private_hi(threads);
    const int64_t chunks = chunks_of(elements);
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      private_lo[t].assign(blocks, F::kMaxKey);
      private_hi[t].assign(blocks, F::kMinKey);
#pragma omp for schedule(dynamic)
      for (int64_t c = 0; c < chunks; ++c) {
        auto [e0, e1] = Partition(elements, c, chunks);
        kernel.Accumulate(e0, e1, private_lo[t].data(), private_hi[t].data());
      }
    }
    for (int t = 0; t < threads; ++t) {
      if (private_lo[t].empty()) continue;
      for (int64_t b = 0; b < blocks; ++b) {
        lo[b] = std::min(lo[b], private_lo[t][b]);
        hi[b] = std::max(hi[b], private_hi[t][b]);
      }
    }
  }
  bool bad = false;
  for (int64_t b = 0; b < blocks; ++b) {
    bad |= F::NonFinite(lo[b], hi[b]);
    lo[b] = static_cast<Key>(F::FromKey(lo[b]));
    hi[b] = static_cast<Key>(F::FromKey(hi[b]));
  }
  return bad;
}

template <typename F>
int64_t FindNonFiniteTyped(const TensorView& x) {
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    if (F::NonFinite(F::Load(x.data(), i))) return i;
  }
  return -1;
}

// Calls fn(Format()) with the binary format of `dtype`.
template <typename Fn>
auto DispatchFormat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16:
      return fn(Float16Format());
    case DType::kBFloat16:
      return fn(BFloat16Format());
    case DType::kFloat64:
      return fn(Float64Format());
    case DType::kFloat32:
      break;
  }
  return fn(Float32Format());
}

}  // namespace

void SetRangeThreads(int threads) {
  range_threads.store(std::max(threads, 0), std::memory_order_relaxed);
}

int RangeThreadsFor(int64_t elements) {
  if (elements < kParallelMinElements) return 1;
  const int configured = range_threads.load(std::memory_order_relaxed);
  return configured > 0 ? configured : omp_get_max_threads();
}

int64_t FindNonFinite(const TensorView& x) {
  return DispatchFormat(x.dtype(),
                        [&](auto format) { return FindNonFiniteTyped<decltype(format)>(x); });
}

absl::StatusOr<BlockRange> ObserveRange(const TensorView& x, const Shape& block) {
  if (x.num_elements() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shape ", ShapeString(x.shape()),
                                                   " has no elements; dims must be >= 1"));
  }
  const Shape counts = BlockCounts(x.shape(), block);
  int64_t blocks = 1;
  for (int64_t n : counts) blocks *= n;

  BlockRange range;
  for (Tensor* t : {&range.min, &range.max}) {
    t->dtype = x.dtype();
    t->shape = counts;
    t->data = Bytes::Uninitialized(blocks * ItemSize(x.dtype()));
  }
  const Layout layout = Layout::Make(x.shape(), block);
  uint8_t* lo = reinterpret_cast<uint8_t*>(range.min.data.data());
  uint8_t* hi = reinterpret_cast<uint8_t*>(range.max.data.data());
  const bool bad = DispatchFormat(x.dtype(), [&](auto format) {
    return ReduceBlocks<decltype(format)>(x, layout, blocks, lo, hi);
  });
  if (bad) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.data holds a NaN or infinite value (first at flat index ",
                     FindNonFinite(x), "); only finite values can be observed"));
  }
  return range;
}

absl::StatusOr<BlockRange> MergeBlockRanges(const BlockRange& a, const BlockRange& b) {
  if (a.min.dtype != b.min.dtype || a.min.shape != b.min.shape ||
      a.max.dtype != b.max.dtype || a.max.shape != b.max.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block ranges of dtypes ", DTypeName(a.min.dtype), " and ", DTypeName(b.min.dtype),
        ", shapes ", ShapeString(a.min.shape), " and ", ShapeString(b.min.shape),
        " do not merge: they must be alike"));
  }
  BlockRange merged = a;
  const TensorView a_min = a.min.view(), a_max = a.max.view();
  const TensorView b_min = b.min.view(), b_max = b.max.view();
  const int item = ItemSize(a.min.dtype);
  for (int64_t i = 0; i < a_min.num_elements(); ++i) {
    // Ties of -0 and +0 compare equal as values; signbit breaks them.
    const double x = a_min.ValueAt(i), y = b_min.ValueAt(i);
    if (y < x || (y == x && std::signbit(y) && !std::signbit(x))) {
      std::copy_n(b_min.data() + i * item, item, merged.min.data.data() + i * item);
    }
    const double u = a_max.ValueAt(i), v = b_max.ValueAt(i);
    if (v > u || (v == u && !std::signbit(v) && std::signbit(u))) {
      std::copy_n(b_max.data() + i * item, item, merged.max.data.data() + i * item);
    }
  }
  return merged;
}

}  // namespace qparams
