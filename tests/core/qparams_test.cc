// The numerics once the block range is known: get_range's float_range handling
// (semantics.md §2.1), the running updates (§1.5) and qparams_from_range (§5–§7),
// checked bit for bit against the worked examples of the reference.

#include "core/qparams.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/range.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using QS = QScheme;
using I32 = std::vector<int32_t>;
using U32 = std::vector<uint32_t>;

constexpr uint32_t kEpsBits = 0x34000000;        // 2^-23, the scale floor
constexpr uint32_t kMinNormalBits = 0x00800000;  // 2^-126, the e8m0 floor
constexpr uint32_t kNegZero = 0x80000000;
constexpr uint32_t kPosZero = 0x00000000;

uint32_t B(float f) { return FloatBits(f); }

// The static calculator's numerics for one input: block range, get_range,
// qparams_from_range.
absl::StatusOr<QParams> Compute(const QuantSpec& spec, const Tensor& x) {
  absl::StatusOr<QuantSpec> resolved = spec.Resolve();
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<Shape> block = resolved->granularity.BlockShape(x.shape, resolved->target);
  if (!block.ok()) return block.status();
  absl::StatusOr<BlockRange> range = ObserveRange(x.view(), *block);
  if (!range.ok()) return range.status();
  const WorkingRange wr = GetRange(&*range, range->min.shape, resolved->float_range);
  return QParamsFromRange(QParamsRecipe::FromSpec(*resolved), wr);
}

QParamsRecipe Recipe(const QuantSpec& spec) {
  absl::StatusOr<QuantSpec> resolved = spec.Resolve();
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return QParamsRecipe::FromSpec(resolved.value_or(QuantSpec()));
}

WorkingRange Range(DType precision, std::vector<double> lo, std::vector<double> hi) {
  WorkingRange r;
  r.precision = precision;
  r.shape = {static_cast<int64_t>(lo.size())};
  r.lo = std::move(lo);
  r.hi = std::move(hi);
  return r;
}

// ---- §5.7 worked examples ----

TEST(WorkedExamples, A_Int8SymmetricPerTensor) {  // semantics.md §5.7(a)
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec("int8", QS::kSymmetric), Vec({-1, 0, 3})));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3CC0C0C1}, I32{0}, U32{B(-3)}));
  EXPECT_EQ(q.precision, DType::kFloat32);
}

TEST(WorkedExamples, B_Uint8AsymmetricRoundsHalfToEven) {  // §5.7(b): r = -42.5 -> -42
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec("uint8", QS::kAsymmetric), Vec({-1, 0, 5})));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3CC0C0C1}, I32{42}, U32{B(-1)}));
}

TEST(WorkedExamples, C_Int8Asymmetric) {  // §5.7(c)
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec("int8", QS::kAsymmetric), Vec({-1, 0, 7})));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3D008081}, I32{-96}, U32{B(-1)}));
}

// §5.7(d): the float32 scale makes r = -127.49999, so zp = -1 (exact arithmetic: 0).
TEST(WorkedExamples, D_Int8AsymmetricScaleRoundingDecidesZeroPoint) {
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec("int8", QS::kAsymmetric), Vec({-10, 0, 10})));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3DA0A0A1}, I32{-1}, U32{B(-10)}));
}

// §5.7(e): int4 per_channel(axis=0) on a (2, 4) weight, three schemes.
TEST(WorkedExamples, E_Int4PerChannel) {
  const Tensor w = F32({2, 4}, {-0.7, 0.1, 0.35, 0.2, 0, 0.5, -1.0, 0.25});
  const U32 minval = {B(-0.7f), B(-1.0f)};
  {
    ASSERT_OK_AND_ASSIGN(QParams q,
                         Compute(MakeSpec("int4", QS::kSymmetric, Granularity::PerChannel(0)), w));
    EXPECT_TRUE(QParamsAre(q, {2, 1}, {0x3DBF258C, 0x3E088889}, I32{0, 0}, minval));
  }
  {
    ASSERT_OK_AND_ASSIGN(
        QParams q,
        Compute(MakeSpec("int4", QS::kSymmetricWithClipping, Granularity::PerChannel(0)), w));
    EXPECT_TRUE(QParamsAre(q, {2, 1}, {0x3DCCCCCD, 0x3E124925}, I32{0, 0}, minval));
  }
  {
    ASSERT_OK_AND_ASSIGN(QParams q,
                         Compute(MakeSpec("int4", QS::kAsymmetric, Granularity::PerChannel(0)), w));
    EXPECT_TRUE(QParamsAre(q, {2, 1}, {0x3D8F5C29, 0x3DCCCCCD}, I32{2, 2}, minval));
  }
}

