// The calculators' lifecycle (semantics.md §1.3–§1.6), the conformance tables of §9.1–§9.3,
// and the service Policies 1–4: error codes, and that a failed step changes nothing.

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/qparams_calculator.h"
#include "core/range.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using QS = QScheme;
using I32 = std::vector<int32_t>;
using U32 = std::vector<uint32_t>;
using Calc = std::unique_ptr<QParamsCalculatorBase>;

constexpr const char* kStatefulKeys[] = {"static", "moving_average", "global_minmax"};
constexpr const char* kAllKeys[] = {"static", "moving_average", "global_minmax", "dynamic"};

uint32_t B(float f) { return FloatBits(f); }

// ---- §9.1 static calculator, S1–S10 ----

struct SCase {
  const char* id;
  const char* dtype;
  QScheme q;
  std::vector<double> v;
  uint32_t scale;
  std::optional<int32_t> zp;
  std::optional<float> minval;
};

const SCase kSCases[] = {
    {"S1", "int8", QS::kAsymmetric, {-1, 0, 7}, 0x3D008081, -96, -1.0f},
    {"S2", "uint8", QS::kAsymmetric, {-1, 0, 5}, 0x3CC0C0C1, 42, -1.0f},
    {"S3", "int8", QS::kSymmetric, {-1, 0, 3}, 0x3CC0C0C1, 0, -3.0f},
    {"S4", "uint8", QS::kSymmetric, {-3, 0, 1}, 0x3CC0C0C1, 128, -3.0f},
    {"S5", "float8_e4m3fn", QS::kSymmetric, {-3, 0, 3}, 0x3BDB6DB7, std::nullopt, std::nullopt},
    {"S6", "float8_e5m2", QS::kSymmetric, {-3, 0, 3}, 0x385B6DB7, std::nullopt, std::nullopt},
    {"S7", "int8", QS::kSymmetricWithClipping, {-3, 0, 3}, 0x3CC18306, 0, -3.0f},
    {"S8", "int4", QS::kSymmetricWithClipping, {-1.5, 0, 1.5}, 0x3E5B6DB7, 0, -1.5f},
    {"S9", "uint8", QS::kSymmetricWithClipping, {-3, 0, 3}, 0x3CC0C0C1, 128, -3.0f},
    {"S10",
     "float4_e2m1fn_x2",
     QS::kSymmetric,
     {-3, 0, 3},
     0x3F000000,
     std::nullopt,
     std::nullopt},  // e8m0 scale filled in automatically
};

// Every block of a result carries the same expected per-tensor values.
::testing::AssertionResult AllBlocksAre(const QParams& q, const Shape& shape, const SCase& c) {
  const size_t n = q.scale.size();
  return QParamsAre(q, shape, Repeat(c.scale, n),
                    c.zp ? std::optional<I32>(Repeat(*c.zp, n)) : std::nullopt,
                    c.minval ? std::optional<U32>(Repeat(B(*c.minval), n)) : std::nullopt);
}

TEST(StaticTable, S1ToS10PerTensor) {  // semantics.md §9.1
  for (const SCase& c : kSCases) {
    SCOPED_TRACE(c.id);
    ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", MakeSpec(c.dtype, c.q)));
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, Vec(c.v)));
    EXPECT_TRUE(AllBlocksAre(q, {1}, c));
    EXPECT_EQ(AsStateful(calc.get())->GetQParams(), q);  // the buffers hold the result
  }
}

// §9.1 per-channel variant: x[l][r][c] = v[(c - r) mod 3], so every slice along any
// axis holds all three values.
TEST(StaticTable, S1ToS10PerChannelOnEveryAxis) {
  for (const SCase& c : kSCases) {
    std::vector<double> x;
    for (int l = 0; l < 3; ++l)
      for (int r = 0; r < 3; ++r)
        for (int k = 0; k < 3; ++k) x.push_back(c.v[(k - r + 3) % 3]);
    for (int64_t axis : {0, 1, 2, -1, -2, -3}) {
      SCOPED_TRACE(absl::StrCat(c.id, " axis ", axis));
      ASSERT_OK_AND_ASSIGN(Calc calc,
                           Create("static", MakeSpec(c.dtype, c.q, Granularity::PerChannel(axis))));
      ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, F32({3, 3, 3}, x)));
      Shape shape = {1, 1, 1};
      shape[(axis + 3) % 3] = 3;
      EXPECT_TRUE(AllBlocksAre(q, shape, c));
    }
  }
}

// §9.1 per-block variant: x[0, i, j] = v[i mod 3], shape (1, 18, 4), per_block(axis=1, b).
TEST(StaticTable, S1ToS10PerBlock) {
  for (const SCase& c : kSCases) {
    std::vector<double> x;
    for (int i = 0; i < 18; ++i)
      for (int j = 0; j < 4; ++j) x.push_back(c.v[i % 3]);
    for (int64_t b : {3, 6}) {
      SCOPED_TRACE(absl::StrCat(c.id, " b=", b));
      ASSERT_OK_AND_ASSIGN(Calc calc,
                           Create("static", MakeSpec(c.dtype, c.q, Granularity::PerBlock(1, b))));
      ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, F32({1, 18, 4}, x)));
      EXPECT_TRUE(AllBlocksAre(q, {1, 18 / b, 1}, c));
    }
  }
}

// ---- §9.2 dynamic calculator ----

