// The NVFP4 scales (nvfp4.md §2-§3): the spec's validation table, the worked examples
// E1-E5 of §3.6, and what every calculator returns and keeps.

#include "core/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/float8.h"
#include "core/qparams.h"
#include "core/range.h"
#include "core/range_kernels.h"
#include "core/registry.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

QuantSpec Nvfp4Spec(const std::string& convention = "",
                    Granularity granularity = Granularity::PerBlock(-1, 16)) {
  QuantSpec spec = MakeSpec("float4_e2m1fn_x2", QScheme::kSymmetric, std::move(granularity));
  spec.scale_dtype = "float8_e4m3fn";
  spec.convention = convention;
  return spec;
}

// Block ranges of a tensor whose blocks have these amaxes (as hi, lo = 0).
Nvfp4Scales ScalesOfAmaxes(const std::vector<double>& amax, DType precision,
                           Nvfp4Convention convention) {
  return ComputeNvfp4Scales(std::vector<double>(amax.size(), 0.0), amax, precision, convention);
}

constexpr Nvfp4Convention kCT = Nvfp4Convention::kCompressedTensors;
constexpr Nvfp4Convention kMO = Nvfp4Convention::kModelOpt;

// ---- §2: the spec ----

TEST(Nvfp4Spec, ResolvesAndNamesTheConvention) {
  ASSERT_OK_AND_ASSIGN(QuantSpec r, Nvfp4Spec().Resolve());
  EXPECT_EQ(r.scale_dtype, "float8_e4m3fn");
  EXPECT_EQ(r.convention, "compressed_tensors");
  EXPECT_TRUE(r.nvfp4_scale());
  EXPECT_FALSE(r.e8m0_scale());
  ASSERT_OK_AND_ASSIGN(QuantSpec again, r.Resolve());
  EXPECT_EQ(again, r);
  ASSERT_OK_AND_ASSIGN(QuantSpec ct, Nvfp4Spec("compressed_tensors").Resolve());
  EXPECT_EQ(ct, r);
  ASSERT_OK_AND_ASSIGN(QuantSpec mo, Nvfp4Spec("modelopt").Resolve());
  EXPECT_EQ(mo.convention, "modelopt");
  EXPECT_FALSE(mo == r);
  // The tuple form of per_block, as for activations.
  EXPECT_OK(Nvfp4Spec("", Granularity::PerBlock(std::vector<int64_t>{-1, 16})).Resolve());
}

TEST(Nvfp4Spec, FloatFourWithoutE4M3KeepsTheE8M0Path) {
  QuantSpec spec = Nvfp4Spec();
  spec.scale_dtype = "";
  ASSERT_OK_AND_ASSIGN(QuantSpec r, spec.Resolve());
  EXPECT_EQ(r.scale_dtype, "float8_e8m0fnu");
  EXPECT_EQ(r.convention, "");
}

// Each rule of the validation table, with the field its message names.
TEST(Nvfp4Spec, ValidationTable) {
  struct Case {
    const char* rule;
    QuantSpec spec;
    const char* field;
  };
  std::vector<Case> cases;
  for (const char* dtype : {"int8", "uint4", "float8_e4m3fn", "float8_e5m2"}) {
    QuantSpec s = Nvfp4Spec();
    s.dtype = dtype;
    cases.push_back({"e4m3 requires float4_e2m1fn_x2", s, "spec.scale_dtype"});
  }
  cases.push_back(
      {"per_tensor refused", Nvfp4Spec("", Granularity::PerTensor()), "spec.granularity"});
  cases.push_back(
      {"per_channel refused", Nvfp4Spec("", Granularity::PerChannel(0)), "spec.granularity"});
  for (const char* scale_dtype : {"", "float8_e8m0fnu", "float8_e8m0"}) {
    QuantSpec s = Nvfp4Spec("modelopt");
    s.scale_dtype = scale_dtype;
    cases.push_back({"a convention requires e4m3", s, "spec.convention"});
  }
  for (const char* convention : {"torchao", "COMPRESSED_TENSORS", "ModelOpt", " modelopt"}) {
    cases.push_back({"convention spelled exactly", Nvfp4Spec(convention), "spec.convention"});
  }
  for (QScheme q : {QScheme::kAsymmetric, QScheme::kSymmetricWithClipping}) {
    QuantSpec s = Nvfp4Spec();
    s.qscheme = q;
    cases.push_back({"symmetric only", s, "spec.qscheme"});
  }
  for (const Case& c : cases) {
    absl::StatusOr<QuantSpec> r = c.spec.Resolve();
    EXPECT_CODE(r, kInvalid) << c.rule;
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.field)) << c.rule << ": " << r.status();
    EXPECT_CODE(Create("static", c.spec), kInvalid) << c.rule;
  }
  EXPECT_EQ(Nvfp4Spec("ModelOpt").Resolve().status().message(),
            "spec.convention is \"ModelOpt\"; it must be \"\", \"compressed_tensors\" or "
            "\"modelopt\"");
  // dynamic refuses a float_range, as for every spec.
  QuantSpec ranged = Nvfp4Spec();
  ranged.float_range.max = 1.0;
  EXPECT_CODE(Create("dynamic", ranged), kInvalid);
  EXPECT_OK(Create("static", ranged));
}