TEST(WorkedExamples, F_Float8HasNoZeroPointOrMinval) {  // §5.7(f)
  ASSERT_OK_AND_ASSIGN(QParams e4m3,
                       Compute(MakeSpec("float8_e4m3fn", QS::kSymmetric), Vec({-3, 0, 3})));
  EXPECT_TRUE(QParamsAre(e4m3, {1}, {0x3BDB6DB7}, std::nullopt, std::nullopt));
  ASSERT_OK_AND_ASSIGN(QParams e5m2,
                       Compute(MakeSpec("float8_e5m2", QS::kSymmetric), Vec({-3, 0, 3})));
  EXPECT_TRUE(QParamsAre(e5m2, {1}, {0x385B6DB7}, std::nullopt, std::nullopt));
}

TEST(WorkedExamples, G_Uint4AsymmetricTieToEven) {  // §5.7(g): r = -2.5 -> -2
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec("uint4", QS::kAsymmetric), Vec({-1, 0, 5})));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3ECCCCCD}, I32{2}, U32{B(-1)}));
}

// §5.7(h): every step rounded to bf16; the bf16 scale 0x3CC1 widens to 0x3CC10000.
TEST(WorkedExamples, H_BFloat16WorkingPrecision) {
  ASSERT_OK_AND_ASSIGN(
      QParams sym, Compute(MakeSpec("int8", QS::kSymmetric), Vec({-1, 0, 3}, DType::kBFloat16)));
  EXPECT_TRUE(QParamsAre(sym, {1}, {0x3CC10000}, I32{0}, U32{B(-3)}));
  EXPECT_EQ(sym.scale[0], 0.0235595703125f);
  EXPECT_EQ(sym.precision, DType::kBFloat16);

  ASSERT_OK_AND_ASSIGN(
      QParams asym, Compute(MakeSpec("uint8", QS::kAsymmetric), Vec({-1, 0, 5}, DType::kBFloat16)));
  EXPECT_TRUE(QParamsAre(asym, {1}, {0x3CC10000}, I32{42}, U32{B(-1)}));
}

// The same rule for float16 (Policy 5): the float32 quotient rounded to half.
TEST(WorkedExamples, H_Float16WorkingPrecision) {
  ASSERT_OK_AND_ASSIGN(QParams q,
                       Compute(MakeSpec("int8", QS::kSymmetric), Vec({-1, 0, 3}, DType::kFloat16)));
  EXPECT_TRUE(QParamsAre(q, {1}, {B(RoundToHalf(3.0f / 127.5f))}, I32{0}, U32{B(-3)}));
  EXPECT_NE(q.scale[0], 3.0f / 127.5f);
  EXPECT_EQ(q.precision, DType::kFloat16);
}

// float64 inputs compute in double; the buffers then hold the float32 of the result.
TEST(WorkedExamples, Float64WorkingPrecision) {
  ASSERT_OK_AND_ASSIGN(QParams q,
                       Compute(MakeSpec("int8", QS::kSymmetric), Vec({-1, 0, 3}, DType::kFloat64)));
  EXPECT_TRUE(QParamsAre(q, {1}, {B(static_cast<float>(3.0 / 127.5))}, I32{0}, U32{B(-3)}));
  EXPECT_EQ(q.precision, DType::kFloat64);
}