TEST(Dynamic, D1RecomputesEveryCall) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("dynamic", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, Vec({-1, 0, 1})));
  EXPECT_TRUE(QParamsAre(q1, {1}, {0x3C008081}, I32{0}, U32{B(-1)}));
  ASSERT_OK_AND_ASSIGN(QParams q2, Fwd(*calc, Vec({-10, 0, 10})));
  EXPECT_TRUE(QParamsAre(q2, {1}, {0x3DA0A0A1}, I32{0}, U32{B(-10)}));
}

// D2: any shape (and dtype) on every call, with no FAILED_PRECONDITION (Policy 2).
TEST(Dynamic, D2AcceptsChangingShapesAndDtypes) {
  ASSERT_OK_AND_ASSIGN(
      Calc calc, Create("dynamic", MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(1))));
  ASSERT_OK_AND_ASSIGN(QParams a, Fwd(*calc, F32({2, 8, 16}, RandN(256, 1))));
  EXPECT_EQ(a.shape, (Shape{1, 8, 1}));
  ASSERT_OK_AND_ASSIGN(QParams b, Fwd(*calc, F32({2, 32, 16}, RandN(1024, 2))));
  EXPECT_EQ(b.shape, (Shape{1, 32, 1}));
  ASSERT_OK_AND_ASSIGN(QParams c, Fwd(*calc, MakeTensor(DType::kBFloat16, {1, 4, 2}, RandN(8, 3))));
  EXPECT_EQ(c.shape, (Shape{1, 4, 1}));
  EXPECT_EQ(c.precision, DType::kBFloat16);
  EXPECT_EQ(calc->compute_dtype_for_export(), DType::kFloat32);  // set by the first forward
}

// D3: bit-identical to static over the dtype/scheme matrix. The SWC rows are left
// out: the core rejects dynamic + SWC at construction (LATEST-TESTS, §4.6).
TEST(Dynamic, D3BitIdenticalToStatic) {
  for (const SCase& c : kSCases) {
    if (c.q == QS::kSymmetricWithClipping) continue;
    for (DType p : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(c.id, " ", DTypeName(p)));
      ASSERT_OK_AND_ASSIGN(Calc dynamic, Create("dynamic", MakeSpec(c.dtype, c.q)));
      ASSERT_OK_AND_ASSIGN(Calc stat, Create("static", MakeSpec(c.dtype, c.q)));
      const Tensor x = MakeTensor(p, {2, 3}, {c.v[0], c.v[1], c.v[2], c.v[2] / 3, 0, c.v[0] / 7});
      ASSERT_OK_AND_ASSIGN(QParams qd, Fwd(*dynamic, x));
      ASSERT_OK_AND_ASSIGN(QParams qs, Fwd(*stat, x));
      EXPECT_EQ(qd, qs);
      if (p == DType::kFloat32) {
        EXPECT_TRUE(AllBlocksAre(qd, {1, 1}, c));
      }
    }
  }
}

TEST(Dynamic, D4RejectsAnyFloatRange) {
  for (FloatRange r :
       {FloatRange{-1.0, 1.0}, FloatRange{-1.0, std::nullopt}, FloatRange{std::nullopt, 1.0}}) {
    QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
    spec.float_range = r;
    const auto calc = Create("dynamic", spec);
    EXPECT_CODE(calc, kInvalid);
    EXPECT_NE(calc.status().message().find("requires float_range=[None, None]"), std::string::npos)
        << calc.status();
    EXPECT_OK(Create("static", spec).status());  // stateful kinds accept it
  }
}

// D5 / Policy 3: export mode on a stateless calculator.
TEST(Dynamic, D5ExportModeIsFailedPrecondition) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("dynamic", MakeSpec("int8", QS::kSymmetric)));
  const absl::Status on = calc->SetExportMode(true);
  EXPECT_CODE(on, kPrecondition);
  EXPECT_NE(on.message().find("does not support export mode"), std::string::npos) << on;
  EXPECT_OK(calc->SetExportMode(false));  // a no-op
  EXPECT_FALSE(calc->initialized());
}

// D6: no get_qparams on stateless calculators: each forward's result is the caller's.
TEST(Dynamic, D6HasNoBuffers) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("dynamic", MakeSpec("int8", QS::kSymmetric)));
  EXPECT_FALSE(calc->stateful());
  EXPECT_EQ(AsStateful(calc.get()), nullptr);
  ASSERT_NE(dynamic_cast<DynamicQParamsCalculator*>(calc.get()), nullptr);
  EXPECT_OK(Fwd(*calc, Vec({-1, 0, 3})).status());
  EXPECT_TRUE(calc->initialized());  // the first forward initializes it
}

// FORMAT rule 4: a failed forward does not initialize the dynamic calculator.
TEST(Dynamic, FailedForwardDoesNotInitialize) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("dynamic", MakeSpec("int8", QS::kSymmetric)));
  EXPECT_CODE(Fwd(*calc, Vec({1, NAN})), kInvalid);
  EXPECT_FALSE(calc->initialized());
  EXPECT_OK(calc->SetGranularity(Granularity::PerChannel(0)));
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, MakeTensor(DType::kFloat16, {2}, {1, -2})));
  EXPECT_EQ(q.shape, (Shape{2}));
  EXPECT_EQ(calc->compute_dtype_for_export(), DType::kFloat16);
  EXPECT_CODE(calc->SetGranularity(Granularity::PerTensor()), kPrecondition);
}

// ---- §9.3 stateful lifecycle ----

