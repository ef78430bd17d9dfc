// Spec validation and defaults (semantics.md §4, vectors §9.6, conformance FORMAT).

#include "core/quant_spec.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using QS = QScheme;

QuantSpec Spec(const std::string& dtype, QScheme qscheme) { return MakeSpec(dtype, qscheme); }

TEST(QScheme, NamesRoundTripAndUnknownIsRejected) {
  for (QScheme q : {QS::kSymmetric, QS::kAsymmetric, QS::kSymmetricWithClipping}) {
    ASSERT_OK_AND_ASSIGN(QScheme parsed, ParseQScheme(QSchemeName(q)));
    EXPECT_EQ(parsed, q);
  }
  EXPECT_EQ(QSchemeName(QS::kSymmetricWithClipping), "symmetric_with_clipping");
  const absl::StatusOr<QScheme> bad = ParseQScheme("affine");
  EXPECT_CODE(bad, kInvalid);
  EXPECT_NE(bad.status().message().find("unknown quantization scheme"), std::string::npos);
}

// semantics.md §9.6 "Quant range" and the §4.3 table; SWC clips signed dtypes only (§4.2).
TEST(QuantSpec, DerivesQuantRangeFromDtypeAndScheme) {
  struct Case {
    const char* dtype;
    QScheme q;
    double qmin, qmax;
  };
  const Case cases[] = {
      {"int8", QS::kSymmetric, -128, 127},
      {"int8", QS::kSymmetricWithClipping, -127, 127},
      {"int8", QS::kAsymmetric, -128, 127},
      {"int4", QS::kSymmetric, -8, 7},
      {"int4", QS::kSymmetricWithClipping, -7, 7},
      {"int2", QS::kSymmetric, -2, 1},
      {"int2", QS::kSymmetricWithClipping, -1, 1},
      {"uint8", QS::kSymmetric, 0, 255},
      {"uint8", QS::kSymmetricWithClipping, 0, 255},
      {"uint4", QS::kAsymmetric, 0, 15},
      {"uint4", QS::kSymmetricWithClipping, 0, 15},
      {"uint2", QS::kSymmetricWithClipping, 0, 3},
      {"int3", QS::kSymmetricWithClipping, -3, 3},
      {"uint1", QS::kAsymmetric, 0, 1},
      {"float8_e4m3fn", QS::kSymmetric, -448, 448},
      {"float8_e5m2", QS::kSymmetric, -57344, 57344},
      {"float4_e2m1fn_x2", QS::kSymmetric, -6, 6},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.dtype, " ", QSchemeName(c.q)));
    ASSERT_OK_AND_ASSIGN(QuantSpec r, Spec(c.dtype, c.q).Resolve());
    EXPECT_EQ(r.quant_min, c.qmin);
    EXPECT_EQ(r.quant_max, c.qmax);
  }
}

// FORMAT: int1 with SWC leaves the empty range 0..0.
TEST(QuantSpec, Int1WithClippingIsRejected) {
  EXPECT_CODE(Spec("int1", QS::kSymmetricWithClipping).Resolve(), kInvalid);
  EXPECT_OK(Spec("int1", QS::kSymmetric).Resolve().status());
}

// semantics.md §4.6 / §9.6: FP dtypes require the symmetric scheme.
TEST(QuantSpec, FloatDtypesRequireSymmetric) {
  for (const char* dtype : {"float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2"}) {
    for (QScheme q : {QS::kAsymmetric, QS::kSymmetricWithClipping}) {
      const absl::StatusOr<QuantSpec> r = Spec(dtype, q).Resolve();
      EXPECT_CODE(r, kInvalid) << dtype;
      EXPECT_NE(r.status().message().find("requires symmetric quantization scheme"),
                std::string::npos)
          << r.status();
    }
  }
}

