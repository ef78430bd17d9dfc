#include "core/calibration.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/range.h"

namespace qparams {
namespace {

using uint128 = unsigned __int128;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The counts a method sees (§6.1): c[k] for k < M, with exact zeros left out of c[0]
// under skip_zeros, and their sum T.
struct SeenCounts {
  std::vector<int64_t> c;
  int64_t total = 0;
};

SeenCounts CountsSeen(const Histogram& h, bool skip_zeros) {
  SeenCounts s;
  const int64_t m = h.occupied_bins();
  s.c.assign(m, 0);
  for (int64_t k = 0; k < m && k < static_cast<int64_t>(h.counts.size()); ++k) {
    s.c[k] = static_cast<int64_t>(h.counts[k]);
  }
  if (skip_zeros && m > 0) s.c[0] -= static_cast<int64_t>(h.zero_count);
  for (int64_t v : s.c) s.total += v;
  return s;
}

CalibrationResult Result(const Histogram& h, double amax, int64_t bin_index) {
  CalibrationResult r;
  r.amax = amax;
  r.bin_index = bin_index;
  r.exponent = h.exponent;
  r.total_count = h.total();
  return r;
}

// P = m·10^q exactly, from the shortest decimal string that reads back as `p`.
struct Decimal {
  uint64_t m = 0;
  int q = 0;
};
Decimal ShortestDecimal(double p) {
  char buf[64];
  const std::to_chars_result end = std::to_chars(buf, buf + sizeof buf - 1, p);
  *end.ptr = '\0';
  Decimal d;
  bool fraction = false;
  const char* c = buf;
  for (; *c != '\0' && *c != 'e'; ++c) {
    if (*c == '.') {
      fraction = true;
      continue;
    }
    d.m = d.m * 10 + (*c - '0');  // at most 17 digits
    if (fraction) --d.q;
  }
  if (*c == 'e') d.q += static_cast<int>(std::strtol(c + 1, nullptr, 10));
  return d;
}

// need = ceil(P·T/100) in integers (§6.2 step 3).
int64_t PercentileRank(double percentile, int64_t total) {
  const Decimal d = ShortestDecimal(percentile);
  const int shift = 2 - d.q;  // need = ceil(m·T / 10^shift)
  const uint128 product = uint128{d.m} * static_cast<uint64_t>(total);  // < 2^119
  if (shift > 38) return 1;  // the quotient is below 1 and positive
  uint128 pow10 = 1;
  for (int i = 0; i < std::abs(shift); ++i) pow10 *= 10;
  const uint128 need = shift >= 0 ? (product + pow10 - 1) / pow10 : product * pow10;
  return static_cast<int64_t>(std::min<uint128>(need, static_cast<uint64_t>(total)));
}

// p = b[k] / S_all of §6.3 for every bin, which no candidate changes (the last kept
// bin's p, which holds the outliers, is computed by Divergence).
std::vector<double> BinShares(const std::vector<int64_t>& b, int64_t s_all) {
  std::vector<double> p(b.size());
  for (size_t k = 0; k < b.size(); ++k) {
    p[k] = static_cast<double>(b[k]) / static_cast<double>(s_all);
  }
  return p;
}

// KL_i of §6.3 for candidate `i` (bins kept), summed in ascending k. The same
// operations on the same operands as the spec's loop, so the same bits: the group
// j = floor(k·L/i) advances by comparison instead of a division per bin, and p and
// q, which depend on the bin and on the group alone, are computed once each.
double Divergence(const std::vector<int64_t>& b, const std::vector<double>& shares, int64_t i,
                  int64_t levels, int64_t s_all) {
  std::vector<int64_t> group_sum(levels, 0), group_nonzero(levels, 0);
  // group_start[j]: the first bin of group j, i.e. ceil(j·i/L); group_start[L] = i.
  std::vector<int64_t> group_start(levels + 1, i);
  int64_t s = 0;
  for (int64_t k = 0, j = -1; k < i; ++k) {
    while (k * levels >= (j + 1) * i) group_start[++j] = k;  // floor(k·L/i) = j
    group_sum[j] += b[k];
    group_nonzero[j] += b[k] != 0;
    s += b[k];
  }
  double kl = 0.0;
  for (int64_t j = 0; j < levels; ++j) {
    const int64_t begin = group_start[j], end = j + 1 < levels ? group_start[j + 1] : i;
    if (begin >= end) continue;
    // Unused (and not computed) when the group holds no count, so never 0/0.
    const double q = group_sum[j] == 0 ? 0.0
                                       : static_cast<double>(group_sum[j]) /
                                             (static_cast<double>(group_nonzero[j]) *
                                              static_cast<double>(s));
    for (int64_t k = begin; k < end; ++k) {
      const bool last = k == i - 1;
      const int64_t r = b[k] + (last ? s_all - s : 0);  // outliers join the last bin
      if (r == 0) continue;
      if (b[k] == 0) {
        kl += kInf;  // an empty last bin that the outliers land in
        continue;
      }
      const double p = last ? static_cast<double>(r) / static_cast<double>(s_all) : shares[k];
      kl += p * std::log(p / q);
    }
  }
  return kl;
}

// Runs value(idx) for idx in [0, n) on OpenMP threads sized for `work` terms; each
// result depends on its idx only.
template <typename Fn>
std::vector<double> ForEachCandidate(int64_t n, int64_t work, const Fn& value) {
  std::vector<double> out(n);
  const int threads = static_cast<int>(std::min<int64_t>(RangeThreadsFor(work), n));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 8)
  for (int64_t idx = 0; idx < n; ++idx) out[idx] = value(idx);
  return out;
}

}  // namespace