TEST(Lifecycle, L1EmptyBuffersBeforeTheFirstForward) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", MakeSpec("int8", QS::kAsymmetric)));
  const QParams& q = AsStateful(calc.get())->GetQParams();
  EXPECT_EQ(q.shape, (Shape{0}));
  EXPECT_TRUE(q.scale.empty());
  EXPECT_TRUE(q.zero_point.empty());
  EXPECT_TRUE(q.minval.empty());
  EXPECT_TRUE(q.has_zero_point);
  EXPECT_TRUE(q.has_minval);
  EXPECT_FALSE(calc->initialized());

  // FP dtypes have no zero point or minval buffers at all (§1.3).
  ASSERT_OK_AND_ASSIGN(Calc fp8, Create("global_minmax", MakeSpec("float8_e5m2", QS::kSymmetric)));
  EXPECT_FALSE(AsStateful(fp8.get())->GetQParams().has_zero_point);
  EXPECT_FALSE(AsStateful(fp8.get())->GetQParams().has_minval);
}

TEST(Lifecycle, L2ExportModeFreezesTheBuffers) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", MakeSpec("int8", QS::kAsymmetric)));
  ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, Vec({-3, 0, 3})));
  ASSERT_OK(calc->SetExportMode(true));
  ASSERT_OK_AND_ASSIGN(QParams q2, Fwd(*calc, Vec({-10, 0, 10})));
  EXPECT_EQ(q2, q1);
  ASSERT_OK(calc->SetExportMode(false));
  ASSERT_OK_AND_ASSIGN(QParams q3, Fwd(*calc, Vec({-10, 0, 10})));
  EXPECT_FALSE(q3 == q1);
  EXPECT_TRUE(QParamsAre(q3, {1}, {0x3DA0A0A1}, I32{-1}, U32{B(-10)}));  // §5.7(d)
  EXPECT_EQ(AsStateful(calc.get())->observation_count(), 2);
}

TEST(Lifecycle, L3MovingAverageRatios) {
  for (double c : {0.9, 0.8, 0.75}) {
    SCOPED_TRACE(c);
    ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", MakeSpec("int8", QS::kSymmetric),
                                           CalculatorOptions{c}));
    ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, Vec({-3, 0, 3})));
    ASSERT_OK_AND_ASSIGN(QParams q2, Fwd(*calc, Vec({-6, 0, 6})));
    EXPECT_NEAR(q2.scale[0] / q1.scale[0], 1 + c, 1e-6);
    EXPECT_NEAR(q2.minval[0] / q1.minval[0], 1 + c, 1e-6);
    EXPECT_EQ(q2.zero_point, q1.zero_point);
  }
}

// Forwards `inputs` through a global_minmax int8 SYM calculator, returning the running
// range (lo, hi) after each step.
std::vector<std::pair<double, double>> GlobalRunning(
    const std::vector<std::vector<double>>& inputs) {
  std::vector<std::pair<double, double>> out;
  auto calc = Create("global_minmax", MakeSpec("int8", QS::kSymmetric));
  EXPECT_TRUE(calc.ok());
  for (const auto& x : inputs) {
    EXPECT_OK(Fwd(**calc, Vec(x)).status());
    const WorkingRange& r = AsRunning(calc->get())->running_range();
    EXPECT_EQ(r.shape, (Shape{1}));
    out.emplace_back(r.lo[0], r.hi[0]);
  }
  return out;
}

TEST(Lifecycle, L4L5L6GlobalMinMaxRunningRange) {
  using P = std::vector<std::pair<double, double>>;
  EXPECT_EQ(GlobalRunning({{-1, 0, 1}, {-3, 0, 3}}), (P{{-1, 1}, {-3, 3}}));  // L4
  EXPECT_EQ(GlobalRunning({{-5, 0, 5}, {-1, 0, 1}}), (P{{-5, 5}, {-5, 5}}));  // L5
  EXPECT_EQ(GlobalRunning({{-1, 0, 2}, {-5, 0, 1}, {-1, 0, 10}}),
            (P{{-1, 2}, {-5, 2}, {-5, 10}}));  // L6
}

TEST(Lifecycle, L7GlobalMinMaxEqualsStaticOnOneForward) {
  ASSERT_OK_AND_ASSIGN(Calc g, Create("global_minmax", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK_AND_ASSIGN(Calc s, Create("static", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK_AND_ASSIGN(QParams qg, Fwd(*g, Vec({-3, 0, 3})));
  ASSERT_OK_AND_ASSIGN(QParams qs, Fwd(*s, Vec({-3, 0, 3})));
  EXPECT_EQ(qg, qs);
}

TEST(Lifecycle, L8FrozenGlobalMinMax) {
  QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
  spec.float_range = {-5.0, 5.0};
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("global_minmax", spec));
  ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, Vec(RandN(10, 8))));
  ASSERT_OK_AND_ASSIGN(QParams q2, Fwd(*calc, Vec(RandN(10, 9, 100))));
  EXPECT_TRUE(QParamsAre(q1, {1}, {0x3D20A0A1}, I32{0}, U32{B(-5)}));  // §5.7(j)
  EXPECT_EQ(q2, q1);
}

TEST(Lifecycle, L9GlobalMinMaxScaleNeverDecreases) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("global_minmax", MakeSpec("int8", QS::kSymmetric)));
  float previous = 0;
  for (uint32_t seed = 0; seed < 5; ++seed) {
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, Vec(RandN(10, 100 + seed, 1 + seed % 3))));
    EXPECT_GE(q.scale[0], previous);
    previous = q.scale[0];
  }
}