// §5.7(i): EMA with c = 0.01; each product and the sum rounded to float32.
TEST(WorkedExamples, I_MovingAverageUpdate) {
  const WorkingRange first = Range(DType::kFloat32, {-3}, {3});
  const WorkingRange second = Range(DType::kFloat32, {-6}, {6});
  const WorkingRange running = MovingAverageUpdate(0.01, second, first);
  EXPECT_EQ(B(static_cast<float>(running.lo[0])), 0xC041EB85u);
  EXPECT_EQ(B(static_cast<float>(running.hi[0])), 0x4041EB85u);
  EXPECT_EQ(running.precision, DType::kFloat32);

  const QParams q = QParamsFromRange(Recipe(MakeSpec("int8", QS::kSymmetric)), running);
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3CC2AE33}, I32{0}, U32{0xC041EB85}));
}

// §5.7(j): both bounds set: float32 fills, the observation is not needed.
TEST(WorkedExamples, J_FrozenFloatRange) {
  const WorkingRange sym_range = GetRange(nullptr, {1}, FloatRange{-5.0, 5.0});
  EXPECT_EQ(sym_range.precision, DType::kFloat32);
  const QParams sym = QParamsFromRange(Recipe(MakeSpec("int8", QS::kSymmetric)), sym_range);
  EXPECT_TRUE(QParamsAre(sym, {1}, {0x3D20A0A1}, I32{0}, U32{B(-5)}));

  const WorkingRange asym_range = GetRange(nullptr, {1}, FloatRange{0.0, 5.0});
  const QParams asym = QParamsFromRange(Recipe(MakeSpec("int8", QS::kAsymmetric)), asym_range);
  EXPECT_TRUE(QParamsAre(asym, {1}, {B(5.0f / 255.0f)}, I32{-128}, U32{kPosZero}));
}

// ---- §5.5 special inputs ----

// All-zero blocks: scale 2^-23; symmetric minval -0.0 (FORMAT rule 6), asymmetric +0.0.
TEST(SpecialInputs, AllZeroBlockInEveryPrecision) {
  struct Case {
    const char* dtype;
    QScheme q;
    std::optional<int32_t> zp;
    std::optional<uint32_t> minval;
  };
  const Case cases[] = {
      {"int8", QS::kSymmetric, 0, kNegZero},
      {"uint8", QS::kSymmetric, 128, kNegZero},
      {"uint4", QS::kSymmetric, 8, kNegZero},
      {"uint2", QS::kSymmetric, 2, kNegZero},
      {"int4", QS::kSymmetricWithClipping, 0, kNegZero},
      {"int8", QS::kAsymmetric, -128, kPosZero},
      {"uint8", QS::kAsymmetric, 0, kPosZero},
      {"float8_e4m3fn", QS::kSymmetric, std::nullopt, std::nullopt},
      {"float8_e5m2", QS::kSymmetric, std::nullopt, std::nullopt},
  };
  for (DType p : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(c.dtype, " ", QSchemeName(c.q), " ", DTypeName(p)));
      ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec(c.dtype, c.q), Vec({0, 0, 0}, p)));
      EXPECT_TRUE(QParamsAre(q, {1}, {kEpsBits},
                             c.zp ? std::optional<I32>(I32{*c.zp}) : std::nullopt,
                             c.minval ? std::optional<U32>(U32{*c.minval}) : std::nullopt));
    }
  }
}

TEST(SpecialInputs, AllZeroBlockWithE8m0ScaleGivesSmallestNormal) {
  QuantSpec fp4 = MakeSpec("float4_e2m1fn_x2", QS::kSymmetric);
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(fp4, Vec({0, 0})));
  EXPECT_TRUE(QParamsAre(q, {1}, {kMinNormalBits}, std::nullopt, std::nullopt));

  QuantSpec int8 = MakeSpec("int8", QS::kSymmetric);
  int8.scale_dtype = "float8_e8m0fnu";
  ASSERT_OK_AND_ASSIGN(QParams qi, Compute(int8, Vec({0, -0.0})));
  EXPECT_TRUE(QParamsAre(qi, {1}, {kMinNormalBits}, I32{0}, U32{kNegZero}));
}