bool operator==(const CalibrationResult& a, const CalibrationResult& b) {
  auto same = [](double x, double y) { return std::memcmp(&x, &y, sizeof x) == 0; };
  return same(a.amax, b.amax) && a.bin_index == b.bin_index && a.exponent == b.exponent &&
         a.total_count == b.total_count && a.kl_margin.has_value() == b.kl_margin.has_value() &&
         (!a.kl_margin || same(*a.kl_margin, *b.kl_margin));
}

CalibrationResult PercentileCalibration(const Histogram& histogram, double percentile,
                                        bool skip_zeros) {
  const SeenCounts s = CountsSeen(histogram, skip_zeros);
  const int64_t m = static_cast<int64_t>(s.c.size());
  if (s.total == 0) return Result(histogram, 0.0, 0);
  if (percentile == 100) return Result(histogram, histogram.amax(), m - 1);
  const int64_t need = PercentileRank(percentile, s.total);
  int64_t cumulative = 0;
  int64_t k = 0;
  for (; k < m; ++k) {
    cumulative += s.c[k];
    if (cumulative >= need) break;
  }
  return Result(histogram, std::ldexp(static_cast<double>(k), histogram.exponent), k);
}

CalibrationResult EntropyCalibration(const Histogram& histogram, const SearchGrid& grid,
                                     bool skip_zeros, int64_t levels) {
  SeenCounts s = CountsSeen(histogram, skip_zeros);
  const int64_t m = static_cast<int64_t>(s.c.size());
  const int e = histogram.exponent;
  CalibrationResult result;
  if (s.total == 0) {
    result = Result(histogram, 0.0, 0);
  } else if (m < grid.start_bin) {
    result = Result(histogram, std::ldexp(static_cast<double>(m), e), m);  // the whole range
  } else {
    std::vector<int64_t>& b = s.c;
    if (m >= 2) b[0] = b[1];  // a spike of zeros or tiny values does not count
    int64_t s_all = 0;
    for (int64_t v : b) s_all += v;
    const int64_t n = (m - grid.start_bin) / grid.stride + 1;
    const std::vector<double> shares = BinShares(b, s_all);
    const std::vector<double> kl = ForEachCandidate(n, n * m, [&](int64_t idx) {
      return Divergence(b, shares, grid.start_bin + idx * grid.stride, levels, s_all);
    });
    const double best = *std::min_element(kl.begin(), kl.end());
    // The band absorbs last-bit differences between implementations of log.
    const double threshold = best + std::fabs(best) * 0x1.0p-30;
    int64_t chosen = n - 1;  // every divergence infinite: the last candidate
    if (best != kInf) {
      while (!(kl[chosen] <= threshold)) --chosen;
    }
    const int64_t i = grid.start_bin + chosen * grid.stride;
    result = Result(histogram, std::ldexp(static_cast<double>(i), e), i);
    double margin = kInf;
    if (threshold != 0) {
      for (double v : kl) {
        if (std::isfinite(v) && v > threshold) {
          margin = std::min(margin, std::fabs(v - threshold) / std::fabs(threshold));
        }
      }
    }
    result.kl_margin = margin;
    return result;
  }
  result.kl_margin = kInf;  // no choice was made, so no error can change it
  return result;
}