TEST(QuantSpec, ResolveCanonicalizesAliasesAndFillsDefaults) {
  QuantSpec s = Spec("float8_e4m3", QS::kSymmetric);
  ASSERT_OK_AND_ASSIGN(QuantSpec r, s.Resolve());
  EXPECT_EQ(r.dtype, "float8_e4m3fn");
  EXPECT_EQ(r.range_calculator, "minmax");
  EXPECT_EQ(r.scale_dtype, "");
  EXPECT_FALSE(r.e8m0_scale());

  // semantics.md §4.6 defaults: int8, SYM, per_tensor, weight, minmax.
  ASSERT_OK_AND_ASSIGN(QuantSpec d, QuantSpec().Resolve());
  EXPECT_EQ(d.dtype, "int8");
  EXPECT_EQ(d.qscheme, QS::kSymmetric);
  EXPECT_EQ(d.granularity, Granularity::PerTensor());
  EXPECT_EQ(d.target, Target::kWeight);
  EXPECT_EQ(d.quant_min, -128);
  EXPECT_EQ(d.quant_max, 127);
  EXPECT_TRUE(d.float_range.empty());
}

TEST(QuantSpec, ResolvingAResolvedSpecIsTheIdentity) {
  QuantSpec s = Spec("float4_e2m1fn", QS::kSymmetric);
  s.granularity = Granularity::PerBlock(-1, 32);
  s.float_range.min = -2;
  ASSERT_OK_AND_ASSIGN(QuantSpec once, s.Resolve());
  ASSERT_OK_AND_ASSIGN(QuantSpec twice, once.Resolve());
  EXPECT_EQ(once, twice);
  EXPECT_FALSE(once == s);  // the dtype alias and defaults changed
}

// semantics.md §4.5 / §9.6 scale_dtype, with the LATEST-TESTS int8 rule (Policy 6).
TEST(QuantSpec, ScaleDtypeRules) {
  struct Valid {
    const char* dtype;
    const char* scale_dtype;
    bool e8m0;
  };
  const Valid valid[] = {
      {"int8", "", false},
      {"int4", "", false},
      {"float8_e4m3fn", "", false},
      {"float8_e5m2", "", false},
      {"float8_e4m3fn", "float8_e8m0fnu", true},
      {"float8_e4m3fn", "float8_e8m0", true},  // alias
      {"float8_e5m2", "float8_e8m0fnu", true},
      {"float4_e2m1fn_x2", "", true},  // fp4 auto-fills e8m0
      {"float4_e2m1fn_x2", "float8_e8m0fnu", true},
      {"int8", "float8_e8m0fnu", true},  // LATEST-TESTS, Policy 6
  };
  for (const Valid& c : valid) {
    QuantSpec s = Spec(c.dtype, QS::kSymmetric);
    s.scale_dtype = c.scale_dtype;
    SCOPED_TRACE(absl::StrCat(c.dtype, " / ", c.scale_dtype));
    ASSERT_OK_AND_ASSIGN(QuantSpec r, s.Resolve());
    EXPECT_EQ(r.e8m0_scale(), c.e8m0);
    EXPECT_EQ(r.scale_dtype, c.e8m0 ? std::string(kE8M0ScaleDType) : "");
  }

  const std::pair<const char*, const char*> invalid[] = {
      {"float8_e4m3fn", "float32"},    {"int8", "float16"},        {"float8_e4m3fn", "float8_typo"},
      {"float4_e2m1fn_x2", "float32"}, {"int4", "float8_e8m0fnu"}, {"uint8", "float8_e8m0fnu"},
  };
  for (const auto& [dtype, scale_dtype] : invalid) {
    QuantSpec s = Spec(dtype, QS::kSymmetric);
    s.scale_dtype = scale_dtype;
    EXPECT_CODE(s.Resolve(), kInvalid) << dtype << " / " << scale_dtype;
  }
}

// FORMAT: int8 + e8m0 needs the symmetric scheme.
TEST(QuantSpec, Int8E8m0RequiresSymmetric) {
  for (QScheme q : {QS::kAsymmetric, QS::kSymmetricWithClipping}) {
    QuantSpec s = Spec("int8", q);
    s.scale_dtype = "float8_e8m0fnu";
    EXPECT_CODE(s.Resolve(), kInvalid) << QSchemeName(q);
  }
}

