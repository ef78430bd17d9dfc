#include "core/histogram.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/dtype.h"
#include "core/range.h"
#include "core/range_kernels.h"

namespace qparams {
namespace {

using uint128 = unsigned __int128;

int Log2(int num_bins) { return __builtin_ctz(static_cast<unsigned>(num_bins)); }

// "0x1.d333340000000p+2": doubles in messages as the vectors write them.
std::string Hex(double v) { return absl::StrFormat("%a", v); }

// A count sum beyond uint64 (only a 128-bit sum of a bad payload is).
std::string CountString(uint128 v) {
  if (v > std::numeric_limits<uint64_t>::max()) return "more than 2^64";
  return absl::StrCat(static_cast<uint64_t>(v));
}

absl::Status RuleError(absl::string_view rule, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " (histogram.md §3.2 rule ", rule, ")"));
}

// +0.0 for a zero extreme: extrema compare by value, so the canonical form drops -0.
double CanonicalZero(double v) { return v == 0 ? 0.0 : v; }

// The element loaders: element i of the raw data widened exactly to the type it is
// scaled in (§2.3: float32 for the 16- and 32-bit formats, float64 for float64).
template <typename T>
T Same(T v) {
  return v;
}
template <typename Stored, typename R, R (*Widen)(Stored)>
struct Loader {
  using Real = R;
  static R Load(const uint8_t* p, int64_t i) {
    Stored v;
    std::memcpy(&v, p + sizeof v * i, sizeof v);
    return Widen(v);
  }
};
using Float32Load = Loader<float, float, Same<float>>;
using Float16Load = Loader<uint16_t, float, HalfToFloat>;
using BFloat16Load = Loader<uint16_t, float, BFloat16ToFloat>;
using Float64Load = Loader<double, double, Same<double>>;

template <typename Fn>
auto DispatchLoad(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16:
      return fn(Float16Load());
    case DType::kBFloat16:
      return fn(BFloat16Load());
    case DType::kFloat64:
      return fn(Float64Load());
    case DType::kFloat32:
      break;
  }
  return fn(Float32Load());
}

// What the first pass over a tensor finds: everything but the bins.
struct Scan {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  uint64_t zero_count = 0, negative_count = 0;
  uint64_t nan_count = 0, posinf_count = 0, neginf_count = 0;

  void Add(const Scan& o) {
    min = std::min(min, o.min);
    max = std::max(max, o.max);
    zero_count += o.zero_count;
    negative_count += o.negative_count;
    nan_count += o.nan_count;
    posinf_count += o.posinf_count;
    neginf_count += o.neginf_count;
  }
};

// Thread t of `threads` takes the elements [Begin(t), Begin(t + 1)).
int64_t Begin(int64_t n, int threads, int t) {
  return static_cast<int64_t>(static_cast<uint128>(n) * t / threads);
}

template <typename L>
Scan ScanRange(const uint8_t* data, int64_t begin, int64_t end) {
  Scan s;
  for (int64_t i = begin; i < end; ++i) {
    const double v = L::Load(data, i);
    if (std::isnan(v)) {
      ++s.nan_count;
    } else if (std::isinf(v)) {
      ++(v > 0 ? s.posinf_count : s.neginf_count);
    } else {
      s.min = std::min(s.min, v);
      s.max = std::max(s.max, v);
      s.zero_count += v == 0;
      s.negative_count += v < 0;
    }
  }
  return s;
}

// The scan of a tensor whose values are all finite, by the range pass (AVX2 where
// the CPU has it): its min and max, exact in any dtype; zero_count and
// negative_count are left to the bin pass. Nothing for a tensor with a non-finite
// value, which ScanRange then counts.
template <typename L>
std::optional<Scan> ScanFinite(const TensorView& x) {
  absl::StatusOr<BlockRange> range = ObserveRange(x, x.shape());
  if (!range.ok()) return std::nullopt;
  Scan s;
  s.min = L::Load(range->min.view().data(), 0);
  s.max = L::Load(range->max.view().data(), 0);
  return s;
}