CalibrationResult MseCalibration(const Histogram& histogram, const SearchGrid& grid,
                                 bool skip_zeros, const QParamsRecipe& recipe, bool nonnegative) {
  const SeenCounts s = CountsSeen(histogram, skip_zeros);
  const int64_t m = static_cast<int64_t>(s.c.size());
  const int e = histogram.exponent;
  // The center of bin k, (2k+1)·2^(e-1): exact in float32 (17 bits, e - 1 >= -127).
  auto center = [e](int64_t k) { return std::ldexp(static_cast<double>(2 * k + 1), e - 1); };
  if (s.total == 0) return Result(histogram, 0.0, 0);
  if (m <= grid.start_bin) return Result(histogram, center(m - 1), m - 1);

  std::vector<float> x;  // the centers of the occupied bins, with their counts
  std::vector<double> weight;
  for (int64_t k = 0; k < m; ++k) {
    // An empty bin adds +0.0 to a non-negative sum: leaving it out changes no bit.
    if (s.c[k] == 0) continue;
    x.push_back(static_cast<float>(center(k)));
    weight.push_back(static_cast<double>(s.c[k]));
  }
  const float qmin = static_cast<float>(recipe.quant_min);
  const float qmax = static_cast<float>(recipe.quant_max);
  const int64_t n = (m - 1 - grid.start_bin) / grid.stride + 1;  // i < M
  const std::vector<double> errors = ForEachCandidate(
      n, n * static_cast<int64_t>(x.size()), [&](int64_t idx) {
        const QParams q = QParamsFromAmax(recipe, center(grid.start_bin + idx * grid.stride),
                                          nonnegative);
        const float scale = q.scale[0];
        const float zp = q.has_zero_point ? static_cast<float>(q.zero_point[0]) : 0.0f;
        // torch.fake_quantize_per_tensor_affine on CPU, in float32.
        const float inv = 1.0f / scale;
        double err = 0.0;
        for (size_t k = 0; k < x.size(); ++k) {
          const float r = std::nearbyint(x[k] * inv);  // round half to even
          const float qc = std::min(std::max(zp + r, qmin), qmax);
          const float dq = (qc - zp) * scale;
          const double d = static_cast<double>(dq) - static_cast<double>(x[k]);
          err += weight[k] * (d * d);
        }
        return err;
      });
  int64_t chosen = 0;
  for (int64_t idx = 1; idx < n; ++idx) {
    if (errors[idx] < errors[chosen]) chosen = idx;  // ties keep the smallest i
  }
  const int64_t i = grid.start_bin + chosen * grid.stride;
  return Result(histogram, center(i), i);
}

QParams QParamsFromAmax(const QParamsRecipe& recipe, double amax, bool nonnegative) {
  WorkingRange range;
  range.shape = {1};
  range.lo = {nonnegative ? 0.0 : -amax};
  range.hi = {amax};
  const bool float32 = static_cast<double>(static_cast<float>(amax)) == amax;
  range.precision = float32 ? DType::kFloat32 : DType::kFloat64;
  QParams q = QParamsFromRange(recipe, range);
  q.precision = DType::kFloat32;
  return q;
}

}  // namespace qparams