// FORMAT rule 6: the zero sign of minval does not depend on the input's zeros.
TEST(SpecialInputs, NegativeZeroInputs) {
  for (DType p : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    SCOPED_TRACE(DTypeName(p));
    ASSERT_OK_AND_ASSIGN(QParams sym, Compute(MakeSpec("uint4", QS::kSymmetric),
                                              MakeTensor(p, {2, 2}, {-0.0, 0.0, -0.0, -0.0})));
    EXPECT_TRUE(QParamsAre(sym, {1, 1}, {kEpsBits}, I32{8}, U32{kNegZero}));
    ASSERT_OK_AND_ASSIGN(QParams all_neg,
                         Compute(MakeSpec("int8", QS::kAsymmetric), Vec({-0.0, -0.0}, p)));
    EXPECT_TRUE(QParamsAre(all_neg, {1}, {kEpsBits}, I32{-128}, U32{kPosZero}));
  }
  // A -0.0 minimum next to positive data: minval +0.0, zp = qmin.
  ASSERT_OK_AND_ASSIGN(QParams q,
                       Compute(MakeSpec("int8", QS::kAsymmetric), Vec({-0.0, 2.0, 0.0})));
  EXPECT_TRUE(QParamsAre(q, {1}, {B(2.0f / 255.0f)}, I32{-128}, U32{kPosZero}));
}

// §5.5 tiny ranges: scale floored at 2^-23; lo = -1e-6 gives mn/eps = -8.39, zp = qmin + 8.
TEST(SpecialInputs, TinyRangeFlooredAtEps) {
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec("int8", QS::kAsymmetric), Vec({-1e-6, 0})));
  EXPECT_TRUE(QParamsAre(q, {1}, {kEpsBits}, I32{-120}, U32{B(-1e-6f)}));
  ASSERT_OK_AND_ASSIGN(QParams s, Compute(MakeSpec("int8", QS::kSymmetric), Vec({-1e-6, 0})));
  EXPECT_TRUE(QParamsAre(s, {1}, {kEpsBits}, I32{0}, U32{B(-1e-6f)}));
}

// §5.2 step 3: the upper zp clamp matters when a 16-bit rounding pushes r past the
// range. float16: scale = half(2^-12 / 255) = 2^-20 (subnormal), r = -256, zp 128 -> 127.
TEST(SpecialInputs, ZeroPointClampedAtQuantMaxInFloat16) {
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec("int8", QS::kAsymmetric),
                                          Vec({-std::ldexp(1.0, -12), 0}, DType::kFloat16)));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x35800000}, I32{127}, U32{B(-std::ldexp(1.0f, -12))}));
}

// bfloat16 with the explicit range [-64, 63]: scale = bf16(0.6640625 / 127) = 171·2^-15
// (0x3BAB), r = bf16(-127.2515) = -127.5 (spacing 0.5 there), RNE -128, zp = -64 + 128
// = 64 -> clamped to 63.
TEST(SpecialInputs, ZeroPointClampedAtQuantMaxInBFloat16) {
  QuantSpec spec = MakeSpec("int8", QS::kAsymmetric);
  spec.quant_min = -64;
  spec.quant_max = 63;
  const Tensor x = FromBits16(DType::kBFloat16, {2}, {0xbf2a, 0x0000});
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(spec, x));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3BAB0000}, I32{63}, U32{B(BFloat16ToFloat(0xbf2a))}));
}

// §6: the symmetric minval is -max_abs, whatever qmin/qmax and the eps floor.
TEST(SpecialInputs, SymmetricMinvalIsMinusMaxAbs) {
  for (const char* dtype : {"int8", "uint8", "int2", "uint4"}) {
    ASSERT_OK_AND_ASSIGN(QParams q, Compute(MakeSpec(dtype, QS::kSymmetric), Vec({-1, 0, 2.5})));
    EXPECT_EQ(q.minval, std::vector<float>{-2.5f}) << dtype;
  }
  // Asymmetric: min(lo, 0), and 0 for positive-only data (clamped to include 0).
  ASSERT_OK_AND_ASSIGN(QParams pos, Compute(MakeSpec("int8", QS::kAsymmetric), Vec({10, 20})));
  EXPECT_TRUE(QParamsAre(pos, {1}, {B(20.0f / 255.0f)}, I32{-128}, U32{kPosZero}));
}