// What the bin pass counts besides the bins when the scan did not.
struct Signs {
  uint64_t zero_count = 0, negative_count = 0;
};

// How many sets of counters the bin pass of `elements` values into m bins spreads
// its increments over: four independent read-modify-write chains where one would
// stall on runs of values in the same bin, once the values outnumber the counters
// that must be zeroed and added up.
int CounterSets(int64_t elements, int64_t m) { return elements >= 16 * m ? 4 : 1; }

// A block of all-finite float32 values: the bins floor(|x|·scale), exact (a product
// >= 1 is a normal number times a power of two, one below 1 floors to 0 even if it
// underflowed), and the zeros and negatives, counted in 32 bits so that the loop
// vectorizes with lanes of the bins' width. The hot loop of binning, compiled twice.
struct BlockSigns {
  int32_t zeros = 0, negatives = 0;
};
__attribute__((always_inline)) inline BlockSigns BinFloat32Block(const uint8_t* data, int len,
                                                                 float scale, int32_t* bins) {
  BlockSigns signs;
  for (int j = 0; j < len; ++j) {
    float v;
    __builtin_memcpy(&v, data + 4 * j, 4);
    signs.zeros += v == 0;
    signs.negatives += v < 0;
    bins[j] = static_cast<int32_t>(__builtin_fabsf(v) * scale);
  }
  return signs;
}
BlockSigns BinFloat32BlockPortable(const uint8_t* data, int len, float scale, int32_t* bins) {
  return BinFloat32Block(data, len, scale, bins);
}
// Twice the portable loop's rate (8 lanes); only where the CPU has AVX2 (the range
// pass's detection and cap, range_kernels.h).
__attribute__((target("avx2"))) BlockSigns BinFloat32BlockAvx2(const uint8_t* data, int len,
                                                                float scale, int32_t* bins) {
  return BinFloat32Block(data, len, scale, bins);
}
using BlockBinner = BlockSigns (*)(const uint8_t*, int, float, int32_t*);
BlockBinner BestBlockBinner() {
  using range_internal::KernelLevel;
  static const KernelLevel detected = range_internal::DetectedKernelLevel();
  return std::min(detected, range_internal::kernel_level_cap.load()) == KernelLevel::kAvx2
             ? BinFloat32BlockAvx2
             : BinFloat32BlockPortable;
}

// Adds floor(|x|·2^-e) of every finite x in [begin, end) to the counters: value j of
// a block goes to sets[j % count], each set m counters plus one at index m for the
// values skipped (NaN and infinities under kIgnore). The bins of a block are computed
// first (a loop that vectorizes), then counted. With kCountSigns (every value finite)
// also counts zeros and negatives.
template <typename L, bool kCountSigns>
Signs BinRange(const uint8_t* data, int64_t begin, int64_t end, typename L::Real scale,
               typename L::Real amax, int64_t m, uint64_t* const* sets, int count) {
  [[maybe_unused]] const BlockBinner binner = BestBlockBinner();
  using Real = typename L::Real;
  constexpr int kBlock = 256;
  int32_t bins[kBlock];
  Signs signs;
  for (int64_t i = begin; i < end; i += kBlock) {
    const int len = static_cast<int>(std::min<int64_t>(kBlock, end - i));
    // 32-bit counts within a block: the loop vectorizes with lanes of the bins' width.
    int32_t zeros = 0, negatives = 0;
    if constexpr (kCountSigns && std::is_same_v<L, Float32Load>) {
      const BlockSigns block = binner(data + sizeof(float) * i, len, scale, bins);
      zeros = block.zeros;
      negatives = block.negatives;
    } else {
      for (int j = 0; j < len; ++j) {
        const Real v = L::Load(data, i + j);
        const Real a = std::fabs(v);
        if constexpr (kCountSigns) {
          zeros += v == 0;
          negatives += v < 0;
          // Exact: a product >= 1 is a normal number times a power of two, one below
          // 1 floors to 0 even if it underflowed; it is below num_bins <= 2^16.
          bins[j] = static_cast<int32_t>(a * scale);
        } else {
          bins[j] = static_cast<int32_t>(a <= amax ? a * scale : static_cast<Real>(m));
        }
      }
    }
    signs.zero_count += zeros;
    signs.negative_count += negatives;
    int j = 0;
    if (count == 4) {
      for (; j + 4 <= len; j += 4) {
        ++sets[0][bins[j]];
        ++sets[1][bins[j + 1]];
        ++sets[2][bins[j + 2]];
        ++sets[3][bins[j + 3]];
      }
    }
    for (; j < len; ++j) ++sets[0][bins[j]];
  }
  return signs;
}