TEST(Lifecycle, L10ExportAfterFirstForward) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("global_minmax", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, Vec({-3, 0, 3})));
  ASSERT_OK(calc->SetExportMode(true));
  ASSERT_OK_AND_ASSIGN(QParams q2, Fwd(*calc, Vec({-7, 0, 10})));
  EXPECT_EQ(q2, q1);
  EXPECT_EQ(AsRunning(calc.get())->running_range().hi, std::vector<double>{3});
}

// |value - target| within one scale.
void ExpectWithinOneScale(double value, double target, double scale) {
  EXPECT_LE(std::fabs(value - target), scale) << value << " vs " << target;
}

TEST(Lifecycle, L11FrozenAsymmetricMovingAverage) {
  QuantSpec spec = MakeSpec("int8", QS::kAsymmetric);
  spec.float_range = {0.0, 5.0};
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", spec));
  ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, Vec(RandN(10, 11, 10))));
  ASSERT_OK_AND_ASSIGN(QParams q2, Fwd(*calc, Vec(RandN(10, 12, 10))));
  EXPECT_EQ(B(q1.minval[0]), 0u);
  const double s = q1.scale[0];
  ExpectWithinOneScale(s * (-128 - q1.zero_point[0]), 0.0, s);
  ExpectWithinOneScale(s * (127 - q1.zero_point[0]), 5.0, s);
  EXPECT_EQ(q2, q1);
}

TEST(Lifecycle, L12FrozenSymmetricMovingAverage) {
  for (FloatRange r : {FloatRange{0.0, 5.0}, FloatRange{-5.0, 0.0}}) {
    QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
    spec.float_range = r;
    ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", spec));
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, F32({1, 10}, RandN(10, 13, 10))));
    EXPECT_EQ(q.minval, std::vector<float>{-5.0f});
    const double s = q.scale[0];
    ExpectWithinOneScale(s * (-128 - q.zero_point[0]), -5.0, s);
    ExpectWithinOneScale(s * (127 - q.zero_point[0]), 5.0, s);
  }
}

// L13: static ASYM with every float_range form and three granularities; the fixed
// bound replaces the (zero-clamped) observed one per block.
TEST(Lifecycle, L13StaticAsymmetricFloatRanges) {
  const std::vector<double> data = RandN(32, 0, 100);
  const Tensor x = F32({4, 8}, data);
  const std::optional<double> none;
  const FloatRange ranges[] = {{none, none}, {none, 10.0}, {-10.0, none}, {-10.0, 10.0}};
  for (const Granularity& g :
       {Granularity::PerTensor(), Granularity::PerChannel(0), Granularity::PerBlock(1, 2)}) {
    ASSERT_OK_AND_ASSIGN(Shape block, g.BlockShape(x.shape));
    const NaiveRange observed = NaiveBlockRange(x.view(), block);
    for (const FloatRange& r : ranges) {
      SCOPED_TRACE(
          absl::StrCat(g.ToString(), " [", r.min.value_or(99), ", ", r.max.value_or(99), "]"));
      QuantSpec spec = MakeSpec("int8", QS::kAsymmetric, g);
      spec.float_range = r;
      ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", spec));
      ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, x));
      ASSERT_EQ(q.shape, observed.counts);
      for (size_t b = 0; b < q.scale.size(); ++b) {
        const double lo = r.min ? *r.min : std::min(observed.lo[b], 0.0);
        const double hi = r.max ? *r.max : std::max(observed.hi[b], 0.0);
        const double s = q.scale[b];
        if (r.min) {
          EXPECT_EQ(q.minval[b], -10.0f);
        }
        EXPECT_EQ(q.minval[b], static_cast<float>(lo));
        ExpectWithinOneScale(s * (-128 - q.zero_point[b]), lo, s);
        ExpectWithinOneScale(s * (127 - q.zero_point[b]), hi, s);
      }
    }
  }
}

// L14: a one-sided bound with fp16/bf16 input: the result stays in the input dtype.
TEST(Lifecycle, L14OneSidedRangeKeepsHalfPrecision) {
  const std::optional<double> none;
  for (DType p : {DType::kFloat16, DType::kBFloat16}) {
    for (FloatRange r : {FloatRange{-10.0, none}, FloatRange{none, 10.0}}) {
      QuantSpec spec = MakeSpec("int8", QS::kAsymmetric, Granularity::PerChannel(0));
      spec.float_range = r;
      ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", spec));
      ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, MakeTensor(p, {4, 8}, RandN(32, 14, 100))));
      EXPECT_EQ(q.precision, p);
      for (float s : q.scale) {
        EXPECT_GT(s, 0.0f);
        EXPECT_EQ(s, p == DType::kFloat16 ? RoundToHalf(s) : RoundToBFloat16(s));  // exact in P
      }
    }
  }
}

TEST(Lifecycle, L15ComputeDtypeForExportIsTheInputDtype) {
  for (const char* key : kStatefulKeys) {
    for (DType p : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, MakeSpec("int8", QS::kSymmetric)));
      EXPECT_EQ(calc->compute_dtype_for_export(), DType::kFloat32);
      ASSERT_OK(Fwd(*calc, Vec({-3, 0, 3}, p)).status());
      EXPECT_EQ(calc->compute_dtype_for_export(), p) << key;
    }
  }
}