// Explicit quant ranges enter the formulas as given (FORMAT): int8 SYM on [-100, 50]
// divides by 75 and has zp trunc((50 - 100 + 1) / 2) = -24.
TEST(SpecialInputs, ExplicitQuantRangeEntersTheFormulas) {
  QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
  spec.quant_min = -100;
  spec.quant_max = 50;
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(spec, Vec({-3, 0, 3})));
  EXPECT_TRUE(QParamsAre(q, {1}, {B(3.0f / 75.0f)}, I32{-24}, U32{B(-3)}));
}

// ---- §7 e8m0 ----

TEST(E8m0, TableOfWorkedExamples) {
  struct Case {
    const char* dtype;
    double a;
    double scale;
  };
  const Case cases[] = {
      {"float4_e2m1fn_x2", 3.0, 0.5},
      {"float4_e2m1fn_x2", 10.0, 2.0},
      {"float4_e2m1fn_x2", 6.0, 1.0},
      {"float4_e2m1fn_x2", 0.3, 0.0625},
      {"float4_e2m1fn_x2", 500.0, 64.0},
      {"float4_e2m1fn_x2", 7.9, 1.0},  // floor mode
      {"float4_e2m1fn_x2", 0.0, std::ldexp(1.0, -126)},
      {"float8_e4m3fn", 3.0, std::ldexp(1.0, -7)},
      {"float8_e4m3fn", 448.0, 1.0},
      {"float8_e4m3fn", 500.0, 1.0},
      {"float8_e5m2", 3.0, std::ldexp(1.0, -14)},
      {"int8", 3.0, std::ldexp(1.0, -5)},
  };
  for (const Case& c : cases) {
    QuantSpec spec = MakeSpec(c.dtype, QS::kSymmetric);
    spec.scale_dtype = "float8_e8m0fnu";
    const QParamsRecipe recipe = Recipe(spec);
    for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      // max_abs from either side; the input precision does not matter for these values.
      for (const WorkingRange& r : {Range(p, {-c.a}, {c.a / 4}), Range(p, {0}, {c.a})}) {
        SCOPED_TRACE(absl::StrCat(c.dtype, " a=", c.a, " ", DTypeName(p)));
        const QParams q = QParamsFromRange(recipe, r);
        ASSERT_EQ(q.scale.size(), 1u);
        EXPECT_EQ(q.scale[0], static_cast<float>(c.scale));
        const bool is_int = std::string(c.dtype) == "int8";
        EXPECT_EQ(q.has_zero_point, is_int);
        EXPECT_EQ(q.has_minval, is_int);
        if (is_int) {
          EXPECT_EQ(q.zero_point, I32{0});  // Policy 6
          EXPECT_EQ(q.minval, std::vector<float>{static_cast<float>(-c.a)});
        }
      }
    }
  }
}

// §7: Inf has the all-ones exponent, so s = 2^(128 - t) (2^126 for fp4). (The service
// never gets here with it: Policy 1 rejects non-finite inputs earlier.)
TEST(E8m0, InfiniteMaxAbsGivesTopPowerOfTwo) {
  const QParamsRecipe fp4 = Recipe(MakeSpec("float4_e2m1fn_x2", QS::kSymmetric));
  const double inf = std::numeric_limits<double>::infinity();
  for (const WorkingRange& r :
       {Range(DType::kFloat32, {0}, {inf}), Range(DType::kFloat32, {-inf}, {0})}) {
    const QParams q = QParamsFromRange(fp4, r);
    EXPECT_EQ(q.scale[0], std::ldexp(1.0f, 126));
  }
}