TEST(Nvfp4Spec, SetGranularityKeepsPerBlock) {
  ASSERT_OK_AND_ASSIGN(auto calc, Create("static", Nvfp4Spec()));
  EXPECT_CODE(calc->SetGranularity(Granularity::PerTensor()), kInvalid);
  EXPECT_CODE(calc->SetGranularity(Granularity::PerChannel(0)), kInvalid);
  EXPECT_EQ(calc->spec().granularity, Granularity::PerBlock(-1, 16));
  EXPECT_OK(calc->SetGranularity(Granularity::PerBlock(-1, 32)));
  EXPECT_OK(calc->SetGranularity(Granularity::PerBlock(std::vector<int64_t>{-1, 16})));
  ASSERT_OK(Fwd(*calc, F32({1, 16}, std::vector<double>(16, 1.0))));
  EXPECT_CODE(calc->SetGranularity(Granularity::PerBlock(-1, 16)), kPrecondition);
  EXPECT_CODE(calc->SetGranularity(Granularity::PerTensor()), kPrecondition);
}

// ---- §3.6: the worked examples ----

TEST(Nvfp4Examples, E1Amax7CompressedTensorsMultipliesTheReciprocal) {
  const Nvfp4Scales s = ScalesOfAmaxes({7.0, 3.5}, DType::kFloat32, kCT);
  EXPECT_EQ(FloatBits(s.global_scale), 0x43C00001u);                // fl(fl(1/7) * 2688)
  EXPECT_NE(FloatBits(s.global_scale), FloatBits(2688.0f / 7.0f));  // not a division
  EXPECT_EQ(FloatBits(2688.0f / 7.0f), 0x43C00000u);
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x7E, 0x76}));
  EXPECT_EQ(s.amax, 7.0f);
}

TEST(Nvfp4Examples, E1Amax7ModelOpt) {
  const Nvfp4Scales s = ScalesOfAmaxes({7.0, 3.5}, DType::kFloat32, kMO);
  EXPECT_EQ(FloatBits(s.global_scale), 0x3B2AAAABu);
  EXPECT_EQ(FloatBits(6.0f * s.global_scale), 0x3C800000u);  // den = 0.015625
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x7E, 0x76}));
}

TEST(Nvfp4Examples, E2AnUnderflowedBlockIsTheConventionsOwn) {
  ASSERT_OK_AND_ASSIGN(auto ct, Create("static", Nvfp4Spec()));
  ASSERT_OK_AND_ASSIGN(auto mo, Create("static", Nvfp4Spec("modelopt")));
  std::vector<double> values(32, 1e-7);
  values[3] = 1.0;
  values[20] = -1e-7;
  const Tensor x = F32({2, 16}, values);
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*ct, x));
  EXPECT_EQ(FloatBits(*q.global_scale), FloatBits(2688.0f));
  EXPECT_EQ(q.scale_e4m3, (std::vector<uint8_t>{0x7E, 0x20}));  // underflow -> 0.125
  EXPECT_TRUE(q.scale.empty());  // the codes only: their values are decoded on demand
  EXPECT_EQ(ScaleValues(q), (std::vector<float>{448.0f, 0.125f}));
  ASSERT_OK_AND_ASSIGN(q, Fwd(*mo, x));
  EXPECT_EQ(FloatBits(*q.global_scale), 0x39C30C31u);
  EXPECT_EQ(q.scale_e4m3, (std::vector<uint8_t>{0x7E, 0x00}));  // stays 0x00
  EXPECT_EQ(ScaleValues(q), (std::vector<float>{448.0f, 0.0f}));
}