TEST(Lifecycle, L16GranularityChangeBeforeTheFirstForwardOnly) {
  QuantSpec spec = MakeSpec("int8", QS::kSymmetric, Granularity::PerTensor(), Target::kActivation);
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", spec));
  ASSERT_OK(calc->SetGranularity(Granularity::PerChannel(1)));
  spec.granularity = Granularity::PerChannel(1);
  ASSERT_OK_AND_ASSIGN(Calc reference, Create("moving_average", spec));
  const Tensor x = F32({2, 5}, RandN(10, 16));
  ASSERT_OK(Fwd(*calc, x).status());
  ASSERT_OK(Fwd(*reference, x).status());
  EXPECT_EQ(AsStateful(calc.get())->GetQParams(), AsStateful(reference.get())->GetQParams());
  EXPECT_EQ(AsStateful(calc.get())->GetQParams().shape, (Shape{1, 5}));

  const absl::Status late = calc->SetGranularity(Granularity::PerTensor());
  EXPECT_CODE(late, kPrecondition);  // Policy 3
  EXPECT_NE(late.message().find("Cannot change granularity after observer has been initialized."),
            std::string::npos)
      << late;
  EXPECT_EQ(calc->spec().granularity, Granularity::PerChannel(1));
}

// L17: inputs scaled by eps(P): every scale is at least 2^-23, and for 16-bit inputs
// stays below eps(P).
TEST(Lifecycle, L17TinyInputsKeepTheEpsFloor) {
  struct Precision {
    DType dtype;
    double eps;
  };
  const Precision precisions[] = {{DType::kFloat32, std::ldexp(1.0, -23)},
                                  {DType::kFloat16, std::ldexp(1.0, -10)},
                                  {DType::kBFloat16, std::ldexp(1.0, -7)}};
  for (const char* dtype : {"int4", "int8"}) {
    for (const Granularity& g :
         {Granularity::PerTensor(), Granularity::PerChannel(0), Granularity::PerBlock(1, 16)}) {
      for (Target target : {Target::kWeight, Target::kActivation}) {
        for (const Precision& p : precisions) {
          SCOPED_TRACE(absl::StrCat(dtype, " ", g.ToString(), " ", TargetName(target), " ",
                                    DTypeName(p.dtype)));
          ASSERT_OK_AND_ASSIGN(Calc calc,
                               Create("default", MakeSpec(dtype, QS::kSymmetric, g, target)));
          ASSERT_OK_AND_ASSIGN(QParams q,
                               Fwd(*calc, MakeTensor(p.dtype, {32, 32}, RandN(1024, 17, p.eps))));
          for (float s : q.scale) {
            EXPECT_GE(s, std::ldexp(1.0f, -23));
            if (p.dtype != DType::kFloat32) {
              EXPECT_LT(s, p.eps);
            }
          }
        }
      }
    }
  }
}

TEST(Lifecycle, L18DescriptionOfAnUninitializedCalculator) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", MakeSpec("int8", QS::kSymmetric)));
  const std::string d = calc->Description();
  for (const char* part : {"scale=tensor([])", "zero_point=tensor([], dtype=torch.int32)",
                           "minval=tensor([])", "export_mode=False"}) {
    EXPECT_NE(d.find(part), std::string::npos) << d;
  }
  ASSERT_OK(calc->SetExportMode(true));
  EXPECT_NE(calc->Description().find("export_mode=True"), std::string::npos);

  // The running kinds add a line with the running buffers.
  ASSERT_OK_AND_ASSIGN(Calc running, Create("global_minmax", MakeSpec("int8", QS::kSymmetric)));
  EXPECT_NE(running->Description().find("\nrunning_min="), std::string::npos);
}

// L19 (LATEST-TESTS, Policy 6): int8 SYM with an e8m0 scale, ACTIVATION.
TEST(Lifecycle, L19Int8E8m0) {
  QuantSpec spec = MakeSpec("int8", QS::kSymmetric, Granularity::PerTensor(), Target::kActivation);
  spec.scale_dtype = "float8_e8m0fnu";
  for (const char* key : {"default", "dynamic"}) {
    SCOPED_TRACE(key);
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, spec));
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, F32({1, 4}, {-3.0, 0.01, 1.01, 3.0})));
    EXPECT_TRUE(QParamsAre(q, {1, 1}, {0x3D000000}, I32{0}, U32{B(-3)}));  // 2^-5
    if (auto* stateful = AsStateful(calc.get())) {
      EXPECT_EQ(calc->key(), "moving_average");
      EXPECT_EQ(stateful->GetQParams(), q);  // "also after disabling the observer"
    }
  }
}

// ---- Export mode and the frozen range (§1.4) ----

// Export mode before any forward returns the empty buffers, reads nothing of the
// input and does not initialize.
TEST(ExportMode, BeforeTheFirstForwardReturnsEmptyBuffers) {
  for (const char* key : kStatefulKeys) {
    SCOPED_TRACE(key);
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, MakeSpec("int8", QS::kAsymmetric)));
    ASSERT_OK(calc->SetExportMode(true));
    for (const Tensor& x : {Vec({NAN, 1}), F32({0, 3}, {}), Vec({1, 2}, DType::kBFloat16)}) {
      ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, x));
      EXPECT_EQ(q, QParams::Empty(true, true));
    }
    EXPECT_FALSE(calc->initialized());
    EXPECT_EQ(AsStateful(calc.get())->observation_count(), 0);
    EXPECT_OK(calc->SetGranularity(Granularity::PerChannel(0)));  // still allowed
    ASSERT_OK(calc->SetExportMode(false));
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, F32({2, 2}, {-1, 1, 0, 7})));
    EXPECT_EQ(q.shape, (Shape{2, 1}));
    EXPECT_TRUE(calc->initialized());
  }
}