// §5.5 / §7: NaN propagates through the max of |lo| and |hi| as torch.max does: the
// scale is NaN (the eps clamp keeps it), the asymmetric zero point is x86's INT32_MIN,
// and the e8m0 path hides it as 2^(128 - t). Policy 1 keeps NaN out of the service;
// this pins the numerics a restored state could still reach.
TEST(SpecialInputs, NaNPropagatesLikeTorch) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const WorkingRange r = Range(DType::kFloat32, {0}, {nan});
  const QParams sym = QParamsFromRange(Recipe(MakeSpec("int8", QS::kSymmetric)), r);
  EXPECT_TRUE(std::isnan(sym.scale[0]));
  EXPECT_TRUE(std::isnan(sym.minval[0]));
  EXPECT_EQ(sym.zero_point[0], 0);
  const QParams asym = QParamsFromRange(Recipe(MakeSpec("int8", QS::kAsymmetric)), r);
  EXPECT_TRUE(std::isnan(asym.scale[0]));
  EXPECT_EQ(asym.zero_point[0], std::numeric_limits<int32_t>::min());
  const QParams fp4 = QParamsFromRange(Recipe(MakeSpec("float4_e2m1fn_x2", QS::kSymmetric)), r);
  EXPECT_EQ(fp4.scale[0], std::ldexp(1.0f, 126));
}

// LATEST-TESTS vector §9.3 L19 at the numeric level: [[-3, 0.01, 1.01, 3]].
TEST(E8m0, Int8SymmetricL19) {
  QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
  spec.scale_dtype = "float8_e8m0fnu";
  ASSERT_OK_AND_ASSIGN(QParams q, Compute(spec, F32({1, 4}, {-3.0, 0.01, 1.01, 3.0})));
  EXPECT_TRUE(QParamsAre(q, {1, 1}, {0x3D000000}, I32{0}, U32{B(-3)}));
}

TEST(E8m0, RecipeTargets) {
  const std::pair<const char*, int> targets[] = {
      {"float4_e2m1fn_x2", 2}, {"float8_e4m3fn", 8}, {"float8_e5m2", 15}, {"int8", 6}};
  for (auto [dtype, t] : targets) {
    QuantSpec spec = MakeSpec(dtype, QS::kSymmetric);
    spec.scale_dtype = "float8_e8m0fnu";
    EXPECT_EQ(Recipe(spec).e8m0_target, t) << dtype;
  }
  EXPECT_EQ(Recipe(MakeSpec("float8_e4m3fn", QS::kSymmetric)).e8m0_target, std::nullopt);
}

TEST(QParamsRecipe, FromResolvedSpec) {
  const QParamsRecipe swc = Recipe(MakeSpec("int8", QS::kSymmetricWithClipping));
  EXPECT_TRUE(swc.symmetric);
  EXPECT_EQ(swc.quant_min, -127);
  EXPECT_EQ(swc.quant_max, 127);
  EXPECT_TRUE(swc.has_zero_point);
  const QParamsRecipe asym = Recipe(MakeSpec("uint4", QS::kAsymmetric));
  EXPECT_FALSE(asym.symmetric);
  EXPECT_EQ(asym.quant_min, 0);
  EXPECT_EQ(asym.quant_max, 15);
  EXPECT_FALSE(Recipe(MakeSpec("float8_e5m2", QS::kSymmetric)).has_zero_point);
}

// ---- §2.1 get_range ----

TEST(GetRange, ClampsObservedRangeToIncludeZero) {
  const Tensor x = F32({2, 2}, {10, 20, -20, -10});
  ASSERT_OK_AND_ASSIGN(BlockRange observed, ObserveRange(x.view(), {1, 2}));
  const WorkingRange r = GetRange(&observed, {2, 1}, FloatRange{});
  EXPECT_EQ(r.shape, (Shape{2, 1}));
  EXPECT_EQ(r.precision, DType::kFloat32);
  EXPECT_EQ(r.lo, (std::vector<double>{0, -20}));
  EXPECT_EQ(r.hi, (std::vector<double>{20, 0}));
}

