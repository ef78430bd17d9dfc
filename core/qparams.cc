#include "core/qparams.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/float8.h"
#include "core/granularity.h"

namespace qparams {
namespace {

// Arithmetic in working precision P: each elementwise op is done in `Real` (float
// for the 32- and 16-bit formats, PyTorch's opmath type) and rounded back to P, and
// Python scalars enter as `Real`.
struct Float32Ops {
  using Real = float;
  static float Round(float v) { return v; }
};
struct BFloat16Ops {
  using Real = float;
  static float Round(float v) { return RoundToBFloat16(v); }
};
struct Float16Ops {
  using Real = float;
  static float Round(float v) { return RoundToHalf(v); }
};
struct Float64Ops {
  using Real = double;
  static double Round(double v) { return v; }
};

template <typename Fn>
auto DispatchPrecision(DType precision, Fn&& fn) {
  switch (precision) {
    case DType::kBFloat16:
      return fn(BFloat16Ops());
    case DType::kFloat16:
      return fn(Float16Ops());
    case DType::kFloat64:
      return fn(Float64Ops());
    case DType::kFloat32:
      break;
  }
  return fn(Float32Ops());
}

// f32(v), then cast to P, as a fixed bound is filled (float32) and then cast to x's dtype.
double BoundInPrecision(double bound, DType precision) {
  const float f = static_cast<float>(bound);
  return DispatchPrecision(precision, [f](auto ops) -> double {
    using Ops = decltype(ops);
    return Ops::Round(static_cast<typename Ops::Real>(f));
  });
}

// torch.max / torch.min: NaN in either operand gives NaN (std::max would drop it).
template <typename Real>
Real NanMax(Real a, Real b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<Real>::quiet_NaN() : std::max(a, b);
}
template <typename Real>
Real NanMin(Real a, Real b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<Real>::quiet_NaN() : std::min(a, b);
}

// The float -> int32 cast of a zero point; NaN gives INT32_MIN, as on x86 (§5.5).
int32_t ZeroPointToInt32(double zp) {
  return std::isnan(zp) ? std::numeric_limits<int32_t>::min() : static_cast<int32_t>(zp);
}

// -0.0 for the symmetric minval of an all-zero block, +0.0 for the asymmetric one
// (FORMAT rule 6), whatever the signs of the zeros that produced it.
float SignedZeroMinval(double v, bool symmetric) {
  if (v == 0) return symmetric ? -0.0f : 0.0f;
  return static_cast<float>(v);
}

template <typename Ops>
QParams QParamsFromRangeIn(const QParamsRecipe& recipe, const WorkingRange& range) {
  using Real = typename Ops::Real;
  const size_t n = range.lo.size();
  QParams q;
  q.shape = range.shape;
  q.precision = range.precision;
  q.scale.resize(n);
  q.has_zero_point = recipe.has_zero_point;
  q.has_minval = recipe.has_zero_point;
  if (q.has_zero_point) q.zero_point.resize(n);
  if (q.has_minval) q.minval.resize(n);
  const Real eps = static_cast<Real>(kScaleEps);
  const Real qmin = static_cast<Real>(recipe.quant_min);
  const Real qmax = static_cast<Real>(recipe.quant_max);

  for (size_t i = 0; i < n; ++i) {
    const Real mn = NanMin(static_cast<Real>(range.lo[i]), Real(0));
    const Real mx = NanMax(static_cast<Real>(range.hi[i]), Real(0));
    const Real max_abs = NanMax(-mn, mx);
    if (recipe.e8m0_target.has_value()) {
      // §7: the largest power of two not above max_abs / 2^t, floored at 2^-126.
      const int exponent_field = (FloatBits(static_cast<float>(max_abs)) >> 23) & 0xff;
      const int e = std::clamp(exponent_field - 127 - *recipe.e8m0_target, -127, 128);
      const float s = FloatFromBits(static_cast<uint32_t>(e + 127) << 23);
      q.scale[i] = std::max(s, 0x1.0p-126f);
      if (q.has_zero_point) {
        q.zero_point[i] = 0;
        q.minval[i] = SignedZeroMinval(-max_abs, true);
      }
    } else if (recipe.symmetric) {
      const Real divisor = static_cast<Real>((recipe.quant_max - recipe.quant_min) / 2);
      // clamp(min=eps) keeps NaN, hence NaN first.
      const Real scale = NanMax(Ops::Round(max_abs / divisor), eps);
      q.scale[i] = static_cast<float>(scale);
      if (q.has_zero_point) {
        q.zero_point[i] =
            static_cast<int32_t>(std::trunc((recipe.quant_max + recipe.quant_min + 1) / 2));
        q.minval[i] = SignedZeroMinval(-max_abs, true);
      }
    } else {
      const Real divisor = static_cast<Real>(recipe.quant_max - recipe.quant_min);
      const Real scale = NanMax(Ops::Round(Ops::Round(mx - mn) / divisor), eps);
      q.scale[i] = static_cast<float>(scale);
      if (q.has_zero_point) {
        const Real r = std::nearbyint(Ops::Round(mn / scale));         // round half to even
        const Real zp = std::clamp(Ops::Round(qmin - r), qmin, qmax);  // NaN stays NaN
        q.zero_point[i] = ZeroPointToInt32(zp);
        q.minval[i] = SignedZeroMinval(mn, false);
      }
    }
  }
  return q;
}

QParams Nvfp4QParams(Nvfp4Scales scales, Shape shape, DType precision) {
  QParams q;
  q.shape = std::move(shape);
  q.precision = precision;
  q.scale_e4m3 = std::move(scales.e4m3);
  q.global_scale = scales.global_scale;
  q.amax = scales.amax;
  return q;
}

QParams Nvfp4QParamsFromRange(Nvfp4Convention convention, const WorkingRange& range) {
  return Nvfp4QParams(ComputeNvfp4Scales(range.lo, range.hi, range.precision, convention),
                      range.shape, range.precision);
}

}  // namespace

std::vector<float> ScaleValues(const QParams& q) {
  if (q.scale_e4m3.empty()) return q.scale;
  std::vector<float> values(q.scale_e4m3.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = Float8E4M3FnToFloat(q.scale_e4m3[i]);
  return values;
}

size_t ScaleCount(const QParams& q) {
  return q.scale_e4m3.empty() ? q.scale.size() : q.scale_e4m3.size();
}

QParams QParams::Empty(bool has_zero_point, bool has_minval) {
  QParams q;
  q.has_zero_point = has_zero_point;
  q.has_minval = has_minval;
  return q;
}

bool operator==(const QParams& a, const QParams& b) {
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() &&
           (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  auto same_optional_bits = [](const std::optional<float>& x, const std::optional<float>& y) {
    return x.has_value() == y.has_value() && (!x.has_value() || FloatBits(*x) == FloatBits(*y));
  };
  return a.shape == b.shape && same_bits(a.scale, b.scale) && a.zero_point == b.zero_point &&
         same_bits(a.minval, b.minval) && a.has_zero_point == b.has_zero_point &&
         a.has_minval == b.has_minval && a.precision == b.precision &&
         a.scale_e4m3 == b.scale_e4m3 && same_optional_bits(a.global_scale, b.global_scale) &&
         same_optional_bits(a.amax, b.amax);
}

QParamsRecipe QParamsRecipe::FromSpec(const QuantSpec& spec) {
  QParamsRecipe recipe;
  const absl::StatusOr<QuantDType> dtype = ParseQuantDType(spec.dtype);
  recipe.symmetric = spec.qscheme != QScheme::kAsymmetric;
  recipe.quant_min = spec.quant_min.value_or(0);
  recipe.quant_max = spec.quant_max.value_or(0);
  recipe.has_zero_point = dtype.ok() && !dtype->is_floating_point();
  if (spec.nvfp4_scale()) {
    recipe.nvfp4 =
        ParseNvfp4Convention(spec.convention).value_or(Nvfp4Convention::kCompressedTensors);
  }
  if (spec.e8m0_scale() && dtype.ok()) {
    // The exponent of the largest power of two not above the format's maximum.
    recipe.e8m0_target = static_cast<int>(std::floor(std::log2(dtype->max_value())));
  }
  return recipe;
}

WorkingRange GetRange(const BlockRange* observed, const Shape& counts, const FloatRange& bounds) {
  WorkingRange range;
  range.shape = counts;
  int64_t n = 1;
  for (int64_t c : counts) n *= c;
  if (bounds.frozen()) {
    range.precision = DType::kFloat32;
    range.lo.assign(n, std::min(BoundInPrecision(*bounds.min, DType::kFloat32), 0.0));
    range.hi.assign(n, std::max(BoundInPrecision(*bounds.max, DType::kFloat32), 0.0));
    return range;
  }
  range.precision = observed->min.dtype;
  const TensorView observed_lo = observed->min.view();
  const TensorView observed_hi = observed->max.view();
  range.lo.resize(n);
  range.hi.resize(n);
  const std::optional<double> fixed_lo =
      bounds.min ? std::optional(std::min(BoundInPrecision(*bounds.min, range.precision), 0.0))
                 : std::nullopt;
  const std::optional<double> fixed_hi =
      bounds.max ? std::optional(std::max(BoundInPrecision(*bounds.max, range.precision), 0.0))
                 : std::nullopt;
  for (int64_t i = 0; i < n; ++i) {
    range.lo[i] = fixed_lo ? *fixed_lo : std::min(observed_lo.ValueAt(i), 0.0);
    range.hi[i] = fixed_hi ? *fixed_hi : std::max(observed_hi.ValueAt(i), 0.0);
  }
  return range;
}

WorkingRange MovingAverageUpdate(double averaging_constant, const WorkingRange& range,
                                 const WorkingRange& running) {
  return DispatchPrecision(range.precision, [&](auto ops) {
    using Ops = decltype(ops);
    using Real = typename Ops::Real;
    const Real c = static_cast<Real>(averaging_constant);
    const Real keep = static_cast<Real>(1.0 - averaging_constant);
    auto ema = [&](double observed, double run) -> double {
      const Real t1 = Ops::Round(c * static_cast<Real>(observed));
      const Real t2 = Ops::Round(keep * static_cast<Real>(run));
      return Ops::Round(t1 + t2);
    };
    WorkingRange next = range;
    for (size_t i = 0; i < next.lo.size(); ++i) {
      next.lo[i] = ema(range.lo[i], running.lo[i]);
      next.hi[i] = ema(range.hi[i], running.hi[i]);
    }
    return next;
  });
}

WorkingRange GlobalMinMaxUpdate(const WorkingRange& range, const WorkingRange& running) {
  WorkingRange next = range;
  for (size_t i = 0; i < next.lo.size(); ++i) {
    next.lo[i] = std::min(running.lo[i], range.lo[i]);
    next.hi[i] = std::max(running.hi[i], range.hi[i]);
  }
  return next;
}

void StoredRange::Assign(const WorkingRange& range) {
  precision_ = range.precision;
  shape_ = range.shape;
  auto fits_float = [](const std::vector<double>& values) {
    return std::all_of(values.begin(), values.end(), [](double v) {
      return std::isnan(v) || static_cast<double>(static_cast<float>(v)) == v;
    });
  };
  if (fits_float(range.lo) && fits_float(range.hi)) {
    lo32_.assign(range.lo.begin(), range.lo.end());
    hi32_.assign(range.hi.begin(), range.hi.end());
    lo64_ = {};
    hi64_ = {};
  } else {
    lo32_ = {};
    hi32_ = {};
    lo64_.assign(range.lo.begin(), range.lo.end());
    hi64_.assign(range.hi.begin(), range.hi.end());
  }
}

WorkingRange StoredRange::Get() const {
  WorkingRange range{precision_, shape_, {}, {}};
  if (lo64_.empty() && hi64_.empty()) {
    range.lo.assign(lo32_.begin(), lo32_.end());
    range.hi.assign(hi32_.begin(), hi32_.end());
  } else {
    range.lo = lo64_;
    range.hi = hi64_;
  }
  return range;
}

std::optional<QParams> Nvfp4QParamsFromTensor(Nvfp4Convention convention, const TensorView& x,
                                              const Shape& block) {
  std::optional<Nvfp4Scales> scales = ComputeNvfp4ScalesOfTensor(x, block, convention);
  if (!scales.has_value()) return std::nullopt;
  return Nvfp4QParams(*std::move(scales), BlockCounts(x.shape(), block), x.dtype());
}

QParams QParamsFromRange(const QParamsRecipe& recipe, const WorkingRange& range) {
  if (recipe.nvfp4.has_value()) return Nvfp4QParamsFromRange(*recipe.nvfp4, range);
  return DispatchPrecision(
      range.precision, [&](auto ops) { return QParamsFromRangeIn<decltype(ops)>(recipe, range); });
}

}  // namespace qparams