TEST(ExportMode, TogglesFreely) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", MakeSpec("int8", QS::kSymmetric)));
  auto* stateful = AsStateful(calc.get());
  for (bool on : {true, true, false, true, false, false}) {
    ASSERT_OK(calc->SetExportMode(on));
    EXPECT_EQ(stateful->export_mode(), on);
  }
}

// §1.4 frozen range: only the first forward computes (from the shape alone, in
// float32); later forwards return the buffers whatever the input (FORMAT rule 1).
TEST(FrozenRange, OnlyTheFirstForwardComputes) {
  for (const char* key : kStatefulKeys) {
    SCOPED_TRACE(key);
    QuantSpec spec = MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(0));
    spec.float_range = {-5.0, 5.0};
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, spec));
    ASSERT_OK_AND_ASSIGN(QParams q,
                         Fwd(*calc, MakeTensor(DType::kBFloat16, {2, 3}, {1, 2, 3, 4, 5, 6})));
    EXPECT_TRUE(QParamsAre(q, {2, 1}, Repeat(0x3D20A0A1u, 2), I32{0, 0}, Repeat(B(-5), 2)));
    EXPECT_EQ(q.precision, DType::kFloat32);  // both bounds: P = float32 (§2.3)
    EXPECT_EQ(calc->compute_dtype_for_export(), DType::kBFloat16);
    if (auto* running = AsRunning(calc.get())) {
      EXPECT_EQ(running->running_range().precision, DType::kFloat32);
    }
    for (const Tensor& x : {Vec({NAN, INFINITY}), F32({5, 5}, RandN(25, 1)), F32({0}, {}),
                            Vec({100, -100}, DType::kFloat16)}) {
      ASSERT_OK_AND_ASSIGN(QParams cached, Fwd(*calc, x));
      EXPECT_EQ(cached, q);
    }
    EXPECT_EQ(AsStateful(calc.get())->observation_count(), 1);
  }
}

// FORMAT rule 2: the first forward with both bounds set still rejects non-finite
// values, and does not initialize.
TEST(FrozenRange, FirstForwardStillRejectsNonFinite) {
  QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
  spec.float_range = {-5.0, 5.0};
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", spec));
  EXPECT_CODE(Fwd(*calc, Vec({NAN, 1})), kInvalid);
  EXPECT_FALSE(calc->initialized());
  ASSERT_OK(calc->SetGranularity(Granularity::PerChannel(0)));
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, Vec({1, 2})));
  EXPECT_TRUE(QParamsAre(q, {2}, Repeat(0x3D20A0A1u, 2), I32{0, 0}, Repeat(B(-5), 2)));
  ASSERT_OK_AND_ASSIGN(QParams cached, Fwd(*calc, Vec({INFINITY})));
  EXPECT_EQ(cached, q);
}

// ---- set_granularity (§1.6, Policy 3) ----

TEST(SetGranularity, RulesForEveryKind) {
  for (const char* key : kAllKeys) {
    SCOPED_TRACE(key);
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, MakeSpec("int8", QS::kSymmetric)));
    EXPECT_OK(calc->SetGranularity(Granularity::PerBlock(-1, 2)));
    EXPECT_EQ(calc->spec().granularity, Granularity::PerBlock(-1, 2));

    // Unbuildable: INVALID_ARGUMENT, nothing changes.
    const CalculatorState before = calc->ExportState();
    EXPECT_CODE(calc->SetGranularity(Granularity::PerBlock(0, 0)), kInvalid);
    EXPECT_TRUE(SameState(before, calc->ExportState()));

    // A granularity that does not fit the input fails the forward, not the setter,
    // and the calculator stays uninitialized.
    EXPECT_CODE(Fwd(*calc, Vec({1, 2, 3})), kInvalid);  // 3 % 2 != 0
    EXPECT_FALSE(calc->initialized());
    EXPECT_OK(calc->SetGranularity(Granularity::PerChannel(0)));

    ASSERT_OK(Fwd(*calc, Vec({1, 2, 3})).status());
    const CalculatorState after = calc->ExportState();
    EXPECT_CODE(calc->SetGranularity(Granularity::PerTensor()), kPrecondition);
    // Initialized wins over an unbuildable granularity; still nothing changes.
    EXPECT_CODE(calc->SetGranularity(Granularity::PerBlock(0, 0)), kPrecondition);
    EXPECT_TRUE(SameState(after, calc->ExportState()));
  }
}

// ---- Policies 1, 2 and 4: error codes, and a failed step changes nothing ----

// Runs `step` and expects `code` with the calculator's exported state unchanged.
template <typename Step>
void ExpectFailsWithoutChange(QParamsCalculatorBase& calc, absl::StatusCode code, Step step) {
  const CalculatorState before = calc.ExportState();
  EXPECT_CODE(step(), code);
  EXPECT_TRUE(SameState(before, calc.ExportState())) << "a failed step changed the state";
}

TEST(Policy1, NonFiniteInputsAreRejectedBeforeAndAfterInitialization) {
  for (const char* key : kAllKeys) {
    for (DType p : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
      for (double bad : {NAN, INFINITY, -INFINITY}) {
        SCOPED_TRACE(absl::StrCat(key, " ", DTypeName(p), " ", bad));
        ASSERT_OK_AND_ASSIGN(
            Calc calc, Create(key, MakeSpec("int8", QS::kAsymmetric, Granularity::PerChannel(0))));
        const Tensor x = MakeTensor(p, {2, 3}, {1, 2, 3, 4, bad, 6});
        ExpectFailsWithoutChange(*calc, kInvalid, [&] { return Fwd(*calc, x); });
        EXPECT_FALSE(calc->initialized());
        ASSERT_OK(Fwd(*calc, MakeTensor(p, {2, 3}, {1, -2, 3, 4, 5, 6})).status());
        ExpectFailsWithoutChange(*calc, kInvalid, [&] { return Fwd(*calc, x); });
      }
    }
  }
}