// A set bound is f32(v) (§11: 0.1 becomes 0.100000001490116), then cast to the input
// dtype when only one bound is set (§2.1 case B step 4).
TEST(GetRange, OneSidedBoundIsFloat32ThenInputPrecision) {
  for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
    const Tensor x = Vec({-3, 1}, p);
    ASSERT_OK_AND_ASSIGN(BlockRange observed, ObserveRange(x.view(), {2}));
    const WorkingRange r = GetRange(&observed, {1}, FloatRange{std::nullopt, 0.1});
    SCOPED_TRACE(DTypeName(p));
    EXPECT_EQ(r.precision, p);
    EXPECT_EQ(r.lo[0], -3.0);
    double expected = 0.1f;
    if (p == DType::kBFloat16) expected = 0.10009765625;
    if (p == DType::kFloat16) expected = 0.0999755859375;
    EXPECT_EQ(r.hi[0], expected);
  }
}

// Case A: both bounds set: float32 fills of shape N whatever the observation.
TEST(GetRange, BothBoundsGiveFloat32FillsAndIgnoreTheObservation) {
  const Tensor x = Vec({-300, 100}, DType::kBFloat16);
  ASSERT_OK_AND_ASSIGN(BlockRange observed, ObserveRange(x.view(), {1}));
  const WorkingRange r = GetRange(&observed, {2}, FloatRange{-0.1, 0.3});
  EXPECT_EQ(r.precision, DType::kFloat32);
  EXPECT_EQ(r.lo, (std::vector<double>{double(-0.1f), double(-0.1f)}));
  EXPECT_EQ(r.hi, (std::vector<double>{double(0.3f), double(0.3f)}));
  const WorkingRange none = GetRange(nullptr, {1, 3}, FloatRange{-1.0, 1.0});
  EXPECT_EQ(none.shape, (Shape{1, 3}));
  EXPECT_EQ(none.lo.size(), 3u);
}

// ---- §1.5 running updates ----

// A fixed bound fed into the EMA drifts: 7.0 -> 7.0000005 after one update with
// c = 0.01; 10, 5, 3 and 1 stay exact.
TEST(MovingAverage, FixedBoundDriftsByOneUlpForSevenOnly) {
  for (double v : {7.0, 10.0, 5.0, 3.0, 1.0}) {
    const WorkingRange fixed = Range(DType::kFloat32, {-v}, {v});
    const WorkingRange next = MovingAverageUpdate(0.01, fixed, fixed);
    if (v == 7.0) {
      EXPECT_EQ(B(static_cast<float>(next.hi[0])), 0x40E00001u);  // 7.0000005
      EXPECT_EQ(B(static_cast<float>(next.lo[0])), 0xC0E00001u);
    } else {
      EXPECT_EQ(next.hi[0], v);
      EXPECT_EQ(next.lo[0], -v);
    }
  }
}

// bf16: the products and the sum each rounded to bf16; c and 1 - c enter as float32.
TEST(MovingAverage, BFloat16RoundsEveryStep) {
  const float c = 0.01f, keep = static_cast<float>(1.0 - 0.01);
  const WorkingRange running = Range(DType::kBFloat16, {-3}, {7});
  const WorkingRange observed = Range(DType::kBFloat16, {-6}, {7});
  const WorkingRange next = MovingAverageUpdate(0.01, observed, running);
  EXPECT_EQ(next.precision, DType::kBFloat16);
  auto ema = [&](float x, float run) {
    return RoundToBFloat16(RoundToBFloat16(c * x) + RoundToBFloat16(keep * run));
  };
  EXPECT_EQ(next.lo[0], ema(-6, -3));
  EXPECT_EQ(next.hi[0], ema(7, 7));
  EXPECT_EQ(next.lo[0], static_cast<double>(RoundToBFloat16(next.lo[0])));  // representable
}

// FORMAT rule 7: 1 - c is computed in double, then enters as float32. For c = 0.9,
// f32(1 - 0.9) = 0.1f differs from 1 - f32(0.9) = 0.100000024, and the result shows it.
TEST(MovingAverage, OneMinusCIsComputedInDouble) {
  const float c = 0.9f;
  const float keep = static_cast<float>(1.0 - 0.9);
  const float keep_in_float = 1.0f - c;
  ASSERT_NE(keep, keep_in_float);
  const float expected = (c * 5.0f) + (keep * 7.0f);
  const float wrong = (c * 5.0f) + (keep_in_float * 7.0f);
  ASSERT_NE(expected, wrong);  // the input tells the two apart
  const WorkingRange next = MovingAverageUpdate(0.9, Range(DType::kFloat32, {-1}, {5}),
                                                Range(DType::kFloat32, {-1}, {7}));
  EXPECT_EQ(next.hi[0], expected);
}