TEST(Nvfp4Examples, E3Float16AmaxBelow0041GivesGlobalScaleOne) {
  const double below = 0.040985107421875, above = 0.041107177734375, second = 0.0200042724609375;
  Nvfp4Scales s = ScalesOfAmaxes({below, second}, DType::kFloat16, kCT);
  EXPECT_EQ(s.global_scale, 1.0f);                        // 2688 / A overflows float16
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x03, 0x02}));  // 3·2^-9, 2·2^-9
  s = ScalesOfAmaxes({above, second}, DType::kFloat16, kCT);
  EXPECT_EQ(FloatBits(s.global_scale), 0x477F8000u);  // 65408
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x7E, 0x76}));
  // The edges of §3.2: the largest amax still at 1.0, the smallest with a finite scale.
  EXPECT_EQ(Nvfp4GlobalScale(0.041015625, DType::kFloat16, kCT), 1.0f);
  EXPECT_EQ(Nvfp4GlobalScale(0.041046142578125, DType::kFloat16, kCT), 65472.0f);
  // float32 and bfloat16 keep a finite scale there.
  EXPECT_NE(Nvfp4GlobalScale(below, DType::kFloat32, kCT), 1.0f);
  EXPECT_NE(Nvfp4GlobalScale(below, DType::kBFloat16, kCT), 1.0f);
}

TEST(Nvfp4Examples, E4AllZeros) {
  Nvfp4Scales s = ScalesOfAmaxes({0.0, 0.0}, DType::kFloat32, kCT);
  EXPECT_EQ(s.global_scale, 1.0f);
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x20, 0x20}));
  EXPECT_EQ(s.amax, 0.0f);
  s = ScalesOfAmaxes({0.0, 0.0}, DType::kFloat32, kMO);
  EXPECT_EQ(FloatBits(s.global_scale), 0x00000C31u);      // f32(2^-126 / 2688): the floor
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x38, 0x38}));  // 1.0
  EXPECT_EQ(s.amax, 0.0f);                                // before the floor
  // A subnormal amax gives gs = 1.0 too: the product overflows.
  EXPECT_EQ(Nvfp4GlobalScale(1e-40, DType::kFloat32, kCT), 1.0f);
}

TEST(Nvfp4Examples, E5AnE4M3TieGoesToTheEvenCode) {
  const double b = static_cast<float>(1.0625 * 6 / 2688);
  const Nvfp4Scales s = ScalesOfAmaxes({1.0, b}, DType::kFloat32, kCT);
  EXPECT_EQ(s.global_scale, 2688.0f);
  EXPECT_EQ(2688.0f * static_cast<float>(b / 6), 1.0625f);  // exactly the tie
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x7E, 0x38}));
}

// float64 inputs (outside nvfp4.md §1's three precisions): compressed-tensors'
// arithmetic runs in double and rounds to float32 once, at .to(float32).
TEST(Nvfp4Examples, Float64ComputesInDoubleAndRoundsOnce) {
  EXPECT_EQ(FloatBits(Nvfp4GlobalScale(7.0, DType::kFloat64, kCT)), 0x43C00000u);
  EXPECT_EQ(FloatBits(Nvfp4GlobalScale(7.0, DType::kFloat64, kMO)), 0x3B2AAAABu);
  const Nvfp4Scales s = ScalesOfAmaxes({7.0, 3.5}, DType::kFloat64, kCT);
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x7E, 0x76}));
}