// Range observations are checked too: a NaN in a block minimum is rejected.
TEST(Policy1, NonFiniteRangeObservationsAreRejected) {
  for (const char* key : kAllKeys) {
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, MakeSpec("int8", QS::kSymmetric)));
    const Tensor lo = Vec({NAN}), hi = Vec({1});
    ExpectFailsWithoutChange(*calc, kInvalid, [&] {
      return calc->Forward(Observation::FromRange({4}, lo.view(), hi.view()));
    });
  }
}

// Policy 2: after initialization, another input dtype or block count N fails with
// FAILED_PRECONDITION; another shape with the same N is fine. (FORMAT anchor
// policy/stable-state.)
TEST(Policy2, StatefulShapeAndDtypeAreFixed) {
  for (const char* key : kStatefulKeys) {
    SCOPED_TRACE(key);
    ASSERT_OK_AND_ASSIGN(Calc calc,
                         Create(key, MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(0))));
    ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, F32({2, 2}, {1, -2, 3, 4})));
    EXPECT_TRUE(
        QParamsAre(q1, {2, 1}, {B(2 / 127.5f), B(4 / 127.5f)}, I32{0, 0}, U32{B(-2), B(-4)}));
    ASSERT_OK(Fwd(*calc, F32({2, 3}, {1, -2, 5, 3, 4, 0.5})).status());  // same N = (2, 1)
    ExpectFailsWithoutChange(*calc, kPrecondition, [&] {
      return Fwd(*calc, F32({3, 1}, {1, 3, 2}));
    });
    ExpectFailsWithoutChange(*calc, kPrecondition, [&] {
      return Fwd(*calc, MakeTensor(DType::kFloat16, {2, 2}, {1, -2, 3, 4}));
    });
    ExpectFailsWithoutChange(*calc, kPrecondition, [&] {
      return Fwd(*calc, MakeTensor(DType::kFloat64, {2, 2}, {1, -2, 3, 4}));
    });
    // Export mode returns the buffers without looking at the input.
    ASSERT_OK(calc->SetExportMode(true));
    ASSERT_OK_AND_ASSIGN(QParams cached,
                         Fwd(*calc, MakeTensor(DType::kFloat16, {3, 1}, {1, 3, 2})));
    EXPECT_EQ(cached, AsStateful(calc.get())->GetQParams());
    EXPECT_EQ(cached.shape, (Shape{2, 1}));
  }
}

// Policy 2 also holds for range observations.
TEST(Policy2, RangeObservationWithAnotherDtype) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("global_minmax", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK(Fwd(*calc, Vec({-1, 2})).status());
  const Tensor lo = Vec({-1}, DType::kBFloat16), hi = Vec({1}, DType::kBFloat16);
  ExpectFailsWithoutChange(*calc, kPrecondition, [&] {
    return calc->Forward(Observation::FromRange({2}, lo.view(), hi.view()));
  });
}

// Policy 4: zero-size inputs, and rank-0 range observations.
TEST(Policy4, ZeroSizeInputsAreRejected) {
  for (const char* key : kAllKeys) {
    SCOPED_TRACE(key);
    ASSERT_OK_AND_ASSIGN(Calc calc,
                         Create(key, MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(0))));
    ExpectFailsWithoutChange(*calc, kInvalid, [&] { return Fwd(*calc, F32({3, 0}, {})); });
    ExpectFailsWithoutChange(*calc, kInvalid, [&] { return Fwd(*calc, F32({0, 4}, {})); });
    EXPECT_FALSE(calc->initialized());
    ASSERT_OK(calc->SetGranularity(Granularity::PerTensor()));
    const Tensor one = Vec({1});
    ExpectFailsWithoutChange(*calc, kInvalid, [&] {
      return calc->Forward(Observation::FromRange({}, one.view(), one.view()));
    });
    // After initialization a zero-size input also changes N (Policy 2), so either
    // code may answer; it must still fail and change nothing.
    ASSERT_OK(Fwd(*calc, Vec({1, 2})).status());
    const CalculatorState before = calc->ExportState();
    const absl::Status late = Fwd(*calc, F32({0}, {})).status();
    EXPECT_TRUE(late.code() == kInvalid || late.code() == kPrecondition) << late;
    EXPECT_TRUE(SameState(before, calc->ExportState()));
  }
}

// A granularity that does not fit the input is INVALID_ARGUMENT at forward time.
TEST(Policy4, GranularityThatDoesNotFitTheInput) {
  for (const char* key : kAllKeys) {
    SCOPED_TRACE(key);
    ASSERT_OK_AND_ASSIGN(Calc calc,
                         Create(key, MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(2))));
    ExpectFailsWithoutChange(*calc, kInvalid, [&] {
      return Fwd(*calc, F32({2, 2}, {1, 2, 3, 4}));
    });
    ASSERT_OK(Fwd(*calc, F32({1, 1, 2}, {1, 2})).status());
    ExpectFailsWithoutChange(*calc, kInvalid, [&] { return Fwd(*calc, Vec({1, 2})); });
  }
}

// ---- Observations, counts and kinds ----

