#include "core/range.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/granularity.h"

namespace qparams {
namespace {

// Below this many elements one thread is faster than waking the OpenMP team.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

// An IEEE binary format seen as integers. Min and max are taken on an order-preserving
// signed key (sign-magnitude folded into two's complement), so the same integer code
// serves all four dtypes and vectorizes without float compares; the exponent field,
// all ones exactly for NaN and Inf, flags non-finite values in the same pass.
template <typename BitsT, typename KeyT, BitsT kExponentMask>
struct Format {
  using Bits = BitsT;
  using Key = KeyT;
  static constexpr Bits kExponent = kExponentMask;
  static constexpr int kWidth = 8 * sizeof(Bits);

  static Key ToKey(Bits u) {
    const Key s = static_cast<Key>(u);
    return static_cast<Key>(s ^ ((s >> (kWidth - 1)) & std::numeric_limits<Key>::max()));
  }
  // The key map is its own inverse.
  static Bits FromKey(Key k) { return static_cast<Bits>(ToKey(static_cast<Bits>(k))); }
  static bool NonFinite(Bits u) { return (u & kExponent) == kExponent; }
};

using Float32Format = Format<uint32_t, int32_t, 0x7f800000u>;
using Float16Format = Format<uint16_t, int16_t, 0x7c00u>;
using BFloat16Format = Format<uint16_t, int16_t, 0x7f80u>;
using Float64Format = Format<uint64_t, int64_t, 0x7ff0000000000000ull>;

template <typename F>
inline typename F::Bits Load(const uint8_t* p, int64_t i) {
  typename F::Bits u;
  std::memcpy(&u, p + i * sizeof u, sizeof u);
  return u;
}

// Min and max keys of n contiguous elements; returns whether one was not finite.
template <typename F>
bool ReduceSpan(const uint8_t* __restrict p, int64_t n, typename F::Key& lo, typename F::Key& hi) {
  using Key = typename F::Key;
  using Bits = typename F::Bits;
  Key l = lo, h = hi;
  Bits bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Bits u = Load<F>(p, i);
    bad |= static_cast<Bits>(F::NonFinite(u));
    const Key k = F::ToKey(u);
    l = k < l ? k : l;
    h = k > h ? k : h;
  }
  lo = l;
  hi = h;
  return bad != 0;
}

// Elementwise: lo[j] = min(lo[j], key(p[j])), hi likewise, for n contiguous elements.
template <typename F>
bool CombineSpan(const uint8_t* __restrict p, int64_t n, typename F::Key* __restrict lo,
                 typename F::Key* __restrict hi) {
  using Key = typename F::Key;
  using Bits = typename F::Bits;
  Bits bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    const Bits u = Load<F>(p, j);
    bad |= static_cast<Bits>(F::NonFinite(u));
    const Key k = F::ToKey(u);
    lo[j] = k < lo[j] ? k : lo[j];
    hi[j] = k > hi[j] ? k : hi[j];
  }
  return bad != 0;
}

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

  RangeKernel(const Layout& layout, const uint8_t* data) : layout_(layout), data_(data) {}

  // Rows [r0, r1) when RowIsBlock(): stores each block's bits straight into lo/hi.
  bool StoreRows(int64_t r0, int64_t r1, uint8_t* lo, uint8_t* hi) const {
    bool bad = false;
    const int64_t n = layout_.inner;
    for (int64_t r = r0; r < r1; ++r) {
      Key l = std::numeric_limits<Key>::max(), h = std::numeric_limits<Key>::min();
      bad |= ReduceSpan<F>(data_ + r * n * sizeof(Bits), n, l, h);
      const Bits lb = F::FromKey(l), hb = F::FromKey(h);
      std::memcpy(lo + r * sizeof(Bits), &lb, sizeof lb);
      std::memcpy(hi + r * sizeof(Bits), &hb, sizeof hb);
    }
    return bad;
  }

  // Elements [e0, e1), combined into the keys already in lo/hi (any layout).
  bool Accumulate(int64_t e0, int64_t e1, Key* lo, Key* hi) const {
    const int64_t n = layout_.inner;
    const size_t outer = layout_.outer_size.size();
    std::vector<int64_t> index(outer);
    int64_t out = 0;
    for (size_t d = outer, rest = e0 / n; d-- > 0;) {
      index[d] = rest % layout_.outer_size[d];
      rest /= layout_.outer_size[d];
      out += index[d] * layout_.outer_stride[d];
    }
    bool bad = false;
    for (int64_t e = e0, j = e0 % n; e < e1; j = 0) {
      const int64_t len = std::min(n - j, e1 - e);
      const uint8_t* p = data_ + e * sizeof(Bits);
      if (layout_.inner_reduced) {
        Key l = lo[out], h = hi[out];
        bad |= ReduceSpan<F>(p, len, l, h);
        lo[out] = l;
        hi[out] = h;
      } else {
        bad |= CombineSpan<F>(p, len, lo + out + j, hi + out + j);
      }
      e += len;
      for (size_t d = outer; d-- > 0;) {  // next row: odometer over the outer dims
        out += layout_.outer_stride[d];
        if (++index[d] < layout_.outer_size[d]) break;
        out -= layout_.outer_stride[d] * layout_.outer_size[d];
        index[d] = 0;
      }
    }
    return bad;
  }

 private:
  const Layout& layout_;
  const uint8_t* data_;
};