TEST(Nvfp4Examples, TheBlockAmaxIsTheLargerMagnitude) {
  EXPECT_EQ(Nvfp4BlockAmax(-3.5, 2.0), 3.5);
  EXPECT_EQ(Nvfp4BlockAmax(-1.0, 7.0), 7.0);
  EXPECT_EQ(Nvfp4BlockAmax(0.5, 0.25), 0.25);  // lo clamps to 0
  const Nvfp4Scales s = ComputeNvfp4Scales({-7.0, -1.0}, {2.0, 3.5}, DType::kFloat32, kCT);
  EXPECT_EQ(s.amax, 7.0f);
  EXPECT_EQ(s.e4m3, (std::vector<uint8_t>{0x7E, 0x76}));
}

// ---- §3.5: the result in every calculator ----

TEST(Nvfp4Calculators, EveryKindGivesTheScalesOfItsRange) {
  const Tensor x = F32({1, 32}, [] {
    std::vector<double> v(32, 0.5);
    v[0] = 7.0;
    v[16] = -3.5;
    return v;
  }());
  for (const char* key : {"static", "moving_average", "global_minmax", "dynamic"}) {
    ASSERT_OK_AND_ASSIGN(auto calc, Create(key, Nvfp4Spec()));
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, x));
    EXPECT_EQ(q.shape, (Shape{1, 2})) << key;
    EXPECT_EQ(q.scale_e4m3, (std::vector<uint8_t>{0x7E, 0x76})) << key;
    EXPECT_TRUE(q.scale.empty()) << key;
    EXPECT_EQ(ScaleValues(q), (std::vector<float>{448.0f, 224.0f})) << key;
    EXPECT_EQ(FloatBits(q.global_scale.value_or(0)), 0x43C00001u) << key;
    EXPECT_EQ(q.amax, 7.0f) << key;
    EXPECT_FALSE(q.has_zero_point) << key;
    EXPECT_FALSE(q.has_minval) << key;
    EXPECT_EQ(q.precision, DType::kFloat32) << key;
  }
}

// The tensor's values for the fused-pass test: block kinds in turn (zeros with -0.0,
// float32 subnormals, float16 subnormals, all negative, and normal values spread over
// five binades), so that every rounding path of both conventions is taken.
std::vector<double> MixedBlocks(int64_t n, int64_t block, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / block;
    switch (b % 7) {
      case 0:
        v[i] = i % 2 ? -0.0 : 0.0;
        break;
      case 1:
        v[i] = std::ldexp(normal(rng), -130);
        break;
      case 2:
        v[i] = std::ldexp(normal(rng), -20);
        break;
      case 3:
        v[i] = -std::fabs(normal(rng)) * 3;
        break;
      default:
        v[i] = std::ldexp(normal(rng), static_cast<int>(b % 5) - 2);
    }
  }
  return v;
}