// semantics.md §9.6 float_range, plus one-sided violations (FORMAT).
TEST(QuantSpec, FloatRangeRules) {
  using R = FloatRange;
  const R valid[] = {R{},
                     R{0.0, 5.0},
                     R{-5.0, 0.0},
                     R{-5.0, 5.0},
                     R{-1.0, std::nullopt},
                     R{std::nullopt, 0.0},
                     R{0.0, std::nullopt}};
  for (const R& r : valid) {
    QuantSpec s = Spec("int8", QS::kAsymmetric);
    s.float_range = r;
    EXPECT_OK(s.Resolve().status()) << r.min.value_or(99) << ", " << r.max.value_or(99);
  }
  const R invalid[] = {R{5.0, -5.0},      R{1.0, 5.0},          R{-3.0, -1.0},
                       R{0.0, 0.0},       R{1.0, std::nullopt}, R{std::nullopt, -1.0},
                       R{-INFINITY, 1.0}, R{std::nullopt, NAN}};
  for (const R& r : invalid) {
    QuantSpec s = Spec("int8", QS::kAsymmetric);
    s.float_range = r;
    EXPECT_CODE(s.Resolve(), kInvalid) << r.min.value_or(99) << ", " << r.max.value_or(99);
  }
  EXPECT_TRUE((R{-1.0, 1.0}).frozen());
  EXPECT_FALSE((R{-1.0, std::nullopt}).frozen());
  EXPECT_TRUE(R{}.empty());
}

// FORMAT: explicit quant_min/quant_max are both or neither, integers within the
// dtype's symmetric range, min < max, and used exactly as given whatever the scheme.
TEST(QuantSpec, ExplicitQuantRange) {
  QuantSpec s = Spec("int8", QS::kSymmetricWithClipping);
  s.quant_min = -128;
  s.quant_max = 127;
  ASSERT_OK_AND_ASSIGN(QuantSpec r, s.Resolve());
  EXPECT_EQ(r.quant_min, -128);  // no clipping of a given range
  EXPECT_EQ(r.quant_max, 127);

  s.quant_min = -100;
  s.quant_max = 50;
  EXPECT_OK(s.Resolve().status());

  auto rejects = [](const char* dtype, std::optional<double> lo, std::optional<double> hi) {
    QuantSpec bad = Spec(dtype, QS::kAsymmetric);
    bad.quant_min = lo;
    bad.quant_max = hi;
    return bad.Resolve().status().code() == kInvalid;
  };
  EXPECT_TRUE(rejects("int8", -128, std::nullopt));
  EXPECT_TRUE(rejects("int8", std::nullopt, 127));
  EXPECT_TRUE(rejects("int8", -129, 127));
  EXPECT_TRUE(rejects("int8", -128, 128));
  EXPECT_TRUE(rejects("int8", 5, 5));
  EXPECT_TRUE(rejects("int8", 6, 5));
  EXPECT_TRUE(rejects("int8", -1.5, 5));
  EXPECT_TRUE(rejects("uint4", -1, 15));
  EXPECT_TRUE(rejects("uint4", 0, 16));
  EXPECT_FALSE(rejects("uint4", 3, 12));
}

TEST(QuantSpec, UnbuildableGranularityAndUnknownDtypeOrRangeCalculator) {
  QuantSpec s = QuantSpec();
  s.granularity = Granularity::PerBlock(0, 0);
  EXPECT_CODE(s.Resolve(), kInvalid);

  // Shape-dependent problems are not construction errors (FORMAT).
  s.granularity = Granularity::PerChannel(7);
  EXPECT_OK(s.Resolve().status());

  QuantSpec d = QuantSpec();
  d.dtype = "float16";
  EXPECT_CODE(d.Resolve(), kInvalid);

  QuantSpec rc = QuantSpec();
  rc.range_calculator = "percentile";  // semantics.md §2.2: only minmax exists
  EXPECT_CODE(rc.Resolve(), kInvalid);
  rc.range_calculator = "minmax";
  EXPECT_OK(rc.Resolve().status());
}

}  // namespace
}  // namespace qparams::testing