// [begin, end) of `count` items for part `part` of `parts`, evenly.
std::pair<int64_t, int64_t> Partition(int64_t count, int part, int parts) {
  return {count * part / parts, count * (part + 1) / parts};
}

template <typename F>
bool ReduceBlocks(const TensorView& x, const Layout& layout, int64_t blocks, uint8_t* lo_out,
                  uint8_t* hi_out) {
  using Key = typename F::Key;
  const int64_t elements = x.num_elements();
  const int threads = elements >= kParallelMinElements ? omp_get_max_threads() : 1;
  const RangeKernel<F> kernel(layout, x.data());
  bool bad = false;

  if (layout.RowIsBlock() && (threads == 1 || layout.rows >= threads)) {
#pragma omp parallel num_threads(threads) reduction(|| : bad)
    {
      auto [r0, r1] = Partition(layout.rows, omp_get_thread_num(), omp_get_num_threads());
      bad = kernel.StoreRows(r0, r1, lo_out, hi_out);
    }
    return bad;
  }

  // Keys are accumulated in place of the output bits (same width), then decoded.
  Key* lo = reinterpret_cast<Key*>(lo_out);
  Key* hi = reinterpret_cast<Key*>(hi_out);
  std::fill(lo, lo + blocks, std::numeric_limits<Key>::max());
  std::fill(hi, hi + blocks, std::numeric_limits<Key>::min());
  const int64_t slices = layout.KeptOutermostSize();
  if (threads == 1 || slices >= 4 * threads || (slices >= threads && slices % threads == 0)) {
    // Threads own disjoint slices of the outermost kept dim, hence disjoint blocks.
    const int64_t slice_elements = slices > 0 ? elements / slices : elements;
#pragma omp parallel num_threads(threads) reduction(|| : bad)
    {
      auto [s0, s1] = Partition(std::max<int64_t>(slices, 1), omp_get_thread_num(),
                                omp_get_num_threads());
      bad = kernel.Accumulate(s0 * slice_elements, s1 * slice_elements, lo, hi);
    }
  } else {
    // Threads share blocks: each reduces an even share of the elements into private
    // keys, merged afterwards (the blocks are few when the outermost dim is reduced).
    std::vector<std::vector<Key>> private_lo(threads), private_hi(threads);
#pragma omp parallel num_threads(threads) reduction(|| : bad)
    {
      const int t = omp_get_thread_num();
      private_lo[t].assign(blocks, std::numeric_limits<Key>::max());
      private_hi[t].assign(blocks, std::numeric_limits<Key>::min());
      auto [e0, e1] = Partition(elements, t, omp_get_num_threads());
      bad = kernel.Accumulate(e0, e1, private_lo[t].data(), private_hi[t].data());
    }
    for (int t = 0; t < threads; ++t) {
      if (private_lo[t].empty()) continue;
      for (int64_t b = 0; b < blocks; ++b) {
        lo[b] = std::min(lo[b], private_lo[t][b]);
        hi[b] = std::max(hi[b], private_hi[t][b]);
      }
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    lo[b] = static_cast<Key>(F::FromKey(lo[b]));
    hi[b] = static_cast<Key>(F::FromKey(hi[b]));
  }
  return bad;
}

template <typename F>
int64_t FindNonFiniteTyped(const TensorView& x) {
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    if (F::NonFinite(Load<F>(x.data(), i))) return i;
  }
  return -1;
}

// Calls fn.template operator()<Format>() for the format of `dtype`.
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

int64_t FindNonFinite(const TensorView& x) {
  return DispatchFormat(x.dtype(), [&](auto format) {
    return FindNonFiniteTyped<decltype(format)>(x);
  });
}

absl::StatusOr<BlockRange> ObserveRange(const TensorView& x, const Shape& block) {
  if (x.num_elements() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.shape ", ShapeString(x.shape()), " has no elements; dims must be >= 1"));
  }
  const Shape counts = BlockCounts(x.shape(), block);
  int64_t blocks = 1;
  for (int64_t n : counts) blocks *= n;

  BlockRange range;
  for (Tensor* t : {&range.min, &range.max}) {
    t->dtype = x.dtype();
    t->shape = counts;
    t->data.resize(blocks * ItemSize(x.dtype()));
  }
  const Layout layout = Layout::Make(x.shape(), block);
  uint8_t* lo = reinterpret_cast<uint8_t*>(range.min.data.data());
  uint8_t* hi = reinterpret_cast<uint8_t*>(range.max.data.data());
  const bool bad = DispatchFormat(x.dtype(), [&](auto format) {
    return ReduceBlocks<decltype(format)>(x, layout, blocks, lo, hi);
  });
  if (bad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.data holds a NaN or infinite value (first at flat index ", FindNonFinite(x),
        "); only finite values can be observed"));
  }
  return range;
}

}  // namespace qparams