// The dynamic calculator's fused pass over a whole tensor (Nvfp4QParamsFromTensor)
// against the path it stands in for, the range pass, GetRange and QParamsFromRange:
// the same bits in every dtype, both conventions and the block shapes it takes.
TEST(Nvfp4Fused, GivesTheRangePathsBits) {
  std::mt19937 rng(11);
  struct Case {
    Shape shape;
    Shape block;
  };
  const std::vector<Case> cases = {{{7, 64}, {1, 16}}, {{2, 3, 32}, {1, 1, 32}}, {{112}, {16}},
                                   {{4, 48}, {1, 3}},  {{1, 16}, {1, 16}},       {{3, 32}, {1, 32}}};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
    for (const Case& c : cases) {
      int64_t n = 1;
      for (int64_t d : c.shape) n *= d;
      const Tensor x = MakeTensor(dtype, c.shape, MixedBlocks(n, c.block.back(), rng));
      ASSERT_OK_AND_ASSIGN(BlockRange observed, ObserveRange(x.view(), c.block));
      const WorkingRange range = GetRange(&observed, observed.min.shape, FloatRange{});
      for (const char* convention : {"compressed_tensors", "modelopt"}) {
        ASSERT_OK_AND_ASSIGN(QuantSpec spec, Nvfp4Spec(convention).Resolve());
        const QParamsRecipe recipe = QParamsRecipe::FromSpec(spec);
        const QParams expected = QParamsFromRange(recipe, range);
        const std::optional<QParams> fused =
            Nvfp4QParamsFromTensor(*recipe.nvfp4, x.view(), c.block);
        const std::string where = std::string(DTypeName(dtype)) + " " + ShapeString(c.shape) +
                                  " block " + ShapeString(c.block) + " " + convention;
        ASSERT_TRUE(fused.has_value()) << where;
        EXPECT_TRUE(*fused == expected) << where;
        EXPECT_EQ(fused->scale_e4m3, expected.scale_e4m3) << where;
      }
    }
  }
  // More blocks than 16-bit amax patterns below the tensor's (the codes by lookup),
  // with the AVX2 block max and without it.
  std::normal_distribution<double> normal(0.0, 0.4);
  std::vector<double> v(1100 * 256);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::clamp(std::ldexp(normal(rng), -static_cast<int>((i / 16) % 23)), -1.9, 1.9);
  }
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = MakeTensor(dtype, {1100, 256}, v);
    ASSERT_OK_AND_ASSIGN(BlockRange observed, ObserveRange(x.view(), {1, 16}));
    const WorkingRange range = GetRange(&observed, observed.min.shape, FloatRange{});
    for (auto level : {range_internal::KernelLevel::kAvx2, range_internal::KernelLevel::kPortable}) {
      const auto saved = range_internal::kernel_level_cap.exchange(level);
      for (const char* convention : {"compressed_tensors", "modelopt"}) {
        ASSERT_OK_AND_ASSIGN(QuantSpec spec, Nvfp4Spec(convention).Resolve());
        const QParamsRecipe recipe = QParamsRecipe::FromSpec(spec);
        const std::optional<QParams> fused = Nvfp4QParamsFromTensor(*recipe.nvfp4, x.view(), {1, 16});
        ASSERT_TRUE(fused.has_value()) << DTypeName(dtype) << " " << convention;
        EXPECT_TRUE(*fused == QParamsFromRange(recipe, range)) << DTypeName(dtype) << " " << convention;
      }
      range_internal::kernel_level_cap = saved;
    }
  }
  // The all-zero tensor (the global scale's fallbacks) and the calculator's own call.
  const Tensor zeros = MakeTensor(DType::kBFloat16, {2, 32}, std::vector<double>(64, 0.0));
  for (const char* convention : {"compressed_tensors", "modelopt"}) {
    ASSERT_OK_AND_ASSIGN(auto dynamic, Create("dynamic", Nvfp4Spec(convention)));
    ASSERT_OK_AND_ASSIGN(auto stat, Create("static", Nvfp4Spec(convention)));
    ASSERT_OK_AND_ASSIGN(QParams a, Fwd(*dynamic, zeros));
    ASSERT_OK_AND_ASSIGN(QParams b, Fwd(*stat, zeros));
    EXPECT_TRUE(a == b) << convention;
  }
}

// Every bfloat16 block amax below the tensor's, on both kernel levels (the AVX2
// level computes the codes in vector arithmetic, the portable one by the code table),
// under global scales from the non-finite fallback (amax 2^-133) to the largest amax.
TEST(Nvfp4Fused, EveryBFloat16BlockAmaxGivesTheScalarCode) {
  for (uint16_t largest : {0x0001, 0x007F, 0x0080, 0x1000, 0x3F80, 0x4321, 0x7F7F}) {
    // Block b holds bits b at element (b % 16), negated for odd b, and zeros.
    const int64_t blocks = int64_t{largest} + 1;
    std::vector<double> v(blocks * 16, 0.0);
    std::vector<double> amax(blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      amax[b] = BFloat16ToFloat(static_cast<uint16_t>(b));
      v[b * 16 + b % 16] = b % 2 == 1 ? -amax[b] : amax[b];
    }
    const Tensor x = MakeTensor(DType::kBFloat16, {blocks, 16}, v);
    for (auto level : {range_internal::KernelLevel::kAvx2, range_internal::KernelLevel::kPortable}) {
      const auto saved = range_internal::kernel_level_cap.exchange(level);
      for (Nvfp4Convention convention : {kCT, kMO}) {
        const Nvfp4Scales expected = ScalesOfAmaxes(amax, DType::kBFloat16, convention);
        const std::optional<Nvfp4Scales> fused = ComputeNvfp4ScalesOfTensor(x.view(), {1, 16}, convention);
        const std::string where = absl::StrCat("largest 0x", absl::Hex(largest), " ",
                                               Nvfp4ConventionName(convention), " level ",
                                               static_cast<int>(level));
        ASSERT_TRUE(fused.has_value()) << where;
        EXPECT_EQ(FloatBits(fused->global_scale), FloatBits(expected.global_scale)) << where;
        ASSERT_EQ(fused->e4m3, expected.e4m3) << where;
      }
      range_internal::kernel_level_cap = saved;
    }
  }
}

