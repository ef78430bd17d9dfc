// Small helpers shared by the unit tests: building tensors from plain values,
// deterministic random data, status assertions, bit-exact qparams checks and text
// line matching.

#ifndef QPARAMS_TESTS_TEST_UTIL_H_
#define QPARAMS_TESTS_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/calculator_state.h"
#include "core/dtype.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/qparams_calculator.h"
#include "core/quant_spec.h"
#include "core/registry.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

#define QP_CONCAT_INNER_(a, b) a##b
#define QP_CONCAT_(a, b) QP_CONCAT_INNER_(a, b)

// Status assertions; each evaluates `expr` once and accepts a streamed message.
#define EXPECT_OK(expr) EXPECT_TRUE(::qparams::testing::HasCode((expr), absl::StatusCode::kOk))
#define ASSERT_OK(expr) ASSERT_TRUE(::qparams::testing::HasCode((expr), absl::StatusCode::kOk))
// Expects a Status or StatusOr to fail with `code`.
#define EXPECT_CODE(expr, code) EXPECT_TRUE(::qparams::testing::HasCode((expr), (code)))
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                \
  auto QP_CONCAT_(qp_statusor_, __LINE__) = (expr);    \
  ASSERT_TRUE(QP_CONCAT_(qp_statusor_, __LINE__).ok()) \
      << QP_CONCAT_(qp_statusor_, __LINE__).status();  \
  lhs = std::move(*QP_CONCAT_(qp_statusor_, __LINE__))

namespace qparams::testing {

inline absl::Status ToStatus(const absl::Status& s) { return s; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

template <typename T>
::testing::AssertionResult HasCode(const T& s, absl::StatusCode code) {
  const absl::Status status = ToStatus(s);
  if (status.code() == code) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "expected " << absl::StatusCodeToString(code) << ", got " << status;
}

inline constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
inline constexpr absl::StatusCode kPrecondition = absl::StatusCode::kFailedPrecondition;

// ---- Tensors ----

// `values` encoded as raw little-endian bytes of `dtype` (16-bit formats round the
// float32 value with RNE; pass exactly representable values where it matters).
inline std::string Encode(DType dtype, const std::vector<double>& values) {
  std::string out;
  out.resize(values.size() * ItemSize(dtype));
  char* p = out.data();
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kFloat32: {
        const float f = static_cast<float>(values[i]);
        std::memcpy(p + 4 * i, &f, 4);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(static_cast<float>(values[i]));
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t b = FloatToBFloat16(static_cast<float>(values[i]));
        std::memcpy(p + 2 * i, &b, 2);
        break;
      }
      case DType::kFloat64:
        std::memcpy(p + 8 * i, &values[i], 8);
        break;
    }
  }
  return out;
}

inline Tensor MakeTensor(DType dtype, Shape shape, const std::vector<double>& values) {
  return Tensor{dtype, std::move(shape), Encode(dtype, values)};
}
// A float32 tensor.
inline Tensor F32(Shape shape, const std::vector<double>& values) {
  return MakeTensor(DType::kFloat32, std::move(shape), values);
}
// A rank-1 tensor of `values`.
inline Tensor Vec(const std::vector<double>& values, DType dtype = DType::kFloat32) {
  return MakeTensor(dtype, {static_cast<int64_t>(values.size())}, values);
}
// A tensor from raw 16-bit patterns (float16 or bfloat16).
inline Tensor FromBits16(DType dtype, Shape shape, const std::vector<uint16_t>& bits) {
  return Tensor{dtype, std::move(shape),
                std::string(reinterpret_cast<const char*>(bits.data()), 2 * bits.size())};
}

// Every element widened exactly to double.
inline std::vector<double> Values(const TensorView& t) {
  std::vector<double> v(t.num_elements());
  for (int64_t i = 0; i < t.num_elements(); ++i) v[i] = t.ValueAt(i);
  return v;
}

inline Observation Obs(const Tensor& t) { return Observation::FromTensor(t.view()); }

// Deterministic standard normals (Box–Muller on mt19937, which the standard pins
// down, so the data is the same everywhere), times `mul`.
inline std::vector<double> RandN(size_t n, uint32_t seed, double mul = 1.0) {
  std::mt19937 gen(seed);
  auto uniform = [&gen] { return (static_cast<double>(gen() >> 8) + 0.5) / 16777216.0; };
  std::vector<double> out(n);
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double t = 6.283185307179586 * uniform();
    out[i] = r * std::cos(t) * mul;
    if (i + 1 < n) out[i + 1] = r * std::sin(t) * mul;
  }
  return out;
}