TEST(MovingAverage, ConstantOneTakesTheNewRange) {
  const WorkingRange next = MovingAverageUpdate(1.0, Range(DType::kFloat32, {-2.5}, {4}),
                                                Range(DType::kFloat32, {-9}, {9}));
  EXPECT_EQ(next.lo[0], -2.5);
  EXPECT_EQ(next.hi[0], 4.0);
}

TEST(GlobalMinMax, ElementwiseMinOfMinimaAndMaxOfMaxima) {
  const WorkingRange running = Range(DType::kFloat32, {-1, -5, 0}, {2, 1, 3});
  const WorkingRange observed = Range(DType::kFloat32, {-3, -1, 0}, {1, 10, 3});
  const WorkingRange next = GlobalMinMaxUpdate(observed, running);
  EXPECT_EQ(next.lo, (std::vector<double>{-3, -5, 0}));
  EXPECT_EQ(next.hi, (std::vector<double>{2, 10, 3}));
}

// ---- QParams value type ----

TEST(QParams, EmptyBuffersAndBitwiseEquality) {
  const QParams e = QParams::Empty(true, true);
  EXPECT_EQ(e.shape, (Shape{0}));
  EXPECT_TRUE(e.scale.empty());
  EXPECT_TRUE(e.has_zero_point);
  EXPECT_FALSE(e.precision.has_value());
  EXPECT_FALSE(e == QParams::Empty(false, false));

  QParams a =
      QParamsFromRange(Recipe(MakeSpec("int8", QS::kSymmetric)), Range(DType::kFloat32, {0}, {0}));
  QParams b = a;
  EXPECT_TRUE(a == b);
  b.minval[0] = 0.0f;  // -0.0 vs +0.0: equal values, different bits
  EXPECT_FALSE(a == b);
}

TEST(StoredRange, KeepsFloatPrecisionRangesExactly) {
  const WorkingRange range{DType::kBFloat16, {3}, {-1.5, -0.0, -3e38}, {2.25, 0.0, 3e38f}};
  const WorkingRange back = StoredRange(range).Get();
  EXPECT_EQ(back.precision, DType::kBFloat16);
  EXPECT_EQ(back.shape, Shape{3});
  EXPECT_EQ(back.lo, range.lo);
  EXPECT_EQ(back.hi, range.hi);
  EXPECT_TRUE(std::signbit(back.lo[1]));
}

TEST(StoredRange, KeepsDoublesThatFloatCannotHold) {
  const double inf = std::numeric_limits<double>::infinity();
  const WorkingRange range{DType::kFloat64, {2}, {-0.1, -inf}, {1e300, inf}};
  const WorkingRange back = StoredRange(range).Get();
  EXPECT_EQ(back.lo, range.lo);
  EXPECT_EQ(back.hi, range.hi);
}

TEST(StoredRange, AssignReplacesEitherRepresentation) {
  StoredRange stored(WorkingRange{DType::kFloat64, {1}, {-0.1}, {0.1}});
  const WorkingRange small{DType::kFloat32, {2}, {-1, -2}, {1, 2}};
  stored.Assign(small);
  EXPECT_EQ(stored.Get().lo, small.lo);
  EXPECT_EQ(stored.Get().hi, small.hi);
  const WorkingRange wide{DType::kFloat64, {1}, {-0.1}, {0.3}};
  stored.Assign(wide);
  EXPECT_EQ(stored.Get().lo, wide.lo);
  EXPECT_EQ(stored.Get().hi, wide.hi);
  EXPECT_EQ(stored.Get().precision, DType::kFloat64);
}

}  // namespace
}  // namespace qparams::testing