// A block-range observation gives bit-identical qparams to the tensor it came from.
TEST(Observations, RangeAndTensorForwardsAgree) {
  for (const char* key : kAllKeys) {
    for (DType p : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(key, " ", DTypeName(p)));
      const QuantSpec spec = MakeSpec("uint4", QS::kAsymmetric, Granularity::PerBlock(1, 4));
      ASSERT_OK_AND_ASSIGN(Calc by_tensor, Create(key, spec));
      ASSERT_OK_AND_ASSIGN(Calc by_range, Create(key, spec));
      for (uint32_t seed = 0; seed < 3; ++seed) {
        const Tensor x = MakeTensor(p, {3, 8}, RandN(24, 20 + seed, 3));
        ASSERT_OK_AND_ASSIGN(BlockRange r, ObserveRange(x.view(), {1, 4}));
        ASSERT_OK_AND_ASSIGN(QParams a, Fwd(*by_tensor, x));
        ASSERT_OK_AND_ASSIGN(QParams b, by_range->Forward(Observation::FromRange(
                                            x.shape, r.min.view(), r.max.view())));
        EXPECT_EQ(a, b);
      }
      EXPECT_TRUE(SameState(by_tensor->ExportState(), by_range->ExportState()));
    }
  }
}

TEST(Kinds, KeysStatefulnessAndDefaults) {
  for (const char* key : kAllKeys) {
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, MakeSpec("int8", QS::kSymmetric)));
    EXPECT_EQ(calc->key(), key);
    EXPECT_EQ(calc->stateful(), std::string(key) != "dynamic");
    EXPECT_EQ(calc->spec().quant_min, -128);  // the spec is resolved
  }
  ASSERT_OK_AND_ASSIGN(Calc ma, Create("moving_average", MakeSpec("int8", QS::kSymmetric)));
  EXPECT_EQ(dynamic_cast<MovingAverageQParamsCalculator&>(*ma).averaging_constant(), 0.01);
}

// Running buffers keep the working precision of the first range (§1.3, FORMAT rule 7).
TEST(Kinds, RunningRangeKeepsTheInputPrecision) {
  for (DType p : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", MakeSpec("int8", QS::kSymmetric)));
    ASSERT_OK(Fwd(*calc, Vec({-3, 1}, p)).status());
    ASSERT_OK(Fwd(*calc, Vec({-0.1, 7}, p)).status());
    const WorkingRange& r = AsRunning(calc.get())->running_range();
    EXPECT_EQ(r.precision, p);
    if (p == DType::kBFloat16) {
      EXPECT_EQ(r.hi[0], RoundToBFloat16(static_cast<float>(r.hi[0])));
    }
    if (p == DType::kFloat16) {
      EXPECT_EQ(r.hi[0], RoundToHalf(static_cast<float>(r.hi[0])));
    }
  }
}

// §5.7(i) through the calculator, and the bf16 EMA with a fixed max of 7.0
// (FORMAT anchor edge/ema-bf16).
TEST(Kinds, MovingAverageSequences) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK_AND_ASSIGN(QParams q1, Fwd(*calc, Vec({-3, 0, 3})));
  EXPECT_TRUE(QParamsAre(q1, {1}, {0x3CC0C0C1}, I32{0}, U32{B(-3)}));
  ASSERT_OK_AND_ASSIGN(QParams q2, Fwd(*calc, Vec({-6, 0, 6})));
  EXPECT_TRUE(QParamsAre(q2, {1}, {0x3CC2AE33}, I32{0}, U32{0xC041EB85}));

  QuantSpec spec = MakeSpec("int8", QS::kAsymmetric);
  spec.float_range = {std::nullopt, 7.0};
  ASSERT_OK_AND_ASSIGN(Calc bf, Create("moving_average", spec));
  // [-3, 1]: scale bf16(10/255) = 0x3D21, r = bf16(-3/scale) = -76.5 -> RNE -76, zp -52.
  ASSERT_OK_AND_ASSIGN(QParams b1, Fwd(*bf, FromBits16(DType::kBFloat16, {2}, {0xc040, 0x3f80})));
  EXPECT_TRUE(QParamsAre(b1, {1}, {0x3D210000}, I32{-52}, U32{0xC0400000}));
  // [-6, 2]: running min bf16(bf16(0.01·-6) + bf16(0.99·-3)) = -3.03125; max stays 7.
  ASSERT_OK_AND_ASSIGN(QParams b2, Fwd(*bf, FromBits16(DType::kBFloat16, {2}, {0xc0c0, 0x4000})));
  EXPECT_TRUE(QParamsAre(b2, {1}, {0x3D210000}, I32{-51}, U32{0xC0420000}));
  ASSERT_OK_AND_ASSIGN(QParams b3, Fwd(*bf, FromBits16(DType::kBFloat16, {2}, {0xbf80, 0x3f00})));
  EXPECT_TRUE(QParamsAre(b3, {1}, {0x3D210000}, I32{-52}, U32{0xC0410000}));
}

TEST(Kinds, ObservationCountCountsComputingForwardsOnly) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("global_minmax", MakeSpec("int8", QS::kSymmetric)));
  auto* stateful = AsStateful(calc.get());
  ASSERT_OK(Fwd(*calc, Vec({1})).status());
  ASSERT_OK(Fwd(*calc, Vec({2})).status());
  EXPECT_CODE(Fwd(*calc, Vec({NAN})), kInvalid);
  ASSERT_OK(calc->SetExportMode(true));
  ASSERT_OK(Fwd(*calc, Vec({3})).status());
  EXPECT_EQ(stateful->observation_count(), 2);
}

}  // namespace
}  // namespace qparams::testing