// A naive block min/max: the closed form of semantics.md §2.2,
// lo[n] = min{ x[i] : i_d / B_d == n_d for all d }, element by element in double.
struct NaiveRange {
  Shape counts;
  std::vector<double> lo, hi;
};
inline NaiveRange NaiveBlockRange(const TensorView& x, const Shape& block) {
  NaiveRange r;
  const Shape& shape = x.shape();
  const size_t rank = shape.size();
  int64_t blocks = 1;
  for (size_t d = 0; d < rank; ++d) {
    r.counts.push_back(shape[d] / block[d]);
    blocks *= r.counts.back();
  }
  r.lo.assign(blocks, std::numeric_limits<double>::infinity());
  r.hi.assign(blocks, -std::numeric_limits<double>::infinity());
  std::vector<int64_t> index(rank, 0);
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    int64_t b = 0;
    for (size_t d = 0; d < rank; ++d) b = b * r.counts[d] + index[d] / block[d];
    const double v = x.ValueAt(i);
    r.lo[b] = std::min(r.lo[b], v);
    r.hi[b] = std::max(r.hi[b], v);
    for (size_t d = rank; d-- > 0;) {  // odometer over the row-major index
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return r;
}

// ---- Specs and calculators ----

inline QuantSpec MakeSpec(const std::string& dtype, QScheme qscheme,
                          Granularity granularity = Granularity::PerTensor(),
                          Target target = Target::kWeight) {
  QuantSpec spec;
  spec.dtype = dtype;
  spec.qscheme = qscheme;
  spec.granularity = std::move(granularity);
  spec.target = target;
  return spec;
}

inline absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> Create(
    absl::string_view key, const QuantSpec& spec, CalculatorOptions options = {}) {
  return QParamsCalculatorRegistry::Global().Create(key, spec, options);
}

inline absl::StatusOr<QParams> Fwd(QParamsCalculatorBase& calc, const Tensor& t) {
  return calc.Forward(Obs(t));
}

inline StatefulQParamsCalculatorBase* AsStateful(QParamsCalculatorBase* c) {
  return dynamic_cast<StatefulQParamsCalculatorBase*>(c);
}
inline RunningRangeQParamsCalculator* AsRunning(QParamsCalculatorBase* c) {
  return dynamic_cast<RunningRangeQParamsCalculator*>(c);
}

// ---- Comparisons ----

inline std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(FloatBits(f));
  return out;
}
inline std::vector<uint32_t> Repeat(uint32_t bits, size_t n) {
  return std::vector<uint32_t>(n, bits);
}
inline std::vector<int32_t> Repeat(int32_t v, size_t n) { return std::vector<int32_t>(n, v); }

inline std::string Hex(const std::vector<uint32_t>& bits) {
  return absl::StrCat("[",
                      absl::StrJoin(bits, ", ",
                                    [](std::string* out, uint32_t b) {
                                      absl::StrAppend(out, absl::StrFormat("0x%08x", b));
                                    }),
                      "]");
}

// Bit-exact check of a forward result: shape, scale bits, zero points and minval bits
// (nullopt = the result must carry none).
inline ::testing::AssertionResult QParamsAre(const QParams& q, const Shape& shape,
                                             const std::vector<uint32_t>& scale,
                                             const std::optional<std::vector<int32_t>>& zp,
                                             const std::optional<std::vector<uint32_t>>& minval) {
  if (q.shape != shape) {
    return ::testing::AssertionFailure()
           << "shape " << ShapeString(q.shape) << ", expected " << ShapeString(shape);
  }
  if (Bits(q.scale) != scale) {
    return ::testing::AssertionFailure()
           << "scale " << Hex(Bits(q.scale)) << ", expected " << Hex(scale);
  }
  if (q.has_zero_point != zp.has_value()) {
    return ::testing::AssertionFailure() << "has_zero_point " << q.has_zero_point;
  }
  if (zp.has_value() && q.zero_point != *zp) {
    return ::testing::AssertionFailure() << "zero_point [" << absl::StrJoin(q.zero_point, ", ")
                                         << "], expected [" << absl::StrJoin(*zp, ", ") << "]";
  }
  if (q.has_minval != minval.has_value()) {
    return ::testing::AssertionFailure() << "has_minval " << q.has_minval;
  }
  if (minval.has_value() && Bits(q.minval) != *minval) {
    return ::testing::AssertionFailure()
           << "minval " << Hex(Bits(q.minval)) << ", expected " << Hex(*minval);
  }
  return ::testing::AssertionSuccess();
}

inline bool SameBits(const std::vector<double>& x, const std::vector<double>& y) {
  return x.size() == y.size() &&
         (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
}

inline bool SameRange(const std::optional<WorkingRange>& a, const std::optional<WorkingRange>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a.has_value()) return true;
  return a->precision == b->precision && a->shape == b->shape && SameBits(a->lo, b->lo) &&
         SameBits(a->hi, b->hi);
}

// Every field of two exported states, floats by their bits.
inline bool SameState(const CalculatorState& a, const CalculatorState& b) {
  return a.calculator == b.calculator && a.spec == b.spec &&
         a.averaging_constant == b.averaging_constant && a.initialized == b.initialized &&
         a.export_mode == b.export_mode &&
         a.compute_dtype_for_export == b.compute_dtype_for_export &&
         a.observation_count == b.observation_count && a.qparams == b.qparams &&
         SameRange(a.running, b.running) && a.histogram_params == b.histogram_params &&
         a.histogram == b.histogram;
}

// Whether `line` is one of the lines of `text`, whole (e.g. a metrics sample).
inline bool HasLine(const std::string& text, const std::string& line) {
  return absl::StrContains(absl::StrCat("\n", text), absl::StrCat("\n", line, "\n"));
}

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_TEST_UTIL_H_