TEST(Nvfp4Fused, LeavesOtherBlockShapesAndNonFiniteValuesToTheRangePass) {
  const Tensor x = F32({4, 32}, std::vector<double>(128, 1.0));
  EXPECT_FALSE(Nvfp4QParamsFromTensor(kCT, x.view(), {2, 16}).has_value());
  EXPECT_FALSE(Nvfp4QParamsFromTensor(kCT, x.view(), {4, 1}).has_value());
  for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                     -std::numeric_limits<double>::infinity()}) {
    std::vector<double> v(128, 1.0);
    v[77] = bad;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
      const Tensor t = MakeTensor(dtype, {4, 32}, v);
      EXPECT_FALSE(Nvfp4QParamsFromTensor(kMO, t.view(), {1, 16}).has_value()) << DTypeName(dtype);
      ASSERT_OK_AND_ASSIGN(auto dynamic, Create("dynamic", Nvfp4Spec()));
      const absl::StatusOr<QParams> q = Fwd(*dynamic, t);
      EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << DTypeName(dtype);
    }
  }
}

TEST(Nvfp4Calculators, NothingIsSetBeforeTheFirstComputingForward) {
  ASSERT_OK_AND_ASSIGN(auto calc, Create("global_minmax", Nvfp4Spec("modelopt")));
  const QParams& q = AsStateful(calc.get())->GetQParams();
  EXPECT_EQ(q.shape, Shape{0});
  EXPECT_TRUE(q.scale.empty());
  EXPECT_TRUE(q.scale_e4m3.empty());
  EXPECT_FALSE(q.global_scale.has_value());
  EXPECT_FALSE(q.amax.has_value());
}

TEST(Nvfp4Calculators, GlobalMinMaxTakesTheAmaxOfEverythingSeen) {
  ASSERT_OK_AND_ASSIGN(auto calc, Create("global_minmax", Nvfp4Spec()));
  std::vector<double> v(32, 0.0);
  v[0] = 7.0;
  ASSERT_OK(Fwd(*calc, F32({1, 32}, v)));
  v[0] = 1.0;
  v[16] = -3.5;
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, F32({1, 32}, v)));
  EXPECT_EQ(q.amax, 7.0f);
  EXPECT_EQ(q.scale_e4m3, (std::vector<uint8_t>{0x7E, 0x76}));
}

TEST(Nvfp4Calculators, ExportModeAndFrozenRangesReturnTheCachedScales) {
  ASSERT_OK_AND_ASSIGN(auto calc, Create("moving_average", Nvfp4Spec("modelopt")));
  std::vector<double> v(32, 0.25);
  v[0] = 7.0;
  ASSERT_OK_AND_ASSIGN(const QParams first, Fwd(*calc, F32({1, 32}, v)));
  ASSERT_OK(calc->SetExportMode(true));
  v[0] = 100.0;
  ASSERT_OK_AND_ASSIGN(QParams cached, Fwd(*calc, F32({1, 32}, v)));
  EXPECT_EQ(cached, first);

  QuantSpec frozen = Nvfp4Spec();
  frozen.float_range = {-2.0, 7.0};
  ASSERT_OK_AND_ASSIGN(auto fixed, Create("static", frozen));
  ASSERT_OK_AND_ASSIGN(const QParams q, Fwd(*fixed, F32({1, 32}, v)));
  EXPECT_EQ(q.amax, 7.0f);
  EXPECT_EQ(FloatBits(*q.global_scale), 0x43C00001u);
  EXPECT_EQ(q.scale_e4m3, (std::vector<uint8_t>{0x7E, 0x7E}));
  ASSERT_OK_AND_ASSIGN(QParams again, Fwd(*fixed, F32({1, 32}, std::vector<double>(32, 1.0))));
  EXPECT_EQ(again, q);
}