template <typename L>
absl::StatusOr<Histogram> BinTensorAs(const TensorView& x, int num_bins, NonFinitePolicy policy) {
  using Real = typename L::Real;
  const int64_t n = x.num_elements();
  const uint8_t* data = x.data();
  const int threads = static_cast<int>(std::min<int64_t>(RangeThreadsFor(n), n));

  std::optional<Scan> finite = ScanFinite<L>(x);
  const bool count_signs = finite.has_value();
  Scan scan;
  if (finite.has_value()) {
    scan = *finite;
  } else if (threads == 1) {
    scan = ScanRange<L>(data, 0, n);
  } else {
    std::vector<Scan> partial(threads);
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      partial[t] = ScanRange<L>(data, Begin(n, threads, t), Begin(n, threads, t + 1));
    }
    for (const Scan& s : partial) scan.Add(s);
  }

  if (policy == NonFinitePolicy::kReject &&
      scan.nan_count + scan.posinf_count + scan.neginf_count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor holds ", scan.nan_count, " NaN, ", scan.posinf_count, " +Inf and ",
        scan.neginf_count, " -Inf values; under nonfinite=reject only finite values can be "
                           "observed (histogram.md §5.3)"));
  }
  Histogram h = Histogram::Empty(num_bins);
  h.nan_count = scan.nan_count;
  h.posinf_count = scan.posinf_count;
  h.neginf_count = scan.neginf_count;
  if (scan.min > scan.max) return h;  // no finite value

  const double amax = std::max(std::fabs(scan.min), std::fabs(scan.max));
  if (!(amax < kHistogramMagnitudeLimit)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor holds a float64 value of magnitude ", Hex(amax),
                     "; binned magnitudes must be below 2^128 (histogram.md §2.3)"));
  }
  h.min = CanonicalZero(scan.min);
  h.max = CanonicalZero(scan.max);
  h.zero_count = scan.zero_count;
  h.negative_count = scan.negative_count;
  h.exponent = CanonicalExponent(amax, num_bins);
  const int64_t m = OccupiedBins(amax, num_bins);
  // 2^-e fits float32 here: -126 <= e <= 128 - 8.
  const Real scale = static_cast<Real>(std::ldexp(1.0, -h.exponent));
  const Real real_amax = static_cast<Real>(amax);
  // Each thread's sets of counters (m bins and the skipped slot), added up after:
  // integer counts add in any order.
  const int64_t per_thread = (n + threads - 1) / threads;
  const int sets = CounterSets(per_thread, m);
  std::vector<std::vector<uint64_t>> counters(static_cast<size_t>(threads) * sets);
  std::vector<Signs> signs(threads);
  auto bin = [&](int t) {
    uint64_t* own[4];
    for (int k = 0; k < sets; ++k) {
      std::vector<uint64_t>& c = counters[static_cast<size_t>(t) * sets + k];
      c.assign(m + 1, 0);
      own[k] = c.data();
    }
    const int64_t begin = Begin(n, threads, t), end = Begin(n, threads, t + 1);
    signs[t] = count_signs
                   ? BinRange<L, true>(data, begin, end, scale, real_amax, m, own, sets)
                   : BinRange<L, false>(data, begin, end, scale, real_amax, m, own, sets);
  };
  if (threads == 1) {
    bin(0);
  } else {
#pragma omp parallel num_threads(threads)
    bin(omp_get_thread_num());
  }
  h.counts.assign(m, 0);
  for (const std::vector<uint64_t>& c : counters) {
    for (int64_t k = 0; k < m; ++k) h.counts[k] += c[k];
  }
  if (count_signs) {
    for (const Signs& s : signs) {
      h.zero_count += s.zero_count;
      h.negative_count += s.negative_count;
    }
  }
  return h;
}

// The rules of §3.2; `state` relaxes rule 5 and adds the canonical form.
absl::Status Check(const Histogram& h, int num_bins, NonFinitePolicy policy, bool state) {
  if (h.num_bins != num_bins) {
    return RuleError("1", absl::StrCat("histogram.num_bins is ", h.num_bins,
                                       "; it must equal the session's num_bins ", num_bins));
  }
  if (h.counts.size() > static_cast<size_t>(num_bins)) {
    return RuleError("2", absl::StrCat("histogram.counts holds ", h.counts.size(),
                                       " entries; at most num_bins = ", num_bins));
  }
  uint128 finite = 0;
  for (uint64_t c : h.counts) finite += c;
  const uint128 nonfinite = uint128{h.nan_count} + h.posinf_count + h.neginf_count;
  if (finite + nonfinite >= kHistogramValueLimit) {
    return RuleError("3", absl::StrCat("histogram holds ", CountString(finite + nonfinite),
                                       " values (sum of counts, nan_count, posinf_count and "
                                       "neginf_count); it must hold fewer than 2^62"));
  }
  if (policy == NonFinitePolicy::kReject) {
    for (auto [field, count] : {std::pair{"nan_count", h.nan_count},
                                std::pair{"posinf_count", h.posinf_count},
                                std::pair{"neginf_count", h.neginf_count}}) {
      if (count != 0) {
        return RuleError("4", absl::StrCat("histogram.", field, " is ", count,
                                           "; non-finite values are refused under "
                                           "nonfinite=reject"));
      }
    }
  }
  if (!state && finite + nonfinite == 0) {
    return RuleError("5", "histogram holds no value; it must count at least one");
  }
  if (h.min.has_value() != h.max.has_value()) {
    return RuleError("6", absl::StrCat("histogram.", h.min ? "min" : "max", " is set but ",
                                       h.min ? "max" : "min", " is not; both or neither"));
  }
  if (!h.min.has_value()) {
    if (finite != 0 || h.zero_count != 0 || h.negative_count != 0) {
      return RuleError("7", absl::StrCat("histogram.min and max are unset (no finite value) "
                                         "but counts sum to ",
                                         CountString(finite), ", zero_count is ", h.zero_count,
                                         " and negative_count is ", h.negative_count,
                                         "; all must be 0"));
    }
    if (h.exponent != kMinBinExponent) {
      return RuleError("7", absl::StrCat("histogram.exponent is ", h.exponent,
                                         "; without a finite value it must be -126"));
    }
    return absl::OkStatus();
  }

  const double min = *h.min, max = *h.max;
  if (!std::isfinite(min) || !std::isfinite(max)) {
    return RuleError("8.1", absl::StrCat("histogram.min ", Hex(min), " and max ", Hex(max),
                                         " must both be finite"));
  }
  if (!(min <= max)) {
    return RuleError("8.1", absl::StrCat("histogram.min ", Hex(min), " exceeds max ", Hex(max)));
  }
  const double amax = h.amax();
  if (!(amax < kHistogramMagnitudeLimit)) {
    return RuleError("8.1", absl::StrCat("histogram amax = max(|min|, |max|) is ", Hex(amax),
                                         "; it must be below 2^128"));
  }
  const int exponent = CanonicalExponent(amax, num_bins);
  if (h.exponent != exponent) {
    return RuleError("8.2", absl::StrCat("histogram.exponent is ", h.exponent,
                                         "; canonical_exponent(amax ", Hex(amax), ", num_bins ",
                                         num_bins, ") is ", exponent));
  }
  const int64_t m = OccupiedBins(amax, num_bins);
  auto count = [&h](int64_t k) { return k < static_cast<int64_t>(h.counts.size()) ? h.counts[k] : 0; };
  if (count(m - 1) == 0) {
    return RuleError("8.3", absl::StrCat("histogram.counts[", m - 1, "] is 0, but it is the bin of amax ",
                                         Hex(amax), " and must be occupied"));
  }
  for (size_t k = m; k < h.counts.size(); ++k) {
    if (h.counts[k] != 0) {
      return RuleError("8.3", absl::StrCat("histogram.counts[", k, "] is ", h.counts[k],
                                           "; bins after that of amax (", m - 1,
                                           ") must be empty"));
    }
  }
  if (h.zero_count > count(0)) {
    return RuleError("8.4", absl::StrCat("histogram.zero_count ", h.zero_count,
                                         " exceeds counts[0] = ", count(0)));
  }
  if (h.negative_count > finite) {
    return RuleError("8.4", absl::StrCat("histogram.negative_count ", h.negative_count,
                                         " exceeds the finite values counted, ",
                                         CountString(finite)));
  }
  if ((h.negative_count > 0) != (min < 0)) {
    return RuleError("8.5", absl::StrCat("histogram.negative_count is ", h.negative_count,
                                         " but min is ", Hex(min),
                                         "; negative_count > 0 exactly when min < 0"));
  }
  if (state) {
    if (h.counts.size() != static_cast<size_t>(m)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state.histogram.counts holds ", h.counts.size(), " entries; a session's holds M = ", m));
    }
    if (std::signbit(min) || std::signbit(max)) {
      if (min == 0 || max == 0) {
        return absl::InvalidArgumentError(
            "state.histogram: a session stores a zero extreme as +0.0");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view NonFinitePolicyName(NonFinitePolicy policy) {
  return policy == NonFinitePolicy::kIgnore ? "ignore" : "reject";
}

absl::StatusOr<NonFinitePolicy> ParseNonFinitePolicy(absl::string_view name) {
  if (name == "reject") return NonFinitePolicy::kReject;
  if (name == "ignore") return NonFinitePolicy::kIgnore;
  return absl::InvalidArgumentError(
      absl::StrCat("nonfinite is \"", name, "\"; it must be \"reject\" or \"ignore\""));
}

int CanonicalExponent(double amax, int num_bins) {
  if (amax == 0) return kMinBinExponent;
  int k;
  std::frexp(amax, &k);  // exact: amax = f·2^k, 0.5 <= f < 1
  return std::max(kMinBinExponent, k - Log2(num_bins));
}

int64_t OccupiedBins(double amax, int num_bins) {
  // Exact: scaling by a power of two, and a result below 1 floors to 0 anyway.
  return static_cast<int64_t>(std::ldexp(amax, -CanonicalExponent(amax, num_bins))) + 1;
}

Histogram Histogram::Empty(int num_bins) {
  Histogram h;
  h.num_bins = num_bins;
  return h;
}

double Histogram::amax() const {
  if (!has_finite()) return 0.0;
  return std::max(std::fabs(*min), std::fabs(*max));
}

int64_t Histogram::occupied_bins() const {
  return has_finite() ? OccupiedBins(amax(), num_bins) : 0;
}

uint64_t Histogram::total() const {
  uint64_t sum = 0;
  for (uint64_t c : counts) sum += c;
  return sum;
}

uint64_t Histogram::value_count() const {
  return total() + nan_count + posinf_count + neginf_count;
}

bool operator==(const Histogram& a, const Histogram& b) {
  auto same = [](const std::optional<double>& x, const std::optional<double>& y) {
    if (x.has_value() != y.has_value()) return false;
    return !x.has_value() || std::memcmp(&*x, &*y, sizeof(double)) == 0;
  };
  return a.num_bins == b.num_bins && a.exponent == b.exponent && a.counts == b.counts &&
         a.zero_count == b.zero_count && a.negative_count == b.negative_count &&
         a.nan_count == b.nan_count && a.posinf_count == b.posinf_count &&
         a.neginf_count == b.neginf_count && same(a.min, b.min) && same(a.max, b.max);
}

absl::Status ValidateHistogram(const Histogram& histogram, int num_bins, NonFinitePolicy policy) {
  return Check(histogram, num_bins, policy, /*state=*/false);
}

absl::Status ValidateHistogramState(const Histogram& histogram, int num_bins,
                                    NonFinitePolicy policy) {
  return Check(histogram, num_bins, policy, /*state=*/true);
}

Histogram Coarsen(const Histogram& histogram, int exponent) {
  Histogram out = histogram;
  out.exponent = exponent;
  // Bins are below 2^16, so any shift of 31 or more sends every bin to 0.
  const int d = std::min(exponent - histogram.exponent, 31);
  if (d == 0) return out;
  out.counts.clear();
  for (size_t k = 0; k < histogram.counts.size(); ++k) {
    if (histogram.counts[k] == 0) continue;
    const size_t j = k >> d;
    if (j >= out.counts.size()) out.counts.resize(j + 1, 0);
    out.counts[j] += histogram.counts[k];
  }
  return out;
}

absl::StatusOr<Histogram> Merge(const Histogram& a, const Histogram& b) {
  if (a.num_bins != b.num_bins) {
    return absl::InvalidArgumentError(absl::StrCat("cannot merge histograms of ", a.num_bins,
                                                   " and ", b.num_bins, " bins"));
  }
  // Each holds fewer than 2^62 values, so the sum cannot wrap.
  const uint64_t values = a.value_count() + b.value_count();
  if (values >= kHistogramValueLimit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the histogram would hold ", values, " values (", a.value_count(), " + ",
        b.value_count(), "); a session holds fewer than 2^62 (histogram.md §5.4)"));
  }
  Histogram out = Histogram::Empty(a.num_bins);
  out.zero_count = a.zero_count + b.zero_count;
  out.negative_count = a.negative_count + b.negative_count;
  out.nan_count = a.nan_count + b.nan_count;
  out.posinf_count = a.posinf_count + b.posinf_count;
  out.neginf_count = a.neginf_count + b.neginf_count;
  for (const Histogram* h : {&a, &b}) {
    if (!h->has_finite()) continue;
    out.min = CanonicalZero(out.min ? std::min(*out.min, *h->min) : *h->min);
    out.max = CanonicalZero(out.max ? std::max(*out.max, *h->max) : *h->max);
  }
  if (!out.has_finite()) return out;

  // The exponent of the global amax is the larger of the two (it is monotone).
  out.exponent = CanonicalExponent(out.amax(), out.num_bins);
  const int64_t m = out.occupied_bins();
  out.counts.assign(m, 0);
  for (const Histogram* h : {&a, &b}) {
    const Histogram coarse = Coarsen(*h, out.exponent);
    for (size_t j = 0; j < coarse.counts.size(); ++j) {
      if (coarse.counts[j] == 0) continue;
      if (j >= static_cast<size_t>(m)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram.counts: bin ", j, " at exponent ", out.exponent,
            " lies beyond the bin of amax; validate a histogram before merging it"));
      }
      out.counts[j] += coarse.counts[j];
    }
  }
  return out;
}

absl::StatusOr<Histogram> BinTensor(const TensorView& x, int num_bins, NonFinitePolicy policy) {
  if (x.num_elements() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shape ", ShapeString(x.shape()),
                                                   " has no elements; an observation needs one"));
  }
  return DispatchLoad(x.dtype(), [&](auto load) {
    return BinTensorAs<decltype(load)>(x, num_bins, policy);
  });
}

}  // namespace qparams