TEST(Nvfp4Calculators, ARestoredStateContinuesBitIdentically) {
  for (const char* key : {"static", "moving_average", "global_minmax"}) {
    for (const char* convention : {"compressed_tensors", "modelopt"}) {
      ASSERT_OK_AND_ASSIGN(auto calc, Create(key, Nvfp4Spec(convention)));
      ASSERT_OK(Fwd(*calc, F32({2, 32}, RandN(64, 7))));
      ASSERT_OK_AND_ASSIGN(auto restored, CreateFromState(calc->ExportState()));
      EXPECT_TRUE(SameState(restored->ExportState(), calc->ExportState())) << key;
      const Tensor next = F32({2, 32}, RandN(64, 8, 3.0));
      ASSERT_OK_AND_ASSIGN(QParams a, Fwd(*calc, next));
      ASSERT_OK_AND_ASSIGN(QParams b, Fwd(*restored, next));
      EXPECT_EQ(a, b) << key << " " << convention;
    }
  }
}

TEST(Nvfp4Calculators, ARestoreRefusesScalesThatAreNotTheirCodes) {
  ASSERT_OK_AND_ASSIGN(auto calc, Create("static", Nvfp4Spec()));
  CalculatorState empty = calc->ExportState();
  empty.qparams.global_scale = 1.0f;
  EXPECT_CODE(CreateFromState(empty), kInvalid);
  ASSERT_OK(Fwd(*calc, F32({1, 16}, std::vector<double>(16, 1.0))));
  CalculatorState state = calc->ExportState();
  EXPECT_OK(CreateFromState(state));
  // A state may carry the codes' values (records from before the buffers stopped
  // keeping them): they are checked, then dropped.
  CalculatorState with_values = state;
  with_values.qparams.scale = ScaleValues(state.qparams);
  ASSERT_OK_AND_ASSIGN(auto restored, CreateFromState(with_values));
  EXPECT_TRUE(AsStateful(restored.get())->GetQParams() == AsStateful(calc.get())->GetQParams());
  CalculatorState wrong = with_values;
  wrong.qparams.scale[0] = 1.0f;
  EXPECT_CODE(CreateFromState(wrong), kInvalid);
  wrong = with_values;
  wrong.qparams.scale.push_back(448.0f);  // one value more than codes
  EXPECT_CODE(CreateFromState(wrong), kInvalid);
  wrong = state;
  wrong.qparams.scale_e4m3.clear();
  EXPECT_CODE(CreateFromState(wrong), kInvalid);
  wrong = state;
  wrong.qparams.amax.reset();
  EXPECT_CODE(CreateFromState(wrong), kInvalid);
  // And an e8m0 state carries none of the NVFP4 fields.
  QuantSpec e8m0 = Nvfp4Spec();
  e8m0.scale_dtype = "";
  ASSERT_OK_AND_ASSIGN(auto other, Create("static", e8m0));
  ASSERT_OK(Fwd(*other, F32({1, 16}, std::vector<double>(16, 1.0))));
  CalculatorState foreign = other->ExportState();
  foreign.qparams.amax = 1.0f;
  EXPECT_CODE(CreateFromState(foreign), kInvalid);
}

// ---- §5: quantize, dequantize, pack ----

TEST(Nvfp4Qdq, RoundsToNearestEvenAndPacksLowNibbleFirst) {
  // Code 0x38 (1.0) with global scale 1: y = x.
  std::vector<double> v = {0.25, 0.75,  1.25, 1.75, 2.5, 3.5, 5.0,  7.0,
                           -0.3, -0.74, -1.3, -3.0, 0.0, 6.0, -6.0, 4.9};
  const Tensor x = F32({1, 16}, v);
  for (Nvfp4Convention convention : {kCT, kMO}) {
    ASSERT_OK_AND_ASSIGN(Nvfp4QuantizedTensor q,
                         Nvfp4QuantizeDequantize(x.view(), {0x38}, 1.0f, convention));
    // Nibbles 0 2 2 4 4 6 6 7 | 9 9 b d 0 7 f 6, two a byte, element 2i low.
    EXPECT_EQ(q.packed, (std::vector<uint8_t>{0x20, 0x42, 0x64, 0x76, 0x99, 0xDB, 0x70, 0x6F}));
    EXPECT_EQ(q.dequantized,
              (std::vector<float>{0, 1, 1, 2, 2, 4, 4, 6, -0.5, -0.5, -1.5, -3, 0, 6, -6, 4}));
  }
}

TEST(Nvfp4Qdq, TheSignOfADequantizedZeroIsTheConventionsOwn) {
  std::vector<double> v(16, 0.0);
  v[0] = -0.1;  // rounds to zero: nibble 0x8
  v[1] = -0.0;  // nibble 0x0
  const Tensor x = F32({1, 16}, v);
  ASSERT_OK_AND_ASSIGN(Nvfp4QuantizedTensor ct,
                       Nvfp4QuantizeDequantize(x.view(), {0x38}, 1.0f, kCT));
  ASSERT_OK_AND_ASSIGN(Nvfp4QuantizedTensor mo,
                       Nvfp4QuantizeDequantize(x.view(), {0x38}, 1.0f, kMO));
  EXPECT_EQ(ct.packed[0], 0x08);
  EXPECT_EQ(mo.packed[0], 0x08);
  EXPECT_TRUE(std::signbit(ct.dequantized[0]));
  EXPECT_FALSE(std::signbit(mo.dequantized[0]));
  EXPECT_FALSE(std::signbit(ct.dequantized[1]));
}

TEST(Nvfp4Qdq, AModelOptBlockWithCodeZeroGivesInfOrNanNibbles) {
  std::vector<double> v(16, 0.0);
  v[0] = 1.0;   // 1 / 0 = inf: 0x7
  v[1] = -1.0;  // -inf: 0xF
  const Tensor x = F32({1, 16}, v);
  ASSERT_OK_AND_ASSIGN(Nvfp4QuantizedTensor q,
                       Nvfp4QuantizeDequantize(x.view(), {0x00}, 1.0f, kMO));
  EXPECT_EQ(q.packed[0], 0xF7);
  EXPECT_EQ(q.packed[1], 0x77);  // 0 / 0 = NaN: 0x7
  for (float d : q.dequantized) EXPECT_EQ(d, 0.0f);
}

TEST(Nvfp4Qdq, DynamicCodesClampAt448AndErrorsAreInvalidArgument) {
  std::vector<double> v(32, 1.0);
  v[16] = 100.0;  // far above the calibrated amax of 1
  const Tensor x = F32({1, 32}, v);
  for (Nvfp4Convention convention : {kCT, kMO}) {
    const float g = Nvfp4GlobalScale(1.0, DType::kFloat32, convention);
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> codes,
                         Nvfp4DynamicBlockCodes(x.view(), g, convention));
    EXPECT_EQ(codes, (std::vector<uint8_t>{0x7E, 0x7E}));
  }
  EXPECT_CODE(Nvfp4DynamicBlockCodes(F32({1, 8}, std::vector<double>(8, 1.0)).view(), 1.0f, kCT),
              kInvalid);
  std::vector<double> bad(16, 1.0);
  bad[3] = NAN;
  EXPECT_CODE(Nvfp4DynamicBlockCodes(F32({1, 16}, bad).view(), 1.0f, kCT), kInvalid);
  EXPECT_CODE(Nvfp4QuantizeDequantize(F32({1, 16}, bad).view(), {0x38}, 1.0f, kMO), kInvalid);
  EXPECT_CODE(Nvfp4QuantizeDequantize(x.view(), {0x38}, 1.0f, kMO), kInvalid);  // 2 blocks
}

}  // namespace
}  // namespace qparams::testing
